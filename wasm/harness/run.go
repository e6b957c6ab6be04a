package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/httpfilter"
)

// Request is one HTTP exchange to drive through the plugin.
type Request struct {
	// Method, Path, Authority and Scheme fill the pseudo headers unless Headers already
	// has them; the defaults are GET, /, example.com and http.
	Method, Path, Authority, Scheme string
	Headers                         [][2]string
	// Body is delivered chunk by chunk.
	Body     [][]byte
	Trailers [][2]string
	// Info carries the stream attributes (addresses, connection, protocol, ...). A zero
	// StartTime is set to the harness clock.
	Info host.StreamInfo
	// Worker pins the request to an instance when PinWorker is set.
	Worker    int
	PinWorker bool
	// Response is the upstream's answer (status 200 when zero). Upstream, if set, computes
	// it from what the upstream received instead.
	Response Response
	Upstream func(UpstreamRequest) Response
	// MaxWait bounds the virtual time Do may skip while the stream is paused waiting for
	// the guest (ticks and HTTP call answers fire meanwhile); 0 means DefaultMaxWait and a
	// negative value disables skipping, so a paused stream is reported as stalled at once.
	MaxWait time.Duration
}

// Response is an HTTP response from the upstream.
type Response struct {
	Status   int
	Headers  [][2]string
	Body     [][]byte
	Trailers [][2]string
}

// UpstreamRequest is the request as it reached the upstream, after the filter.
type UpstreamRequest struct {
	Headers  [][2]string `json:"headers"`
	Body     []byte      `json:"body"`
	Trailers [][2]string `json:"trailers,omitempty"`
}

// MarshalJSON writes the body as text.
func (u UpstreamRequest) MarshalJSON() ([]byte, error) {
	type plain UpstreamRequest
	return json.Marshal(struct {
		plain
		Body string `json:"body"`
	}{plain(u), string(u.Body)})
}

// Header returns the first value of name.
func (u UpstreamRequest) Header(name string) string { v, _ := headerValue(u.Headers, name); return v }

// Lookup returns the first value of name and whether the header is present.
func (u UpstreamRequest) Lookup(name string) (string, bool) { return headerValue(u.Headers, name) }

// ClientResponse is the response as it reached the client, after the filter.
type ClientResponse struct {
	Status   int         `json:"status"`
	Headers  [][2]string `json:"headers"`
	Body     []byte      `json:"body"`
	Trailers [][2]string `json:"trailers,omitempty"`
}

// MarshalJSON writes the body as text.
func (c ClientResponse) MarshalJSON() ([]byte, error) {
	type plain ClientResponse
	return json.Marshal(struct {
		plain
		Body string `json:"body"`
	}{plain(c), string(c.Body)})
}

// Header returns the first value of name.
func (c ClientResponse) Header(name string) string { v, _ := headerValue(c.Headers, name); return v }

// Lookup returns the first value of name and whether the header is present.
func (c ClientResponse) Lookup(name string) (string, bool) { return headerValue(c.Headers, name) }

// Phase names a stream callback.
type Phase string

// Phases, in the order a stream goes through them.
const (
	PhaseRequestHeaders   Phase = "request_headers"
	PhaseRequestBody      Phase = "request_body"
	PhaseRequestTrailers  Phase = "request_trailers"
	PhaseResponseHeaders  Phase = "response_headers"
	PhaseResponseBody     Phase = "response_body"
	PhaseResponseTrailers Phase = "response_trailers"
	PhaseLog              Phase = "log"
)

// PhaseReport is what the filter did in one callback.
type PhaseReport struct {
	Phase  Phase       `json:"phase"`
	Action host.Action `json:"action"`
	// Resumed reports that a Pause was later lifted by the guest (or by a fail-open
	// failure); Waited is the virtual time that took.
	Resumed bool          `json:"resumed,omitempty"`
	Waited  time.Duration `json:"waited,omitempty"`
	// LocalReply marks callbacks run for a local reply rather than the upstream response.
	LocalReply    bool                `json:"localReply,omitempty"`
	LocalResponse *host.LocalResponse `json:"localResponse,omitempty"`
	Signals       []host.Signal       `json:"signals,omitempty"`
	Failure       *host.Failure       `json:"failure,omitempty"`
	Skipped       bool                `json:"skipped,omitempty"`
}

// Report is everything that happened to one request.
type Report struct {
	Worker int           `json:"worker"`
	Phases []PhaseReport `json:"phases"`
	// Upstream is the request as the upstream saw it; nil when it never got there.
	Upstream *UpstreamRequest `json:"upstream,omitempty"`
	// Client is the response as the client saw it (Status 0 if it got none).
	Client ClientResponse `json:"client"`
	// LocalResponse is the local reply that answered the request instead of the upstream
	// (sent by the filter, the fail-closed 503, or Envoy's 413 or 500 for a body the filter
	// held past the buffer limit).
	LocalResponse *host.LocalResponse `json:"localResponse,omitempty"`
	// Status is the final HTTP status the client got (0 when none).
	Status int `json:"status"`
	// Closed reports that the stream was reset: the guest called proxy_close_stream, or a
	// local reply (or a body past the buffer limit) came after the response headers had gone
	// on. CloseDetails says which (wasm_close_stream, or the reply's details).
	Closed       bool   `json:"closed,omitempty"`
	CloseDetails string `json:"closeDetails,omitempty"`
	// Stalled names the phase that paused and was never resumed within MaxWait.
	Stalled Phase `json:"stalled,omitempty"`
	// Failures are the guest failures that affected this request.
	Failures []*host.Failure `json:"failures,omitempty"`
	// Logs, HTTPCalls and GRPCCalls are those produced while the request ran (including
	// ticks that fired meanwhile).
	Logs      []LogEntry       `json:"logs,omitempty"`
	HTTPCalls []HTTPCallRecord `json:"httpCalls,omitempty"`
	GRPCCalls []GRPCCallRecord `json:"grpcCalls,omitempty"`
	// Metrics and SharedData are snapshots taken after the request.
	Metrics    []host.MetricSnapshot `json:"metrics,omitempty"`
	SharedData map[string][]byte     `json:"sharedData,omitempty"`
	// FilterState holds the properties the guest set on the stream.
	FilterState map[string][]byte `json:"filterState,omitempty"`
}

// Phase returns the first report of phase p.
func (r *Report) Phase(p Phase) (PhaseReport, bool) {
	for _, ph := range r.Phases {
		if ph.Phase == p {
			return ph, true
		}
	}
	return PhaseReport{}, false
}

// Metric returns the metric called name from the report's snapshot.
func (r *Report) Metric(name string) (host.MetricSnapshot, bool) {
	for _, m := range r.Metrics {
		if m.Name == name {
			return m, true
		}
	}
	return host.MetricSnapshot{}, false
}

// signalBox collects the stream's asynchronous signals.
type signalBox struct {
	mu   sync.Mutex
	sigs []host.Signal
}

func (b *signalBox) add(s host.Signal) {
	b.mu.Lock()
	b.sigs = append(b.sigs, s)
	b.mu.Unlock()
}

func (b *signalBox) take() (host.Signal, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.sigs) == 0 {
		return host.Signal{}, false
	}
	s := b.sigs[0]
	b.sigs = b.sigs[1:]
	return s, true
}

// outcome is how the exchange stands.
type outcome int

const (
	proceed  outcome = iota // the stream goes on
	answered                // the filter's local reply is to go through the response path
	replaced                // a local reply replaced the response (Report.Client holds it)
	closed                  // the stream was reset
	stalled                 // the filter held the stream and never let go within MaxWait
)

// run is one request's way through the plugin: the harness's I/O around the stream's
// httpfilter.Filter, which decides what every callback's result means.
type run struct {
	h    *Harness
	s    *host.HTTPStream
	f    httpfilter.Filter
	sig  *signalBox
	rep  *Report
	req  *Request
	reqH *host.Headers
	out  outcome
	// local is the filter's local reply, encoded through the response path (inLocal).
	local   *host.LocalResponse
	inLocal bool
	// last is the index in rep.Phases of each direction's last callback (-1: none); body is
	// what each direction forwarded.
	last [2]int
	body [2][]byte
}

var phaseNames = [...]Phase{PhaseRequestHeaders, PhaseRequestBody, PhaseRequestTrailers,
	PhaseResponseHeaders, PhaseResponseBody, PhaseResponseTrailers}

// Do runs one request through the plugin: request headers, body chunks and trailers, the
// upstream (unless the filter answered locally), response headers, body chunks and trailers,
// then proxy_on_log, proxy_on_done and proxy_on_delete. What each callback's result means
// (Continue, the stops, resuming, local replies, resets, failures) is Envoy's, as
// httpfilter decides it. A local reply sent from the request path goes through the response
// callbacks, as Envoy encodes it through the filter chain; one sent from the response path
// replaces the response directly, or resets the stream once the response headers went on.
func (h *Harness) Do(ctx context.Context, req Request) (*Report, error) {
	h.mu.Lock()
	logMark, callMark, grpcMark := len(h.logs), len(h.calls), len(h.grpcCalls)
	h.mu.Unlock()

	if req.Info.StartTime.IsZero() {
		req.Info.StartTime = h.clock.Now()
	}
	box := &signalBox{}
	s, err := h.plugin.NewHTTPStream(ctx, host.StreamOptions{Worker: req.Worker, PinWorker: req.PinWorker, Info: req.Info, OnSignal: box.add})
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	r := &run{h: h, s: s, sig: box, rep: &Report{Worker: s.Worker()}, req: &req, last: [2]int{-1, -1}}
	r.f = httpfilter.New(s, httpfilter.Config{BufferLimit: h.opts.BufferLimit, Observer: r})
	r.exchange(ctx)
	start := req.Info.StartTime
	s.UpdateInfo(func(i *host.StreamInfo) { i.Duration = h.clock.Now().Sub(start) })
	r.f.Finish(ctx)
	r.rep.Phases = append(r.rep.Phases, PhaseReport{Phase: PhaseLog})
	if f := s.Failed(); f != nil {
		r.Failure(f)
	}

	h.mu.Lock()
	r.rep.Logs = append([]LogEntry(nil), h.logs[logMark:]...)
	r.rep.HTTPCalls = settled(h.calls[callMark:])
	r.rep.GRPCCalls = settled(h.grpcCalls[grpcMark:])
	h.mu.Unlock()
	r.rep.Metrics = h.Metrics()
	r.rep.SharedData = h.SharedData()
	r.rep.FilterState = s.FilterState()
	r.rep.Status = r.rep.Client.Status
	return r.rep, nil
}

// Failure records a failure of the guest (an httpfilter.Observer method).
func (r *run) Failure(f *host.Failure) {
	for _, g := range r.rep.Failures {
		if g == f {
			return
		}
	}
	r.rep.Failures = append(r.rep.Failures, f)
}

// Callback reports one callback (an httpfilter.Observer method).
func (r *run) Callback(cb httpfilter.Callback) {
	res, dir := cb.Result, cb.Phase.Dir()
	r.last[dir] = len(r.rep.Phases)
	r.rep.Phases = append(r.rep.Phases, PhaseReport{Phase: phaseNames[cb.Phase], Action: res.Action,
		LocalResponse: res.LocalResponse, Signals: res.Signals, Failure: res.Failure, Skipped: res.Skipped,
		LocalReply: r.inLocal && dir == host.StreamResponse})
}

// apply collects what the filter let go on and how an event decided the stream.
func (r *run) apply(v httpfilter.Verdict) {
	for dir := host.StreamRequest; dir <= host.StreamResponse; dir++ {
		r.body[dir] = append(r.body[dir], r.f.Take(dir).Data...)
	}
	switch v.Kind {
	case httpfilter.LocalReply:
		r.local, r.out = v.Reply, answered
	case httpfilter.DirectReply:
		r.rep.LocalResponse, r.rep.Client = v.Reply, directReply(v.Reply, r.reqH)
		r.out = replaced
	case httpfilter.Reset:
		r.rep.Closed, r.rep.CloseDetails = true, v.Details
		r.out = closed
	}
}

// direction feeds one direction to the filter (headers, body chunks, trailers), letting the
// guest's signals in, and virtual time pass, whenever the filter holds it, until the
// direction went through or the stream's fate was decided.
func (r *run) direction(ctx context.Context, dir host.StreamType, h *host.Headers, body [][]byte, trailers *host.Headers) {
	f := &r.f
	r.apply(f.Headers(ctx, dir, h, len(body) == 0 && trailers == nil))
	ready := func() bool { return f.Accepting(dir) || !f.Held(dir) }
	for i, chunk := range body {
		if !r.wait(ctx, dir, ready) || !f.Accepting(dir) {
			return
		}
		r.apply(f.Data(ctx, dir, chunk, i == len(body)-1 && trailers == nil))
	}
	if trailers != nil {
		if !r.wait(ctx, dir, ready) || !f.Accepting(dir) {
			return
		}
		r.apply(f.Trailers(ctx, dir, trailers))
	}
	r.wait(ctx, dir, func() bool { return !f.Held(dir) })
}

// wait lets the guest's signals in, and virtual time pass (firing HTTP call answers,
// timeouts and ticks) while needed, until cond holds, the stream's fate is decided, or
// MaxWait runs out (the stream stalled). The callback that held direction dir records how
// long that took and whether the guest let go. It reports whether the stream goes on with
// cond met.
func (r *run) wait(ctx context.Context, dir host.StreamType, cond func() bool) bool {
	held, at, before := r.f.Held(dir), r.last[dir], r.h.clock.Now()
	maxWait := r.req.MaxWait
	if maxWait == 0 {
		maxWait = DefaultMaxWait
	}
	limit := before.Add(maxWait)
	for {
		for r.out == proceed {
			sig, ok := r.sig.take()
			if !ok {
				break
			}
			r.apply(r.f.Signal(ctx, sig))
		}
		if r.out != proceed || cond() {
			break
		}
		due, ok := r.h.clock.NextDue()
		if maxWait < 0 || !ok || due.After(limit) {
			r.out = stalled
			break
		}
		r.h.clock.AdvanceToNext()
	}
	if held && at >= 0 {
		p := &r.rep.Phases[at]
		p.Waited += r.h.clock.Now().Sub(before)
		p.Resumed = p.Resumed || r.out == proceed && !r.f.Held(dir)
		if r.out == stalled {
			r.rep.Stalled = p.Phase
		}
	}
	return r.out == proceed && cond()
}

func (r *run) exchange(ctx context.Context) {
	req := r.req
	r.reqH = host.NewHeaders(requestHeaders(req)...)
	var reqT *host.Headers
	if len(req.Trailers) > 0 {
		reqT = host.NewHeaders(req.Trailers...)
	}
	r.direction(ctx, host.StreamRequest, r.reqH, req.Body, reqT)
	switch r.out {
	case answered:
		r.localReply(ctx)
		return
	case proceed:
	default:
		return
	}
	up := UpstreamRequest{Headers: r.reqH.Pairs(), Body: r.body[host.StreamRequest]}
	if t := trailersOf(reqT, r.s.RequestTrailers()); t != nil {
		up.Trailers = t.Pairs()
	}
	r.rep.Upstream = &up
	resp := req.Response
	if req.Upstream != nil {
		resp = req.Upstream(up)
	}
	if resp.Status == 0 {
		resp.Status = 200
	}
	r.response(ctx, append([][2]string{{":status", strconv.Itoa(resp.Status)}}, resp.Headers...), resp.Body, resp.Trailers)
}

// trailersOf is the trailers a direction forwards: those it had, or those the guest added
// at the end of its body.
func trailersOf(had, added *host.Headers) *host.Headers {
	if had != nil {
		return had
	}
	return added
}

// response runs a response through the response callbacks and records what the client
// gets.
func (r *run) response(ctx context.Context, headers [][2]string, body [][]byte, trailers [][2]string) {
	respH := host.NewHeaders(headers...)
	var respT *host.Headers
	if len(trailers) > 0 {
		respT = host.NewHeaders(trailers...)
	}
	r.direction(ctx, host.StreamResponse, respH, body, respT)
	switch r.out {
	case closed, stalled:
		r.rep.Client = ClientResponse{}
		return
	case replaced:
		return
	}
	c := ClientResponse{Body: r.body[host.StreamResponse]}
	for _, p := range respH.Pairs() {
		if p[0] == ":status" {
			c.Status, _ = strconv.Atoi(p[1])
			continue
		}
		c.Headers = append(c.Headers, p)
	}
	if t := trailersOf(respT, r.s.ResponseTrailers()); t != nil {
		c.Trailers = t.Pairs()
	}
	r.rep.Client = c
}

// localReply encodes the filter's local reply from the request path through the response
// callbacks, as Envoy's sendLocalReply does.
func (r *run) localReply(ctx context.Context) {
	lr := r.local
	r.rep.LocalResponse = lr
	reply := directReply(lr, r.reqH)
	headers := append([][2]string{{":status", strconv.Itoa(reply.Status)}}, reply.Headers...)
	var body [][]byte
	if len(reply.Body) > 0 {
		body = [][]byte{reply.Body}
	}
	r.inLocal, r.out = true, proceed
	r.response(ctx, headers, body, reply.Trailers)
}

// directReply is the response Envoy builds for a local reply: the status with content-type
// and content-length for a body plus the filter's headers, or, for a gRPC request, a
// trailers-only gRPC response carrying grpc-status and grpc-message.
func directReply(lr *host.LocalResponse, reqH *host.Headers) ClientResponse {
	if ct, _ := reqH.Get("content-type"); strings.HasPrefix(ct, "application/grpc") {
		code := int(lr.GRPCStatus)
		if lr.GRPCStatus < 0 {
			code = httpToGRPC(lr.StatusCode)
		}
		h := [][2]string{{"content-type", "application/grpc"}, {"grpc-status", strconv.Itoa(code)}}
		if len(lr.Body) > 0 {
			h = append(h, [2]string{"grpc-message", string(lr.Body)})
		}
		return ClientResponse{Status: 200, Headers: append(h, lowered(lr.Headers)...)}
	}
	var h [][2]string
	if len(lr.Body) > 0 {
		h = append(h, [2]string{"content-length", strconv.Itoa(len(lr.Body))}, [2]string{"content-type", "text/plain"})
	}
	return ClientResponse{Status: lr.StatusCode, Headers: append(h, lowered(lr.Headers)...), Body: lr.Body}
}

func lowered(p [][2]string) [][2]string {
	out := make([][2]string, len(p))
	for i, kv := range p {
		out[i] = [2]string{strings.ToLower(kv[0]), kv[1]}
	}
	return out
}

// httpToGRPC is Envoy's Grpc::Utility::httpToGrpcStatus.
func httpToGRPC(status int) int {
	switch status {
	case 400:
		return 13
	case 401:
		return 16
	case 403:
		return 7
	case 404:
		return 12
	case 429, 502, 503, 504:
		return 14
	}
	return 2
}

func requestHeaders(req *Request) [][2]string {
	var out [][2]string
	add := func(k, v, def string) {
		if _, ok := headerValue(req.Headers, k); ok {
			return
		}
		if v == "" {
			v = def
		}
		out = append(out, [2]string{k, v})
	}
	add(":method", req.Method, "GET")
	add(":path", req.Path, "/")
	add(":authority", req.Authority, "example.com")
	add(":scheme", req.Scheme, "http")
	return append(out, req.Headers...)
}
