package host

import (
	"context"
	"fmt"
	"time"
)

// LocalResponse is a reply the proxy sends instead of (or in place of) the upstream's:
// from proxy_send_local_response, or Envoy's 503 when a fail-closed plugin fails.
type LocalResponse struct {
	StatusCode int
	// Details is the response code details (Envoy's %RESPONSE_CODE_DETAILS%).
	Details string
	Body    []byte
	// Headers are added to the reply.
	Headers [][2]string
	// GRPCStatus is the grpc-status to send for gRPC requests, or -1 for none (SDKs pass
	// -1 when the filter did not set one, and Envoy then sends none).
	GRPCStatus int32
}

// FailStreamDetails is the response code details of the fail-closed reply, as in Envoy.
const FailStreamDetails = "wasm_fail_stream"

// failClosedReply is Envoy's failStream: 503 with gRPC status UNAVAILABLE (14).
func failClosedReply() *LocalResponse {
	return &LocalResponse{StatusCode: 503, Details: FailStreamDetails, GRPCStatus: 14}
}

// SignalKind says what a guest did to a stream.
type SignalKind int

// Signal kinds.
const (
	// SignalContinue: the guest resumed the paused direction Stream (proxy_continue_stream,
	// or 0.1.0 proxy_continue_request/response).
	SignalContinue SignalKind = iota + 1
	// SignalClose: the guest reset the direction Stream (proxy_close_stream).
	SignalClose
	// SignalLocalResponse: the guest answered the stream itself.
	SignalLocalResponse
	// SignalFailed: the stream lost its filter (its instance failed). With a
	// LocalResponse the plugin fails closed and the stream must be answered with it;
	// without one it fails open and must continue as if the filter were absent.
	SignalFailed
	// SignalClearRouteCache: a 0.1.0 guest asked for the route to be recomputed.
	SignalClearRouteCache
)

func (k SignalKind) String() string {
	switch k {
	case SignalContinue:
		return "continue"
	case SignalClose:
		return "close"
	case SignalLocalResponse:
		return "local_response"
	case SignalFailed:
		return "failed"
	case SignalClearRouteCache:
		return "clear_route_cache"
	}
	return "unknown"
}

// MarshalText renders the kind by name.
func (k SignalKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Signal is something a guest did to a stream outside the stream's own callback (in an
// HTTP call response, a tick, a queue notification, or through another stream's callback
// after proxy_set_effective_context), delivered through StreamOptions.OnSignal after that
// callback returned (Envoy's deferred after-VM-call actions).
type Signal struct {
	Kind          SignalKind
	Stream        StreamType
	LocalResponse *LocalResponse
	Failure       *Failure
}

// Result is the outcome of one stream callback. Everything the guest did to the stream
// during the callback is reported here, applied only after the callback returned.
type Result struct {
	// Action is what the filter returned, or what the failure policy decided.
	Action Action
	// Status is the callback's return value as Envoy reads it for the callback's kind (see
	// FilterStatus): a stop whenever the guest sent a local reply or failed closed.
	Status FilterStatus
	// LocalResponse is set when the filter sent a local reply during the callback (the
	// first one wins), or when the plugin failed closed.
	LocalResponse *LocalResponse
	// Signals are the continue/close requests the guest made for this stream during the
	// callback.
	Signals []Signal
	// Failure is set when the guest failed in this callback (or, for the first callback
	// after it, when the stream could not get a working instance).
	Failure *Failure
	// Body, for body and data callbacks with Action Continue, is what to forward: the
	// buffered data plus this chunk, as modified by the guest.
	Body []byte
	// Skipped reports that the guest was not called because the stream already failed.
	Skipped bool
}

// Address is a network endpoint as "ip:port".
type Address string

// ConnectionInfo describes the downstream connection (connection.* attributes). Empty
// strings read as NotFound, as Envoy does for plaintext connections.
type ConnectionInfo struct {
	ID                          uint64
	MTLS                        bool
	RequestedServerName         string
	TLSVersion                  string
	SubjectLocalCertificate     string
	SubjectPeerCertificate      string
	DNSSanLocalCertificate      string
	DNSSanPeerCertificate       string
	URISanLocalCertificate      string
	URISanPeerCertificate       string
	SHA256PeerCertificateDigest string
	TerminationDetails          string
}

// UpstreamInfo describes the upstream connection (upstream.* attributes).
type UpstreamInfo struct {
	Address                     Address
	LocalAddress                Address
	TLSVersion                  string
	SubjectLocalCertificate     string
	SubjectPeerCertificate      string
	DNSSanLocalCertificate      string
	DNSSanPeerCertificate       string
	URISanLocalCertificate      string
	URISanPeerCertificate       string
	SHA256PeerCertificateDigest string
	TransportFailureReason      string
}

// StreamInfo is what the proxy knows about a stream beyond its headers and bodies; the host
// derives Envoy's request.*, response.*, source.*, destination.*, connection.* and
// upstream.* attributes from it and from the stream's headers. Update it during the stream
// with UpdateInfo.
type StreamInfo struct {
	// Protocol is "HTTP/1.1", "HTTP/2", ... (request.protocol).
	Protocol string
	// StartTime is when the request started (request.time).
	StartTime time.Time
	// Duration is the request duration once complete (request.duration).
	Duration time.Duration
	// Source and Destination are the downstream peer and local address.
	Source, Destination Address
	Connection          ConnectionInfo
	Upstream            UpstreamInfo
	// ResponseCode overrides the :status response header for response.code.
	ResponseCode        int
	ResponseCodeDetails string
	ResponseFlags       uint64
	// ClusterName and RouteName are the routing decision (xds.cluster_name,
	// xds.route_name, and the older top-level cluster_name, route_name).
	ClusterName, RouteName string
	// Properties are further attributes by first path segment (e.g. "xds" metadata, or
	// "filter_state"); see Environment.Properties for the value types.
	Properties map[string]any
}

// StreamOptions configure a new stream.
type StreamOptions struct {
	// Worker is the instance to bind the stream to when PinWorker is set; otherwise the
	// host picks instances round-robin.
	Worker    int
	PinWorker bool
	Info      StreamInfo
	// OnSignal receives Signals. It may run on any goroutine, including inside one of the
	// stream's own method calls just before that call returns; it should record the signal
	// and return without blocking.
	OnSignal func(Signal)
}

type streamPhase int

const (
	phaseNone streamPhase = iota
	phaseRequestHeaders
	phaseRequestBody
	phaseRequestTrailers
	phaseResponseHeaders
	phaseResponseBody
	phaseResponseTrailers
	phaseLog
)

// streamCore is what HTTP and network streams share: their binding to an instance and VM,
// their failure state, and their properties.
type streamCore struct {
	p        *Plugin
	in       *instance
	v        *vm
	id       uint32
	onSignal func(Signal)

	info        StreamInfo
	filterState map[string][]byte

	phase streamPhase
	eos   bool

	failed       *Failure
	failReported bool
	done         bool
}

// failPolicy is the local reply a failed stream gets: none when failing open.
func (s *streamCore) failPolicy() *LocalResponse {
	if s.p.cfg.FailOpen {
		return nil
	}
	return failClosedReply()
}

// newStream binds s to an instance and creates its context in the guest. Guest failures
// here do not fail the call: the stream's first callback reports them.
func (p *Plugin) newStream(s *streamCore, opts StreamOptions, attach func(*guestContext)) error {
	if p.closed.Load() {
		return ErrClosed
	}
	var in *instance
	if opts.PinWorker {
		if opts.Worker < 0 || opts.Worker >= len(p.instances) {
			return fmt.Errorf("plugin %q: worker %d out of range [0, %d)", p.cfg.Name, opts.Worker, len(p.instances))
		}
		in = p.instances[opts.Worker]
	} else {
		in = p.instances[(p.rr.Add(1)-1)%uint64(len(p.instances))]
	}
	s.p, s.in, s.onSignal, s.info = p, in, opts.OnSignal, opts.Info
	in.enter()
	defer in.leave()
	p.count(func(st *PluginStats) { st.ActiveStreams++ })
	v, err := in.ensureVM()
	if err != nil {
		s.failed = &Failure{Kind: FailureUnavailable, Plugin: p.cfg.Name, Callback: fnOnContextCreate, Instance: in.idx, Err: err}
		p.count(func(st *PluginStats) { st.Failures[FailureUnavailable]++ })
		return nil
	}
	s.v = v
	s.id = v.newContextID()
	gc := &guestContext{id: s.id}
	attach(gc)
	v.contexts[s.id] = gc
	vc := v.newCall(s.id, fnOnContextCreate, s)
	_, _, err = v.call(vc, fnOnContextCreate, uint64(s.id), uint64(v.rootID))
	v.release(vc)
	if err != nil {
		s.failed = in.fail(v, err, s)
	}
	return nil
}

// run calls one stream callback of kind k with the instance entered. prepare runs first
// (to install the headers or data the callback will see); args are the callback arguments.
func (s *streamCore) run(cb string, k callbackKind, prepare func(), args ...uint64) (res Result, called bool) {
	if s.done {
		return Result{Action: Continue, Skipped: true}, false
	}
	if s.failed != nil {
		if s.failReported {
			return Result{Action: Continue, Skipped: true}, false
		}
		return s.failResult(s.failed, k), false
	}
	if s.v == nil || !s.v.alive() {
		// The VM went away without telling us (it cannot, but be safe).
		f := &Failure{Kind: FailureUnavailable, Plugin: s.p.cfg.Name, Callback: cb, Instance: s.in.idx, Err: ErrUnavailable}
		s.failed = f
		return s.failResult(f, k), false
	}
	if prepare != nil {
		prepare()
	}
	v := s.v
	vc := v.newCall(s.id, cb, s)
	ret, exported, err := v.call(vc, cb, args...)
	local, signals := vc.local, vc.signals
	v.release(vc)
	if err != nil {
		f := s.in.fail(v, err, s)
		s.failed = f
		return s.failResult(f, k), false
	}
	if exported {
		res.Status = k.status(ret, s.p.cfg.AllowOnHeadersStopIteration)
	}
	res.Action = Continue
	if res.Status != StatusContinue {
		res.Action = Pause
	}
	if local != nil {
		// Envoy stops the stream's iteration after a local reply, whatever the guest returned.
		res.Status = k.stop()
	}
	res.LocalResponse = local
	res.Signals = signals
	return res, exported
}

// failResult applies the plugin's failure policy to a stream's first report of its failure
// in a callback of kind k.
func (s *streamCore) failResult(f *Failure, k callbackKind) Result {
	s.failReported = true
	if s.p.cfg.FailOpen {
		s.p.count(func(st *PluginStats) { st.FailedOpen++ })
		return Result{Action: Continue, Failure: f}
	}
	s.p.count(func(st *PluginStats) { st.FailedClosed++ })
	return Result{Action: Pause, Status: k.stop(), Failure: f, LocalResponse: failClosedReply()}
}

// finish runs the end-of-stream callbacks in order and forgets the context.
func (s *streamCore) finish(cbs ...string) {
	if s.done {
		return
	}
	s.done = true
	s.p.count(func(st *PluginStats) { st.ActiveStreams-- })
	if s.v == nil {
		return
	}
	defer delete(s.v.contexts, s.id)
	if s.failed != nil || !s.v.alive() {
		return
	}
	for _, cb := range cbs {
		if cb == fnOnLog {
			s.phase = phaseLog
		}
		v := s.v
		vc := v.newCall(s.id, cb, s)
		_, _, err := v.call(vc, cb, uint64(s.id))
		v.release(vc)
		if err != nil {
			s.failed = s.in.fail(s.v, err, s)
			s.failReported = true
			return
		}
	}
}

// emit delivers a signal to the embedder, after the instance is released.
func (s *streamCore) emit(sig Signal) {
	if cb := s.onSignal; cb != nil {
		s.in.notes = append(s.in.notes, func() { cb(sig) })
	}
}

// HTTPStream is one HTTP request/response pair going through the plugin. Call its
// methods in the order the proxy sees the stream; each may be called from any goroutine but
// not concurrently with the stream's other methods.
type HTTPStream struct {
	streamCore
	reqH, reqT, respH, respT *Headers
	reqBody, respBody        []byte
	reqBuffering, respBuf    bool
	reqBytes, respBytes      int64
}

// NewHTTPStream starts an HTTP stream on one of the plugin's instances and calls
// proxy_on_context_create for it.
func (p *Plugin) NewHTTPStream(ctx context.Context, opts StreamOptions) (*HTTPStream, error) {
	s := &HTTPStream{}
	if err := p.newStream(&s.streamCore, opts, func(gc *guestContext) { gc.http = s }); err != nil {
		return nil, err
	}
	return s, nil
}

// ID is the stream's context id in its instance.
func (s *HTTPStream) ID() uint32 { return s.id }

// Worker is the index of the instance the stream is bound to.
func (s *HTTPStream) Worker() int { return s.in.idx }

// Failed returns the failure that took the stream's filter away, if any.
func (s *HTTPStream) Failed() *Failure {
	s.in.enter()
	defer s.in.leave()
	return s.failed
}

// UpdateInfo changes the stream's StreamInfo (e.g. once the response code is known).
func (s *HTTPStream) UpdateInfo(f func(*StreamInfo)) {
	s.in.enter()
	defer s.in.leave()
	f(&s.info)
}

// FilterState returns the properties the guest set with proxy_set_property.
func (s *HTTPStream) FilterState() map[string][]byte {
	s.in.enter()
	defer s.in.leave()
	out := make(map[string][]byte, len(s.filterState))
	for k, v := range s.filterState {
		out[k] = append([]byte(nil), v...)
	}
	return out
}

// RequestHeaders returns the request header map last passed in (as modified by the guest).
func (s *HTTPStream) RequestHeaders() *Headers { return s.get(&s.reqH) }

// RequestTrailers returns the request trailers, including trailers the guest added at the
// end of the body when the request had none.
func (s *HTTPStream) RequestTrailers() *Headers { return s.get(&s.reqT) }

// ResponseHeaders returns the response header map last passed in.
func (s *HTTPStream) ResponseHeaders() *Headers { return s.get(&s.respH) }

// ResponseTrailers returns the response trailers (see RequestTrailers).
func (s *HTTPStream) ResponseTrailers() *Headers { return s.get(&s.respT) }

func (s *HTTPStream) get(h **Headers) *Headers {
	s.in.enter()
	defer s.in.leave()
	return *h
}

// TakeBufferedBody returns and clears the body the host buffered for direction t while the
// filter paused body processing; call it when a SignalContinue resumes that direction.
func (s *HTTPStream) TakeBufferedBody(t StreamType) []byte {
	s.in.enter()
	defer s.in.leave()
	var b []byte
	switch t {
	case StreamRequest:
		b, s.reqBody, s.reqBuffering = s.reqBody, nil, false
	case StreamResponse:
		b, s.respBody, s.respBuf = s.respBody, nil, false
	}
	return b
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// OnRequestHeaders delivers the request headers (proxy_on_request_headers). h is modified
// in place by the guest.
func (s *HTTPStream) OnRequestHeaders(ctx context.Context, h *Headers, endOfStream bool) Result {
	return s.deliverMap(fnOnRequestHeaders, phaseRequestHeaders, &s.reqH, h, endOfStream, true)
}

// OnRequestBody delivers a chunk of request body (proxy_on_request_body). While the filter
// pauses, chunks accumulate and the guest sees the whole buffer; Result.Body holds what to
// forward once it continues.
func (s *HTTPStream) OnRequestBody(ctx context.Context, chunk []byte, endOfStream bool) Result {
	return s.deliverBody(fnOnRequestBody, phaseRequestBody, &s.reqBody, &s.reqBuffering, &s.reqBytes, chunk, endOfStream)
}

// OnRequestTrailers delivers the request trailers (proxy_on_request_trailers).
func (s *HTTPStream) OnRequestTrailers(ctx context.Context, t *Headers) Result {
	return s.deliverMap(fnOnRequestTrailers, phaseRequestTrailers, &s.reqT, t, true, false)
}

// OnResponseHeaders delivers the response headers, including ":status"
// (proxy_on_response_headers).
func (s *HTTPStream) OnResponseHeaders(ctx context.Context, h *Headers, endOfStream bool) Result {
	return s.deliverMap(fnOnResponseHeaders, phaseResponseHeaders, &s.respH, h, endOfStream, true)
}

// OnResponseBody delivers a chunk of response body (proxy_on_response_body); see
// OnRequestBody.
func (s *HTTPStream) OnResponseBody(ctx context.Context, chunk []byte, endOfStream bool) Result {
	return s.deliverBody(fnOnResponseBody, phaseResponseBody, &s.respBody, &s.respBuf, &s.respBytes, chunk, endOfStream)
}

// OnResponseTrailers delivers the response trailers (proxy_on_response_trailers).
func (s *HTTPStream) OnResponseTrailers(ctx context.Context, t *Headers) Result {
	return s.deliverMap(fnOnResponseTrailers, phaseResponseTrailers, &s.respT, t, true, false)
}

// deliverMap runs a header or trailer callback with m as the phase's map (slot); trailer
// callbacks take no end_of_stream argument (eosArg false).
func (s *HTTPStream) deliverMap(fn string, phase streamPhase, slot **Headers, m *Headers, endOfStream, eosArg bool) Result {
	if m == nil {
		m = NewHeaders()
	}
	s.in.enter()
	defer s.in.leave()
	args := [3]uint64{uint64(s.id), uint64(m.Len()), b2u(endOfStream)}
	n := 2
	if eosArg {
		n = 3
	}
	k := kindTrailers
	if eosArg {
		k = kindHeaders
	}
	res, _ := s.run(fn, k, func() {
		*slot, s.phase, s.eos = m, phase, endOfStream
	}, args[:n]...)
	if *slot == nil {
		*slot = m
	}
	return res
}

// deliverBody runs a body callback for one chunk: while the guest pauses, chunks
// accumulate in *body (buffering) and the guest sees the whole buffer.
func (s *HTTPStream) deliverBody(fn string, phase streamPhase, body *[]byte, buffering *bool, total *int64, chunk []byte, endOfStream bool) Result {
	s.in.enter()
	defer s.in.leave()
	*total += int64(len(chunk))
	if *buffering {
		*body = append(*body, chunk...)
	} else {
		*body = append([]byte(nil), chunk...)
	}
	res, _ := s.run(fn, kindData, func() {
		s.phase, s.eos = phase, endOfStream
	}, uint64(s.id), uint64(len(*body)), b2u(endOfStream))
	if res.Action == Continue {
		res.Body, *body, *buffering = *body, nil, false
	} else {
		*buffering = true
	}
	return res
}

// Finish ends the stream: proxy_on_log (headers, trailers and properties stay readable),
// then proxy_on_done and proxy_on_delete, the order Envoy reaches them (access logs, then
// filter destruction). Calling it again does nothing.
func (s *HTTPStream) Finish(ctx context.Context) {
	s.in.enter()
	defer s.in.leave()
	s.finish(fnOnLog, fnOnDone, fnOnDelete)
}

// NetworkStream is one TCP connection going through the plugin (the L4 callbacks).
type NetworkStream struct {
	streamCore
	down, up       []byte
	downBuf, upBuf bool
}

// NewNetworkStream starts a connection on one of the plugin's instances.
func (p *Plugin) NewNetworkStream(ctx context.Context, opts StreamOptions) (*NetworkStream, error) {
	s := &NetworkStream{}
	if err := p.newStream(&s.streamCore, opts, func(gc *guestContext) { gc.net = s }); err != nil {
		return nil, err
	}
	return s, nil
}

// OnNewConnection calls proxy_on_new_connection.
func (s *NetworkStream) OnNewConnection(ctx context.Context) Result {
	s.in.enter()
	defer s.in.leave()
	res, _ := s.run(fnOnNewConnection, kindConnection, nil, uint64(s.id))
	return res
}

// OnDownstreamData delivers data from the client (proxy_on_downstream_data).
func (s *NetworkStream) OnDownstreamData(ctx context.Context, chunk []byte, endOfStream bool) Result {
	s.in.enter()
	defer s.in.leave()
	return s.data(&s.down, &s.downBuf, fnOnDownstreamData, chunk, endOfStream)
}

// OnUpstreamData delivers data from the server (proxy_on_upstream_data).
func (s *NetworkStream) OnUpstreamData(ctx context.Context, chunk []byte, endOfStream bool) Result {
	s.in.enter()
	defer s.in.leave()
	return s.data(&s.up, &s.upBuf, fnOnUpstreamData, chunk, endOfStream)
}

func (s *NetworkStream) data(buf *[]byte, buffering *bool, cb string, chunk []byte, eos bool) Result {
	if *buffering {
		*buf = append(*buf, chunk...)
	} else {
		*buf = append([]byte(nil), chunk...)
	}
	res, _ := s.run(cb, kindConnection, func() { s.eos = eos }, uint64(s.id), uint64(len(*buf)), b2u(eos))
	if res.Action == Continue {
		res.Body, *buf, *buffering = *buf, nil, false
	} else {
		*buffering = true
	}
	return res
}

// OnDownstreamClose calls proxy_on_downstream_connection_close.
func (s *NetworkStream) OnDownstreamClose(ctx context.Context, peer PeerType) {
	s.in.enter()
	defer s.in.leave()
	s.run(fnOnDownstreamClose, kindConnection, nil, uint64(s.id), uint64(peer))
}

// OnUpstreamClose calls proxy_on_upstream_connection_close.
func (s *NetworkStream) OnUpstreamClose(ctx context.Context, peer PeerType) {
	s.in.enter()
	defer s.in.leave()
	s.run(fnOnUpstreamClose, kindConnection, nil, uint64(s.id), uint64(peer))
}

// Finish ends the connection: proxy_on_done, proxy_on_log, proxy_on_delete (Envoy's
// onCloseTCP order).
func (s *NetworkStream) Finish(ctx context.Context) {
	s.in.enter()
	defer s.in.leave()
	s.finish(fnOnDone, fnOnLog, fnOnDelete)
}

// UpdateInfo changes the connection's StreamInfo.
func (s *NetworkStream) UpdateInfo(f func(*StreamInfo)) {
	s.in.enter()
	defer s.in.leave()
	f(&s.info)
}
