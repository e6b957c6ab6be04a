// Package httpfilter is Envoy's HTTP filter stream semantics for one proxy-wasm stream: what
// a callback's Continue or stop means for the headers, body and trailers of each direction,
// the body the proxy keeps while the filter holds it (and its buffer limit), how the filter
// resumes a stream it stopped, and how a local reply, proxy_close_stream or a failed guest
// ends the stream. The offline harness and meshproxy's Wasm HTTP filter both drive it, each
// adapting its own I/O: it does none, never blocks and never waits.
//
// The proxy feeds a Filter the stream's events (Headers, Data, Trailers per direction, and
// the guest's Signals) and takes, per direction, what the filter let go on (Take). An event
// whose outcome ends the stream returns a Verdict. While a direction is Held the proxy waits
// for the guest's signals, feeding more of the direction's input only while Accepting.
package httpfilter

import (
	"context"

	"github.com/wasmesh/wasmesh/wasm/host"
)

// Stream is the proxy-wasm stream a Filter drives; *host.HTTPStream implements it.
type Stream interface {
	OnRequestHeaders(ctx context.Context, h *host.Headers, endOfStream bool) host.Result
	OnRequestBody(ctx context.Context, chunk []byte, endOfStream bool) host.Result
	OnRequestTrailers(ctx context.Context, t *host.Headers) host.Result
	OnResponseHeaders(ctx context.Context, h *host.Headers, endOfStream bool) host.Result
	OnResponseBody(ctx context.Context, chunk []byte, endOfStream bool) host.Result
	OnResponseTrailers(ctx context.Context, t *host.Headers) host.Result
	TakeBufferedBody(t host.StreamType) []byte
	Finish(ctx context.Context)
}

// Phase names a stream callback.
type Phase uint8

// Phases, in the order a stream goes through them.
const (
	RequestHeaders Phase = iota
	RequestBody
	RequestTrailers
	ResponseHeaders
	ResponseBody
	ResponseTrailers
)

// Dir is the direction of the phase.
func (p Phase) Dir() host.StreamType {
	if p >= ResponseHeaders {
		return host.StreamResponse
	}
	return host.StreamRequest
}

// Callback is one callback the filter ran (or skipped, once the guest failed open).
type Callback struct {
	Phase  Phase
	Result host.Result
}

// Config configures a Filter.
type Config struct {
	// BufferLimit is how much body the filter may hold per direction (Envoy's
	// per_connection_buffer_limit_bytes); 0 means no limit.
	BufferLimit int
	// Observer, if set, sees what the filter does.
	Observer Observer
}

// Observer sees what a Filter does.
type Observer interface {
	// Callback sees every callback's result, in order, including the ones stood in for once
	// the guest failed open (Skipped).
	Callback(Callback)
	// Failure is told of every failure of the guest that reaches the stream, from a
	// callback or a signal.
	Failure(*host.Failure)
}

// Out is what the filter let go on in one direction since the last Take.
type Out struct {
	// Headers: the direction's headers go on (the map last passed to Headers, as the guest
	// left it).
	Headers bool
	// Data is body to forward, after the headers.
	Data []byte
	// Trailers: the trailers go on (the map passed to Trailers, or the ones the guest added
	// at the end of the body: host.HTTPStream.RequestTrailers).
	Trailers bool
	// End: the direction is complete.
	End bool
}

// VerdictKind is how the stream ends, when an event decides it.
type VerdictKind uint8

// Verdict kinds.
const (
	// Proceed: nothing decided; the stream goes on.
	Proceed VerdictKind = iota
	// LocalReply answers the stream before any response exists: the proxy builds its local
	// reply from Reply and encodes it through the response path, this filter's response
	// callbacks included, as Envoy's sendLocalReply does. The request goes no further.
	LocalReply
	// DirectReply sends Reply instead of a response whose headers have not gone downstream
	// yet; the filter sees nothing more of the stream (Envoy's sendDirectLocalReply).
	DirectReply
	// Reset resets the stream: proxy_close_stream, or a reply that came after the response
	// headers went downstream. Details says why.
	Reset
)

// Verdict is how an event ended the stream.
type Verdict struct {
	Kind VerdictKind
	// Reply is the local reply (for a Reset, the one that came too late).
	Reply *host.LocalResponse
	// Details is the response code details of a Reset.
	Details string
}

// Response code details of the replies and resets the filter itself decides, as in Envoy.
const (
	CloseStreamDetails             = "wasm_close_stream"
	RequestPayloadTooLargeDetails  = "request_payload_too_large"
	ResponsePayloadTooLargeDetails = "response_payload_too_large"
)

// Filter is Envoy's HTTP filter state machine around one proxy-wasm stream. It is not safe
// for concurrent use: a proxy whose directions run on different goroutines serializes its
// calls.
type Filter struct {
	s     Stream
	cfg   Config
	sides [2]side
	// gone: the guest failed open and is out of the stream; everything passes.
	gone bool
	// over: the stream was reset, replied to directly, aborted or finished.
	over bool
	// replying: the filter's LocalReply is on its way through the response path.
	replying bool
}

// side is one direction: what the proxy delivered, what the filter holds, what it let go.
type side struct {
	dir     host.StreamType
	started bool // the headers came
	ended   bool // the proxy's input is complete
	closed  bool // no more of the direction goes to the filter
	// The filter holds the headers (headersHeld), with StopAllIteration* everything after
	// them too (stopAll: the proxy keeps the body in pending and the trailers), the body
	// (dataHeld, buffered bytes of it) or the trailers.
	headersHeld, stopAll, dataHeld, trailersHeld bool
	// watermark: the stop limits what is held by flow control rather than with an error.
	watermark       bool
	buffered        int
	pending         []byte
	pendingData     bool
	pendingTrailers *host.Headers
	headersOut      bool // the headers went on
	endOut          bool // End was given
	out             Out
}

func (sd *side) holds() bool { return sd.headersHeld || sd.dataHeld || sd.trailersHeld }

// New returns the filter of stream s, to keep where it is used (its methods change it),
// such as a field of the proxy's own per-stream state.
func New(s Stream, cfg Config) Filter {
	f := Filter{s: s, cfg: cfg}
	f.sides[host.StreamRequest].dir = host.StreamRequest
	f.sides[host.StreamResponse].dir = host.StreamResponse
	return f
}

func (f *Filter) side(dir host.StreamType) *side { return &f.sides[dir&1] }

// Take returns and forgets what the filter let go on in direction dir.
func (f *Filter) Take(dir host.StreamType) Out {
	sd := f.side(dir)
	o := sd.out
	sd.out = Out{}
	return o
}

// Held reports that the filter holds some of direction dir: the proxy must wait for the
// guest (its signals) before the direction can complete.
func (f *Filter) Held(dir host.StreamType) bool { return !f.over && f.side(dir).holds() }

// Accepting reports that the filter takes more of direction dir's input now: false once the
// direction ended or was answered, and while a flow-controlled stop holds more than the
// buffer limit.
func (f *Filter) Accepting(dir host.StreamType) bool {
	sd := f.side(dir)
	if f.over || sd.closed || sd.ended {
		return false
	}
	if lim := f.cfg.BufferLimit; lim > 0 && sd.watermark {
		return !(sd.stopAll && len(sd.pending) > lim) && !(sd.dataHeld && sd.buffered > lim)
	}
	return true
}

// Over reports that nothing more of the stream goes through the filter: it was reset,
// replied to directly, aborted or finished.
func (f *Filter) Over() bool { return f.over }

// Closed reports that the filter takes no more of direction dir because the stream was
// answered (a LocalReply closes the request), reset, aborted or finished.
func (f *Filter) Closed(dir host.StreamType) bool { return f.over || f.side(dir).closed }

// Replying reports that the filter's LocalReply is what the response path carries.
func (f *Filter) Replying() bool { return f.replying }

// Abort ends the stream from outside (the downstream went away, the proxy gave up waiting):
// the filter sees nothing more of it but Finish.
func (f *Filter) Abort() { f.end() }

// Finish ends the stream and runs the guest's end-of-stream callbacks (proxy_on_log, then
// proxy_on_done and proxy_on_delete).
func (f *Filter) Finish(ctx context.Context) {
	f.end()
	f.s.Finish(ctx)
}

func (f *Filter) end() {
	f.over = true
	for i := range f.sides {
		sd := &f.sides[i]
		sd.closed = true
		sd.pending, sd.pendingTrailers = nil, nil
	}
}

// open reports that direction sd takes events.
func (f *Filter) open(sd *side) bool { return !f.over && !sd.closed }
