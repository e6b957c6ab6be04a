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
	// (sent by the filter, or the fail-closed 503).
	LocalResponse *host.LocalResponse `json:"localResponse,omitempty"`
	// Status is the final HTTP status the client got (0 when none).
	Status int `json:"status"`
	// Closed reports that the guest reset the stream (proxy_close_stream).
	Closed bool `json:"closed,omitempty"`
	// Stalled names the phase that paused and was never resumed within MaxWait.
	Stalled Phase `json:"stalled,omitempty"`
	// Failures are the guest failures that affected this request.
	Failures []*host.Failure `json:"failures,omitempty"`
	// Logs and HTTPCalls are those produced while the request ran (including ticks that
	// fired meanwhile).
	Logs      []LogEntry       `json:"logs,omitempty"`
	HTTPCalls []HTTPCallRecord `json:"httpCalls,omitempty"`
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

// outcome is how a phase ended for the stream.
type outcome int

const (
	proceed  outcome = iota // forward and go on
	answered                // a local reply answers the request
	closed                  // the guest reset the stream
	stalled                 // paused and never resumed
)

type run struct {
	h     *Harness
	s     *host.HTTPStream
	sig   *signalBox
	rep   *Report
	req   *Request
	local *host.LocalResponse
	// inLocal is set while the local reply runs through the response callbacks.
	inLocal bool
}

// Do runs one request through the plugin: request headers, body chunks and trailers, the
// upstream (unless the filter answered locally), response headers, body chunks and trailers,
// then proxy_on_log, proxy_on_done and proxy_on_delete. A local reply sent from the
// request path goes through the response callbacks, as Envoy encodes it through the filter
// chain; one sent from the response path replaces the response directly.
func (h *Harness) Do(ctx context.Context, req Request) (*Report, error) {
	h.mu.Lock()
	logMark, callMark := len(h.logs), len(h.calls)
	h.mu.Unlock()

	if req.Info.StartTime.IsZero() {
		req.Info.StartTime = h.clock.Now()
	}
	box := &signalBox{}
	s, err := h.plugin.NewHTTPStream(ctx, host.StreamOptions{Worker: req.Worker, PinWorker: req.PinWorker, Info: req.Info, OnSignal: box.add})
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	r := &run{h: h, s: s, sig: box, rep: &Report{Worker: s.Worker()}, req: &req}
	r.exchange(ctx)
	start := req.Info.StartTime
	s.UpdateInfo(func(i *host.StreamInfo) { i.Duration = h.clock.Now().Sub(start) })
	s.Finish(ctx)
	r.rep.Phases = append(r.rep.Phases, PhaseReport{Phase: PhaseLog})
	if f := s.Failed(); f != nil && !r.hasFailure(f) {
		r.rep.Failures = append(r.rep.Failures, f)
	}

	h.mu.Lock()
	r.rep.Logs = append([]LogEntry(nil), h.logs[logMark:]...)
	for _, c := range h.calls[callMark:] {
		c.settle()
		r.rep.HTTPCalls = append(r.rep.HTTPCalls, *c)
	}
	h.mu.Unlock()
	r.rep.Metrics = h.Metrics()
	r.rep.SharedData = h.SharedData()
	r.rep.FilterState = s.FilterState()
	r.rep.Status = r.rep.Client.Status
	return r.rep, nil
}

func (r *run) hasFailure(f *host.Failure) bool {
	for _, g := range r.rep.Failures {
		if g == f {
			return true
		}
	}
	return false
}

// phase records a callback's result and decides what happens next, waiting for the guest
// to resume a paused stream.
func (r *run) phase(p Phase, res host.Result, dir host.StreamType) outcome {
	pr := PhaseReport{Phase: p, Action: res.Action, LocalResponse: res.LocalResponse, Signals: res.Signals,
		Failure: res.Failure, Skipped: res.Skipped, LocalReply: r.inLocal}
	if res.Failure != nil && !r.hasFailure(res.Failure) {
		r.rep.Failures = append(r.rep.Failures, res.Failure)
	}
	out := proceed
	switch {
	case res.LocalResponse != nil && !r.inLocal:
		r.local = res.LocalResponse
		out = answered
	case hasSignal(res.Signals, host.SignalClose):
		out = closed
	case res.Action == host.Pause && !hasSignal(res.Signals, host.SignalContinue, dir):
		before := r.h.clock.Now()
		out = r.wait(dir)
		pr.Waited = r.h.clock.Now().Sub(before)
		pr.Resumed = out == proceed
		if out == stalled {
			r.rep.Stalled = p
		}
	}
	r.rep.Phases = append(r.rep.Phases, pr)
	return out
}

func hasSignal(sigs []host.Signal, kind host.SignalKind, dir ...host.StreamType) bool {
	for _, s := range sigs {
		if s.Kind == kind && (len(dir) == 0 || s.Stream == dir[0]) {
			return true
		}
	}
	return false
}

// wait lets virtual time pass (firing HTTP call answers, timeouts and ticks) until the
// guest resumes direction dir, answers or resets the stream, or MaxWait runs out.
func (r *run) wait(dir host.StreamType) outcome {
	maxWait := r.req.MaxWait
	if maxWait == 0 {
		maxWait = DefaultMaxWait
	}
	limit := r.h.clock.Now().Add(maxWait)
	for {
		for {
			sig, ok := r.sig.take()
			if !ok {
				break
			}
			switch sig.Kind {
			case host.SignalContinue:
				if sig.Stream == dir {
					return proceed
				}
			case host.SignalClose:
				return closed
			case host.SignalLocalResponse:
				if !r.inLocal {
					r.local = sig.LocalResponse
					return answered
				}
			case host.SignalFailed:
				if sig.Failure != nil && !r.hasFailure(sig.Failure) {
					r.rep.Failures = append(r.rep.Failures, sig.Failure)
				}
				if sig.LocalResponse != nil && !r.inLocal {
					r.local = sig.LocalResponse
					return answered
				}
				return proceed
			}
		}
		due, ok := r.h.clock.NextDue()
		if maxWait < 0 || !ok || due.After(limit) {
			return stalled
		}
		r.h.clock.AdvanceToNext()
	}
}

func (r *run) exchange(ctx context.Context) {
	req := r.req
	s := r.s
	reqH := host.NewHeaders(requestHeaders(req)...)
	hasBody, hasTrailers := len(req.Body) > 0, len(req.Trailers) > 0

	out := r.phase(PhaseRequestHeaders, s.OnRequestHeaders(ctx, reqH, !hasBody && !hasTrailers), host.StreamRequest)
	var forwarded []byte
	for i, chunk := range req.Body {
		if out != proceed {
			break
		}
		eos := i == len(req.Body)-1 && !hasTrailers
		res := s.OnRequestBody(ctx, chunk, eos)
		if res.Action == host.Continue {
			forwarded = append(forwarded, res.Body...)
		}
		// A paused body keeps receiving chunks (the host buffers them); only the end of the
		// stream waits for the guest.
		if res.Action == host.Pause && !eos && res.LocalResponse == nil && !hasSignal(res.Signals, host.SignalClose) {
			r.rep.Phases = append(r.rep.Phases, PhaseReport{Phase: PhaseRequestBody, Action: res.Action, Signals: res.Signals})
			continue
		}
		out = r.phase(PhaseRequestBody, res, host.StreamRequest)
		if out == proceed && res.Action == host.Pause {
			forwarded = append(forwarded, s.TakeBufferedBody(host.StreamRequest)...)
		}
	}
	if out == proceed && hasTrailers {
		out = r.phase(PhaseRequestTrailers, s.OnRequestTrailers(ctx, host.NewHeaders(req.Trailers...)), host.StreamRequest)
	}
	if out == proceed {
		forwarded = append(forwarded, s.TakeBufferedBody(host.StreamRequest)...)
	}
	switch out {
	case closed:
		r.rep.Closed = true
		return
	case stalled:
		return
	case answered:
		r.localReply(ctx, reqH)
		return
	}

	up := UpstreamRequest{Headers: reqH.Pairs(), Body: forwarded}
	if t := s.RequestTrailers(); t != nil {
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
	headers := append([][2]string{{":status", strconv.Itoa(resp.Status)}}, resp.Headers...)
	out = r.response(ctx, headers, resp.Body, resp.Trailers)
	switch out {
	case closed:
		r.rep.Closed = true
		r.rep.Client = ClientResponse{}
	case answered:
		// A reply sent while encoding the upstream response replaces it directly.
		r.rep.LocalResponse = r.local
		r.rep.Client = directReply(r.local, reqH)
	case stalled:
		r.rep.Client = ClientResponse{}
	}
}

// response runs a response through the response callbacks and records what the client
// gets.
func (r *run) response(ctx context.Context, headers [][2]string, body [][]byte, trailers [][2]string) outcome {
	s := r.s
	respH := host.NewHeaders(headers...)
	hasBody, hasTrailers := len(body) > 0, len(trailers) > 0
	out := r.phase(PhaseResponseHeaders, s.OnResponseHeaders(ctx, respH, !hasBody && !hasTrailers), host.StreamResponse)
	var forwarded []byte
	for i, chunk := range body {
		if out != proceed {
			break
		}
		eos := i == len(body)-1 && !hasTrailers
		res := s.OnResponseBody(ctx, chunk, eos)
		if res.Action == host.Continue {
			forwarded = append(forwarded, res.Body...)
		}
		if res.Action == host.Pause && !eos && res.LocalResponse == nil && !hasSignal(res.Signals, host.SignalClose) {
			r.rep.Phases = append(r.rep.Phases, PhaseReport{Phase: PhaseResponseBody, Action: res.Action, Signals: res.Signals, LocalReply: r.inLocal})
			continue
		}
		out = r.phase(PhaseResponseBody, res, host.StreamResponse)
		if out == proceed && res.Action == host.Pause {
			forwarded = append(forwarded, s.TakeBufferedBody(host.StreamResponse)...)
		}
	}
	if out == proceed && hasTrailers {
		out = r.phase(PhaseResponseTrailers, s.OnResponseTrailers(ctx, host.NewHeaders(trailers...)), host.StreamResponse)
	}
	if out == proceed {
		forwarded = append(forwarded, s.TakeBufferedBody(host.StreamResponse)...)
	}
	if out != proceed {
		return out
	}
	c := ClientResponse{Body: forwarded}
	for _, p := range respH.Pairs() {
		if p[0] == ":status" {
			c.Status, _ = strconv.Atoi(p[1])
			continue
		}
		c.Headers = append(c.Headers, p)
	}
	if t := s.ResponseTrailers(); t != nil {
		c.Trailers = t.Pairs()
	}
	r.rep.Client = c
	return proceed
}

// localReply encodes a local reply from the request path through the response callbacks,
// as Envoy's sendLocalReply does.
func (r *run) localReply(ctx context.Context, reqH *host.Headers) {
	lr := r.local
	r.rep.LocalResponse = lr
	reply := directReply(lr, reqH)
	headers := append([][2]string{{":status", strconv.Itoa(reply.Status)}}, reply.Headers...)
	var body [][]byte
	if len(reply.Body) > 0 {
		body = [][]byte{reply.Body}
	}
	r.inLocal = true
	switch r.response(ctx, headers, body, reply.Trailers) {
	case closed:
		r.rep.Closed = true
		r.rep.Client = ClientResponse{}
	case stalled:
		r.rep.Client = ClientResponse{}
	}
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
