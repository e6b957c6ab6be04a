package httpfilter

import (
	"context"
	"fmt"
	"strings"

	"github.com/wasmesh/wasmesh/wasm/host"
)

// guest is a scripted stand-in for host.HTTPStream: each callback returns the next result
// scripted for its phase (Continue when none is left) and is written to the transcript.
// Like the host, it keeps the body of a direction whose body callback stopped and shows the
// guest everything kept so far with the next chunk.
type guest struct {
	script   map[Phase][]host.Result
	log      *[]string
	kept     [2][]byte
	finished bool
}

var phaseNames = [...]string{"request_headers", "request_body", "request_trailers",
	"response_headers", "response_body", "response_trailers"}

func (g *guest) next(p Phase, what string) host.Result {
	var res host.Result
	if q := g.script[p]; len(q) > 0 {
		res, g.script[p] = q[0], q[1:]
	}
	if res.Failure == nil && res.Status != host.StatusContinue {
		res.Action = host.Pause
	}
	*g.log = append(*g.log, fmt.Sprintf("guest %s%s -> %s", phaseNames[p], what, resultText(res)))
	return res
}

func resultText(res host.Result) string {
	var parts []string
	switch {
	case res.Failure != nil:
		parts = append(parts, "failed")
	case res.Status == host.StatusContinue:
		parts = append(parts, "continue")
	default:
		parts = append(parts, fmt.Sprintf("stop(%d)", res.Status))
	}
	if res.Skipped {
		parts = append(parts, "skipped")
	}
	if res.LocalResponse != nil {
		parts = append(parts, fmt.Sprintf("reply %d", res.LocalResponse.StatusCode))
	}
	for _, s := range res.Signals {
		parts = append(parts, fmt.Sprintf("%s %s", s.Kind, s.Stream))
	}
	return strings.Join(parts, ", ")
}

func eosText(eos bool) string {
	if eos {
		return " eos"
	}
	return ""
}

func (g *guest) headers(p Phase, eos bool) host.Result { return g.next(p, eosText(eos)) }

func (g *guest) body(p Phase, chunk []byte, eos bool) host.Result {
	d := p.Dir()
	buf := append(g.kept[d], chunk...)
	res := g.next(p, fmt.Sprintf(" %q%s", buf, eosText(eos)))
	if res.Action == host.Continue {
		res.Body, g.kept[d] = buf, nil
	} else {
		g.kept[d] = buf
	}
	return res
}

func (g *guest) OnRequestHeaders(_ context.Context, _ *host.Headers, eos bool) host.Result {
	return g.headers(RequestHeaders, eos)
}

func (g *guest) OnRequestBody(_ context.Context, chunk []byte, eos bool) host.Result {
	return g.body(RequestBody, chunk, eos)
}

func (g *guest) OnRequestTrailers(context.Context, *host.Headers) host.Result {
	return g.next(RequestTrailers, "")
}

func (g *guest) OnResponseHeaders(_ context.Context, _ *host.Headers, eos bool) host.Result {
	return g.headers(ResponseHeaders, eos)
}

func (g *guest) OnResponseBody(_ context.Context, chunk []byte, eos bool) host.Result {
	return g.body(ResponseBody, chunk, eos)
}

func (g *guest) OnResponseTrailers(context.Context, *host.Headers) host.Result {
	return g.next(ResponseTrailers, "")
}

func (g *guest) TakeBufferedBody(t host.StreamType) []byte {
	b := g.kept[t]
	g.kept[t] = nil
	return b
}

func (g *guest) Finish(context.Context) {
	g.finished = true
	*g.log = append(*g.log, "guest finish")
}

// Results a script uses.
var (
	stopHdr  = host.Result{Status: host.HeadersStopIteration}
	stopAll  = host.Result{Status: host.HeadersStopAllIterationAndBuffer}
	stopAllW = host.Result{Status: host.HeadersStopAllIterationAndWatermark}
	buffer   = host.Result{Status: host.DataStopIterationAndBuffer}
	mark     = host.Result{Status: host.DataStopIterationAndWatermark}
	stopTrl  = host.Result{Status: host.TrailersStopIteration}
	failed   = &host.Failure{Kind: host.FailureTrap}
	failOpen = host.Result{Failure: failed}
	skipped  = host.Result{Skipped: true}
)

func reply(status int) *host.LocalResponse {
	return &host.LocalResponse{StatusCode: status, Details: fmt.Sprintf("reply_%d", status), GRPCStatus: -1}
}

// replying is a callback that sent a local reply (Envoy then stops, whatever it returned).
func replying(status int, st host.FilterStatus) host.Result {
	return host.Result{Status: st, LocalResponse: reply(status)}
}

func failClosed(st host.FilterStatus) host.Result {
	return host.Result{Action: host.Pause, Status: st, Failure: failed, LocalResponse: reply(503)}
}

func with(res host.Result, sigs ...host.Signal) host.Result {
	res.Signals = sigs
	return res
}

const (
	req  = host.StreamRequest
	resp = host.StreamResponse
)

func continueSig(t host.StreamType) host.Signal {
	return host.Signal{Kind: host.SignalContinue, Stream: t}
}

func closeSig(t host.StreamType) host.Signal { return host.Signal{Kind: host.SignalClose, Stream: t} }

// event is one thing the proxy does to the filter, written to the transcript with what
// came of it.
type event struct {
	text string
	dir  host.StreamType
	do   func(ctx context.Context, f *Filter) Verdict
}

func headers(dir host.StreamType, eos bool) event {
	return event{fmt.Sprintf("headers %s%s", dir, eosText(eos)), dir, func(ctx context.Context, f *Filter) Verdict {
		return f.Headers(ctx, dir, host.NewHeaders(), eos)
	}}
}

func data(dir host.StreamType, chunk string, eos bool) event {
	return event{fmt.Sprintf("data %s %q%s", dir, chunk, eosText(eos)), dir, func(ctx context.Context, f *Filter) Verdict {
		return f.Data(ctx, dir, []byte(chunk), eos)
	}}
}

func trailers(dir host.StreamType) event {
	return event{fmt.Sprintf("trailers %s", dir), dir, func(ctx context.Context, f *Filter) Verdict {
		return f.Trailers(ctx, dir, host.NewHeaders([2]string{"t", "1"}))
	}}
}

func signal(dir host.StreamType, sig host.Signal) event {
	text := fmt.Sprintf("signal %s %s", sig.Kind, sig.Stream)
	if sig.LocalResponse != nil {
		text += fmt.Sprintf(" %d", sig.LocalResponse.StatusCode)
	}
	return event{text, dir, func(ctx context.Context, f *Filter) Verdict { return f.Signal(ctx, sig) }}
}

func abort(dir host.StreamType) event {
	return event{"abort", dir, func(_ context.Context, f *Filter) Verdict { f.Abort(); return Verdict{} }}
}

func finish(dir host.StreamType) event {
	return event{"finish", dir, func(ctx context.Context, f *Filter) Verdict { f.Finish(ctx); return Verdict{} }}
}

// describe writes what an event came to: the verdict, what each direction let go on, and
// how the event's direction stands.
func describe(f *Filter, dir host.StreamType, v Verdict) string {
	var parts []string
	switch v.Kind {
	case LocalReply:
		parts = append(parts, fmt.Sprintf("local reply %d", v.Reply.StatusCode))
	case DirectReply:
		parts = append(parts, fmt.Sprintf("direct reply %d", v.Reply.StatusCode))
	case Reset:
		parts = append(parts, "reset "+v.Details)
	}
	for _, d := range []host.StreamType{req, resp} {
		if o := f.Take(d); o.Headers || o.Data != nil || o.Trailers || o.End {
			parts = append(parts, d.String()+" "+outText(o))
		}
	}
	switch {
	case f.Over():
		parts = append(parts, "over")
	case f.Held(dir) && !f.Accepting(dir) && !f.side(dir).ended:
		parts = append(parts, "held, full")
	case f.Held(dir):
		parts = append(parts, "held")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

func outText(o Out) string {
	var parts []string
	if o.Headers {
		parts = append(parts, "headers")
	}
	if o.Data != nil {
		parts = append(parts, fmt.Sprintf("%q", o.Data))
	}
	if o.Trailers {
		parts = append(parts, "trailers")
	}
	if o.End {
		parts = append(parts, "end")
	}
	return strings.Join(parts, " ")
}
