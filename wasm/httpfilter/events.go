package httpfilter

import (
	"context"

	"github.com/wasmesh/wasmesh/wasm/host"
)

// kind is the part of a direction a callback is about.
type kind uint8

const (
	kindHeaders kind = iota
	kindData
	kindTrailers
)

// Headers delivers direction dir's headers to the guest (proxy_on_request_headers or
// proxy_on_response_headers), which changes h in place. The filter lets them go on when the
// guest continues; when it stops, StopIteration holds the headers alone (the body still
// reaches the guest, and its first body callback that continues lets the headers go on with
// it) while the StopAllIteration statuses hold the body and trailers for the guest until it
// resumes the direction.
func (f *Filter) Headers(ctx context.Context, dir host.StreamType, h *host.Headers, endOfStream bool) Verdict {
	sd := f.side(dir)
	if !f.open(sd) || sd.started {
		return Verdict{}
	}
	sd.started, sd.ended = true, endOfStream
	res := f.call(ctx, sd, kindHeaders, h, nil, endOfStream)
	sd.headersHeld = true
	if v, stopped := f.outcome(ctx, sd, res); !stopped {
		return v
	}
	switch res.Status {
	case host.HeadersStopIteration:
	case host.HeadersStopAllIterationAndBuffer:
		sd.stopAll = true
	default:
		sd.stopAll, sd.watermark = true, true
	}
	return f.continued(ctx, sd, res)
}

// Data delivers a chunk of direction dir's body. While the headers are held by a
// StopAllIteration status the proxy keeps it for the guest (up to the buffer limit unless
// flow-controlled); otherwise the guest gets it (proxy_on_request_body or
// proxy_on_response_body, seeing everything it held so far) and either lets it go on with
// what it held, or holds it too. Holding more than the buffer limit answers the stream (413
// for a request, 500 or a reset for a response), as Envoy does.
func (f *Filter) Data(ctx context.Context, dir host.StreamType, chunk []byte, endOfStream bool) Verdict {
	sd := f.side(dir)
	if !f.open(sd) || !sd.started || sd.ended {
		return Verdict{}
	}
	sd.ended = endOfStream
	if sd.stopAll {
		if lim := f.cfg.BufferLimit; lim > 0 && !sd.watermark && len(sd.pending)+len(chunk) > lim {
			return f.tooLarge(sd)
		}
		sd.pending = append(sd.pending, chunk...)
		sd.pendingData = true
		return Verdict{}
	}
	return f.deliverData(ctx, sd, chunk, endOfStream)
}

// Trailers delivers direction dir's trailers, which end it (proxy_on_request_trailers or
// proxy_on_response_trailers, changing t in place). When the guest continues, what it held
// of the direction goes on with them.
func (f *Filter) Trailers(ctx context.Context, dir host.StreamType, t *host.Headers) Verdict {
	sd := f.side(dir)
	if !f.open(sd) || !sd.started || sd.ended {
		return Verdict{}
	}
	sd.ended = true
	if sd.stopAll {
		sd.pendingTrailers = t
		return Verdict{}
	}
	return f.deliverTrailers(ctx, sd, t)
}

// Signal applies what the guest did to the stream outside the stream's own callbacks (a
// host.Signal): proxy_continue_stream resumes the direction it names, proxy_close_stream
// resets the stream, a local reply answers it, and a failed instance fails the stream
// closed (its 503) or open (everything the filter held goes on, and the filter is out of
// the stream).
func (f *Filter) Signal(ctx context.Context, sig host.Signal) Verdict {
	if sig.Kind == host.SignalFailed && sig.Failure != nil && f.cfg.Observer != nil {
		f.cfg.Observer.Failure(sig.Failure)
	}
	if f.over {
		return Verdict{}
	}
	switch sig.Kind {
	case host.SignalContinue:
		if isHTTP(sig.Stream) {
			return f.resume(ctx, f.side(sig.Stream))
		}
	case host.SignalClose:
		if isHTTP(sig.Stream) {
			return f.reset(CloseStreamDetails)
		}
	case host.SignalLocalResponse:
		return f.reply(sig.LocalResponse)
	case host.SignalFailed:
		if sig.LocalResponse != nil {
			return f.reply(sig.LocalResponse)
		}
		f.failOpen(ctx, nil)
	}
	return Verdict{}
}

func isHTTP(t host.StreamType) bool { return t == host.StreamRequest || t == host.StreamResponse }

// call runs one callback, or stands in for it once the guest is out of the stream.
func (f *Filter) call(ctx context.Context, sd *side, k kind, m *host.Headers, chunk []byte, eos bool) host.Result {
	var res host.Result
	switch {
	case f.gone:
		res = host.Result{Action: host.Continue, Skipped: true, Body: chunk}
	case sd.dir == host.StreamRequest && k == kindHeaders:
		res = f.s.OnRequestHeaders(ctx, m, eos)
	case sd.dir == host.StreamRequest && k == kindData:
		res = f.s.OnRequestBody(ctx, chunk, eos)
	case sd.dir == host.StreamRequest:
		res = f.s.OnRequestTrailers(ctx, m)
	case k == kindHeaders:
		res = f.s.OnResponseHeaders(ctx, m, eos)
	case k == kindData:
		res = f.s.OnResponseBody(ctx, chunk, eos)
	default:
		res = f.s.OnResponseTrailers(ctx, m)
	}
	if f.cfg.Observer != nil {
		f.cfg.Observer.Callback(Callback{Phase: Phase(uint8(sd.dir)*3 + uint8(k)), Result: res})
	}
	return res
}

// settle applies what a callback did besides its status: a failure (fail closed: its local
// reply; fail open: the guest is out of the stream), a local reply, a reset. It reports
// whether the callback stopped its direction.
func (f *Filter) settle(ctx context.Context, sd *side, res host.Result) (Verdict, bool) {
	if res.Failure != nil && f.cfg.Observer != nil {
		f.cfg.Observer.Failure(res.Failure)
	}
	switch {
	case res.LocalResponse != nil:
		return f.reply(res.LocalResponse), true
	case res.Skipped || res.Failure != nil:
		if !f.gone {
			f.failOpen(ctx, sd)
		}
		return Verdict{}, false
	case hasSignal(res.Signals, host.SignalClose, host.StreamRequest) || hasSignal(res.Signals, host.SignalClose, host.StreamResponse):
		return f.reset(CloseStreamDetails), true
	}
	return Verdict{}, res.Status != host.StatusContinue
}

// outcome settles a header or trailer callback, whose direction the caller marked held:
// how it decided the stream, or a Continue that lets go of everything held. It reports
// whether the callback stopped the direction (and decided nothing).
func (f *Filter) outcome(ctx context.Context, sd *side, res host.Result) (Verdict, bool) {
	v, stop := f.settle(ctx, sd, res)
	if v.Kind == Proceed && !stop {
		f.flush(sd)
	}
	return v, v.Kind == Proceed && stop
}

func hasSignal(sigs []host.Signal, k host.SignalKind, t host.StreamType) bool {
	for _, s := range sigs {
		if s.Kind == k && s.Stream == t {
			return true
		}
	}
	return false
}

// continued resumes a direction whose guest stopped it but asked, during the same callback,
// for it to continue (Envoy runs the continue once the callback returned).
func (f *Filter) continued(ctx context.Context, sd *side, res host.Result) Verdict {
	if hasSignal(res.Signals, host.SignalContinue, sd.dir) {
		return f.resume(ctx, sd)
	}
	return Verdict{}
}

func (f *Filter) deliverData(ctx context.Context, sd *side, chunk []byte, eos bool) Verdict {
	// Envoy adds a chunk to what a filter holds before the filter sees it: past the limit,
	// the guest never does.
	if lim := f.cfg.BufferLimit; lim > 0 && sd.dataHeld && !sd.watermark && sd.buffered+len(chunk) > lim {
		return f.tooLarge(sd)
	}
	res := f.call(ctx, sd, kindData, nil, chunk, eos)
	v, stop := f.settle(ctx, sd, res)
	if v.Kind != Proceed {
		return v
	}
	if !stop {
		// The guest got everything it held with this chunk, and Body is all of it.
		sd.dataHeld = false
		f.flush(sd)
		sd.out.Data = appendData(sd.out.Data, res.Body)
		return v
	}
	sd.dataHeld = true
	sd.watermark = res.Status != host.DataStopIterationAndBuffer
	sd.buffered += len(chunk)
	if lim := f.cfg.BufferLimit; lim > 0 && !sd.watermark && sd.buffered > lim {
		return f.tooLarge(sd)
	}
	return f.continued(ctx, sd, res)
}

func (f *Filter) deliverTrailers(ctx context.Context, sd *side, t *host.Headers) Verdict {
	res := f.call(ctx, sd, kindTrailers, t, nil, true)
	sd.trailersHeld = true
	if v, stopped := f.outcome(ctx, sd, res); !stopped {
		return v
	}
	return f.continued(ctx, sd, res)
}

// appendData adds b to out without letting a later append write into b's array.
func appendData(out, b []byte) []byte {
	if len(out) == 0 {
		return b[:len(b):len(b)]
	}
	return append(out, b...)
}

// flush lets go of everything the filter holds of a direction: its headers, the body the
// guest held (taken from the host) and its trailers.
func (f *Filter) flush(sd *side) {
	if !sd.headersOut {
		sd.headersOut, sd.out.Headers = true, true
	}
	sd.headersHeld = false
	if sd.dataHeld {
		sd.dataHeld = false
		sd.out.Data = appendData(sd.out.Data, f.s.TakeBufferedBody(sd.dir))
	}
	sd.buffered, sd.watermark = 0, false
	if sd.trailersHeld {
		sd.trailersHeld, sd.out.Trailers = false, true
	}
	if sd.ended && !sd.holds() && !sd.pendingData && sd.pendingTrailers == nil && !sd.endOut {
		sd.endOut, sd.out.End = true, true
	}
}

// resume continues a direction the guest held (proxy_continue_stream, or it failed open):
// the headers go on; after a StopAllIteration stop, the body and trailers the proxy kept
// reach the guest now (which may stop again); what the guest held of the body goes on, and
// so do the trailers.
func (f *Filter) resume(ctx context.Context, sd *side) Verdict {
	if !f.open(sd) || !sd.holds() {
		return Verdict{}
	}
	if !sd.stopAll {
		f.flush(sd)
		return Verdict{}
	}
	sd.stopAll = false
	f.flush(sd)
	if sd.pendingData {
		data := sd.pending
		sd.pending, sd.pendingData = nil, false
		v := f.deliverData(ctx, sd, data, sd.ended && sd.pendingTrailers == nil)
		if v.Kind != Proceed || sd.holds() {
			return v
		}
	}
	if t := sd.pendingTrailers; t != nil {
		sd.pendingTrailers = nil
		return f.deliverTrailers(ctx, sd, t)
	}
	return Verdict{}
}

// failOpen takes the guest out of the stream: everything it held of the directions other
// than cur goes on (cur's callback continues by itself).
func (f *Filter) failOpen(ctx context.Context, cur *side) {
	f.gone = true
	for i := range f.sides {
		if sd := &f.sides[i]; sd != cur {
			f.resume(ctx, sd)
		}
	}
}

// reply answers the stream with lr as Envoy's sendLocalReply does: through the response
// path while no response exists, instead of the response while its headers have not gone
// downstream, and otherwise by resetting the stream. The first reply wins until it reaches
// the response path.
func (f *Filter) reply(lr *host.LocalResponse) Verdict {
	if f.over {
		return Verdict{}
	}
	req, rsp := &f.sides[host.StreamRequest], &f.sides[host.StreamResponse]
	switch {
	case !rsp.started && f.replying:
		return Verdict{}
	case !rsp.started:
		f.replying = true
		*req = side{dir: req.dir, started: req.started, ended: req.ended, closed: true, headersOut: req.headersOut}
		return Verdict{Kind: LocalReply, Reply: lr}
	case !rsp.headersOut:
		f.end()
		return Verdict{Kind: DirectReply, Reply: lr}
	}
	f.end()
	return Verdict{Kind: Reset, Reply: lr, Details: lr.Details}
}

func (f *Filter) reset(details string) Verdict {
	if f.over {
		return Verdict{}
	}
	f.end()
	return Verdict{Kind: Reset, Details: details}
}

// tooLarge answers a direction whose held body outgrew the buffer limit, as Envoy does: 413
// for a request, 500 for a response (a reset once its headers went downstream).
func (f *Filter) tooLarge(sd *side) Verdict {
	if sd.dir == host.StreamRequest {
		return f.reply(&host.LocalResponse{StatusCode: 413, Body: []byte("Payload Too Large"),
			Details: RequestPayloadTooLargeDetails, GRPCStatus: -1})
	}
	return f.reply(&host.LocalResponse{StatusCode: 500, Body: []byte("Internal Server Error"),
		Details: ResponsePayloadTooLargeDetails, GRPCStatus: -1})
}
