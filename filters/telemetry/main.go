// Command telemetry is the mesh's Mixerless telemetry filter: a proxy-wasm HTTP filter
// that reports Istio's standard metrics with Istio's names, labels and semantics, like
// Istio's telemetry v2 "stats" plugin, and exchanges peer metadata to learn who is on the
// other end. Build it as a reactor with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o telemetry.wasm ./telemetry
//
// Metrics (with the default stat_prefix "istio"):
//
//	istio_requests_total                  counter, 1 per request
//	istio_request_duration_milliseconds   histogram, request.duration in ms
//	istio_request_bytes                   histogram, request.total_size
//	istio_response_bytes                  histogram, response.total_size
//
// and, loaded as a network filter, Istio's TCP metrics (tcp.go).
//
// The filter records values only; histogram buckets are the proxy's (Envoy's default
// buckets 0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, ... 3600000, which is what Istio
// reports unless the bootstrap's histogram_bucket_settings or the pod's
// sidecar.istio.io/statsHistogramBuckets annotation says otherwise).
//
// Each request is reported once by the proxy that handles it, when the stream is done:
// reporter=source on the client side (outbound listener) and reporter=destination on
// the server side (inbound listener), decided per request from the listener_direction
// property (Envoy's TrafficDirection: 1 inbound, 2 outbound) unless the configuration
// fixes it; without either the filter reports as destination, as Istio does.
//
// The labels are Istio's standard labels in Istio's order (statsplan.StandardLabelNames),
// "unknown" where a value is not known; the local side comes from the proxy's node
// metadata (WORKLOAD_NAME, NAMESPACE, CLUSTER_ID, LABELS, ...), the other side from peer
// metadata exchange (peer.go), the rest from host properties and headers (labels.go).
// Tags travel in the metric name for the proxy's stats_tags to extract (tagname.go);
// distinct label sets per metric are capped (registry.go).
//
// What a configuration means is worked out once, at plugin start, by the importable
// package filters/telemetry/statsplan: the configuration is Istio's stats plugin
// configuration (statsplan.Config), its dimension and value expressions are in a subset of
// CEL compiled and evaluated by filters/telemetry/expr, over Envoy's and Istio's
// attributes (statsplan.LookupAttribute), and the resulting statsplan.Plan lists the
// metrics, their tags and the attributes a request must provide. Both packages are pure
// Go, for other filters to use; this package is the request path: it reads what the plan
// asks for from the host (an httpContext is the expressions' expr.Reader), exchanges peer
// metadata and records the metrics.
package main

import (
	"errors"
	"strconv"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasmesh/wasmesh/filters/internal/guestgc"
	"github.com/wasmesh/wasmesh/filters/internal/intern"
	"github.com/wasmesh/wasmesh/filters/telemetry/expr"
	"github.com/wasmesh/wasmesh/filters/telemetry/statsplan"
)

// init registers the VM context: a reactor's host runs _initialize (package
// initialisers), never main.
func init() { proxywasm.SetVMContext(&vmContext{}) }

func main() {}

type vmContext struct {
	types.DefaultVMContext
	// plugin is the latest plugin context, so tests can inspect what it configured.
	plugin *pluginContext
}

func (v *vmContext) NewPluginContext(uint32) types.PluginContext {
	v.plugin = &pluginContext{}
	return v.plugin
}

// Property paths read on every request. Read-only.
var (
	pathListenerDirection = []string{"listener_direction"}
	pathRequestDuration   = []string{"request", "duration"}
	pathRequestTotalSize  = []string{"request", "total_size"}
	pathResponseTotalSize = []string{"response", "total_size"}
	pathResponseCode      = []string{"response", "code"}
	pathResponseFlags     = []string{"response", "flags"}
	pathGRPCStatus        = []string{"response", "grpc_status"}
	pathClusterName       = []string{"cluster_name"}
	pathConnectionMTLS    = []string{"connection", "mtls"}
	// Principals, as Istio reads them: the server side's connection is the downstream
	// one, the client side's is the upstream one.
	pathInboundPeerSAN   = []string{"connection", "uri_san_peer_certificate"}
	pathInboundLocalSAN  = []string{"connection", "uri_san_local_certificate"}
	pathOutboundPeerSAN  = []string{"upstream", "uri_san_peer_certificate"}
	pathOutboundLocalSAN = []string{"upstream", "uri_san_local_certificate"}
)

type pluginContext struct {
	types.DefaultPluginContext

	plan     *statsplan.Plan
	reg      *registry
	peers    *peerCache
	local    *workload
	statuses *[600]string

	// localHeader and localID are this proxy's peer metadata headers, encoded once.
	localHeader, localID string

	// Per-request scratch, reused: the host runs one callback at a time per VM.
	values []string
	mvals  []int64
	mok    []bool

	// strs interns the strings kept from properties (see str) and flags the
	// response_flags texts.
	strs  *intern.Table
	flags map[uint64]string

	// direction is the listener direction read at configuration time, as Istio does;
	// 0 when the host had none then, and it is read per request instead.
	direction int64

	// durationFromHost is set once the host has provided request.duration, after which
	// requests are not timed with the guest's clock.
	durationFromHost bool
	warnedDirection  bool

	// conns are the open TCP connections (tcp.go).
	conns map[*tcpContext]struct{}
}

// Bounds of the per-plugin string caches: past them, values are allocated per request.
const (
	maxInterned  = 1024
	maxFlagTexts = 64
)

func (p *pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil && !errors.Is(err, types.ErrorStatusNotFound) { // not found: no configuration
		proxywasm.LogCriticalf("telemetry: reading plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	if err := p.configure(data); err != nil {
		// Refusing to start is what Envoy does with a bad filter configuration; reporting
		// with a configuration only partly understood would emit wrong data.
		proxywasm.LogCriticalf("telemetry: %v", err)
		return types.OnPluginStartStatusFailed
	}
	if p.plan.Network {
		p.startTCPReporting()
	}
	return types.OnPluginStartStatusOK
}

func (p *pluginContext) configure(data []byte) error {
	pl, err := statsplan.Load(data, readProperty)
	if err != nil {
		return err
	}
	id := readLocalNode()
	p.plan = pl
	p.local = newWorkload(id)
	p.localHeader = encodePeerMetadata(id)
	p.localID = localNodeID(id)
	p.peers = newPeerCache(pl.MaxPeerCache)
	p.statuses = newStatusTable()
	p.values = make([]string, statsplan.NumStandardLabels+len(pl.Dimensions))
	p.mvals = make([]int64, len(pl.Metrics))
	p.mok = make([]bool, len(pl.Metrics))
	p.reg = newRegistry(pl, hostSink{})
	p.strs = intern.New(maxInterned)
	p.flags = map[uint64]string{}
	p.direction, _ = p.intProperty(pathListenerDirection)
	p.conns = map[*tcpContext]struct{}{}
	return nil
}

// Properties are read into the guest's memory by the host; values are decoded from there,
// and the strings that labels keep are interned: a service, a principal or a status code is
// the same string from one request to the next.

func (p *pluginContext) intProperty(path []string) (int64, bool) {
	b, ok := readProperty(path)
	if !ok {
		return 0, false
	}
	v, ok := statsplan.DecodeProperty(expr.Int, b)
	return v.Int, ok
}

// stringProperty returns a string property, "unknown" when absent or empty.
func (p *pluginContext) stringProperty(path []string) string {
	b, ok := readProperty(path)
	if !ok || len(b) == 0 {
		return unknown
	}
	return p.str(b)
}

// headerMap is the SDK's calls on one direction's headers.
type headerMap struct {
	get     func(name string) (string, error)
	replace func(name, value string) error
	remove  func(name string) error
}

var (
	requestHeaders  = headerMap{proxywasm.GetHttpRequestHeader, proxywasm.ReplaceHttpRequestHeader, proxywasm.RemoveHttpRequestHeader}
	responseHeaders = headerMap{proxywasm.GetHttpResponseHeader, proxywasm.ReplaceHttpResponseHeader, proxywasm.RemoveHttpResponseHeader}
)

// read reads a header, "" when absent.
func (m headerMap) read(name string) string {
	v, _ := m.get(name)
	return v
}

// str returns b as a string, the same one every time while the table has room.
func (p *pluginContext) str(b []byte) string { return p.strs.String(b) }

// flagsText is responseFlags with its texts kept.
func (p *pluginContext) flagsText(bits uint64) string {
	if s, ok := p.flags[bits]; ok {
		return s
	}
	s := responseFlags(bits)
	if len(p.flags) < maxFlagTexts {
		p.flags[bits] = s
	}
	return s
}

// readProperty reads a property; ok is false when the host has none.
func readProperty(path []string) ([]byte, bool) {
	b, err := proxywasm.GetProperty(path)
	return b, err == nil
}

// readLocalNode reads this proxy's identity from its node metadata.
func readLocalNode() nodeIdentity {
	var id nodeIdentity
	for _, key := range scalarMetadataKeys {
		if b, ok := readProperty([]string{"node", "metadata", key}); ok {
			*id.scalar(key) = string(b)
		}
	}
	if pairs, err := proxywasm.GetPropertyMap([]string{"node", "metadata", metaLabels}); err == nil && len(pairs) > 0 {
		id.Labels = make(map[string]string, len(pairs))
		for _, kv := range pairs {
			id.Labels[kv[0]] = kv[1]
		}
	}
	return id
}

// localNodeID is the x-envoy-peer-metadata-id this proxy sends: its node id, which Istio
// peers require next to the metadata, or a stand-in when the host has none.
func localNodeID(id nodeIdentity) string {
	if b, ok := readProperty([]string{"node", "id"}); ok && len(b) > 0 {
		return string(b)
	}
	return "sidecar~~" + id.Name + "." + id.Namespace + "~" + id.Namespace + ".svc.cluster.local"
}

// outbound says whether this request is on the client side.
func (p *pluginContext) outbound() bool {
	switch p.plan.Reporter {
	case statsplan.ReporterSource:
		return true
	case statsplan.ReporterDestination:
		return false
	}
	dir := p.direction
	if dir == 0 {
		dir, _ = p.intProperty(pathListenerDirection)
	}
	switch dir {
	case 1:
		return false
	case 2:
		return true
	}
	if !p.warnedDirection {
		p.warnedDirection = true
		proxywasm.LogWarn(`telemetry: listener_direction is not set; reporting as destination, as Istio does (set "reporter" to choose)`)
	}
	return false
}

func (p *pluginContext) NewHttpContext(uint32) types.HttpContext {
	if p.plan.Network {
		return nil // a network filter's streams are TCP connections (NewTcpContext)
	}
	h := &httpContext{p: p}
	if n := len(p.plan.Attributes); n > 0 {
		h.slots = make([]slotState, n)
	}
	return h
}

type slotState struct {
	v        expr.Value
	ok, done bool
}

type httpContext struct {
	types.DefaultHttpContext
	p *pluginContext

	outbound bool
	start    time.Time
	grpc     bool

	// Captured in the header callbacks.
	grpcStatus string
	// status is the response's :status, read the first time it is needed (responseStatus).
	status     string
	statusRead bool
	// peer is the other side's workload from its x-envoy-peer-metadata; nil when it sent
	// none or something that does not decode.
	peer *workload

	// Body bytes seen, the size fallback when the host has no total_size.
	reqBody, respBody int64

	slots []slotState
}

func (h *httpContext) OnHttpRequestHeaders(int, bool) types.Action {
	p := h.p
	h.outbound = p.outbound()
	if !p.durationFromHost {
		h.start = time.Now()
	}
	h.grpc = isGRPC(requestHeaders.read("content-type"))
	h.capture(p.plan.RequestHeaderSlots, requestHeaders.get)
	h.exchangePeer(requestHeaders, h.outbound)
	return types.ActionContinue
}

// exchangePeer is the peer-metadata exchange on one direction's headers: the side that
// sends them (the client on the request, the server on the response) puts this proxy's
// identity in, replacing whatever the application put there; the other takes the peer's
// identity out and keeps it from the application.
func (h *httpContext) exchangePeer(m headerMap, sending bool) {
	if sending {
		logIfErr(m.replace(headerPeerMetadata, h.p.localHeader))
		logIfErr(m.replace(headerPeerID, h.p.localID))
		return
	}
	if b, err := m.get(headerPeerMetadata); err == nil {
		h.setPeer(b)
		logIfErr(m.remove(headerPeerMetadata))
	}
	logIfErr(m.remove(headerPeerID))
}

func (h *httpContext) OnHttpRequestBody(size int, _ bool) types.Action {
	h.reqBody += int64(size)
	return types.ActionContinue
}

func (h *httpContext) OnHttpResponseHeaders(int, bool) types.Action {
	p := h.p
	if h.grpc {
		h.grpcStatus = responseHeaders.read("grpc-status")
	}
	h.capture(p.plan.ResponseHeaderSlots, responseHeaders.get)
	h.exchangePeer(responseHeaders, !h.outbound)
	return types.ActionContinue
}

func (h *httpContext) OnHttpResponseBody(size int, _ bool) types.Action {
	h.respBody += int64(size)
	return types.ActionContinue
}

func (h *httpContext) OnHttpResponseTrailers(int) types.Action {
	// gRPC puts its status in the trailers unless the response has no body.
	if h.grpc && h.grpcStatus == "" {
		h.grpcStatus, _ = proxywasm.GetHttpResponseTrailer("grpc-status")
	}
	h.capture(h.p.plan.ResponseTrailerSlots, proxywasm.GetHttpResponseTrailer)
	return types.ActionContinue
}

// OnHttpStreamDone reports the request, then lets the collector keep the heap small
// (guestgc).
func (h *httpContext) OnHttpStreamDone() {
	h.p.report(h)
	guestgc.StreamDone()
}

func logIfErr(err error) {
	if err != nil {
		proxywasm.LogErrorf("telemetry: %v", err)
	}
}

// capture stores the header values that expression attributes read.
func (h *httpContext) capture(slots []int, get func(string) (string, error)) {
	for _, s := range slots {
		a := h.p.plan.Attributes[s]
		st := &h.slots[s]
		st.done = true
		if v, err := get(a.Header); err == nil {
			st.v, st.ok = expr.Value{Str: a.Part.Cut(v)}, true
		}
	}
}

// Attr reads an expression attribute for this request, once: httpContext is the
// expr.Reader the plan's expressions are evaluated with.
func (h *httpContext) Attr(slot int) (expr.Value, bool) {
	st := &h.slots[slot]
	if st.done {
		return st.v, st.ok
	}
	a := h.p.plan.Attributes[slot]
	var v expr.Value
	var ok bool
	switch a.Source {
	case statsplan.SourceProperty:
		if b, found := readProperty(a.Path); found {
			v, ok = statsplan.DecodeProperty(a.Type, b)
		}
		if !ok {
			var s string
			switch a.Fallback {
			case statsplan.FallbackStatus:
				s = h.responseStatus()
			case statsplan.FallbackGRPCStatus:
				s = h.grpcStatus
			}
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				v, ok = expr.Value{Int: n}, true
			}
		}
	case statsplan.SourcePeer:
		// upstream_peer is the server, known on the client side; downstream_peer the
		// client, known on the server side.
		if w := h.peerWorkload(); w != nil && a.Upstream == h.outbound {
			if a.PeerLabel != "" {
				v.Str, ok = w.id.Labels[a.PeerLabel]
			} else {
				v.Str, ok = w.field(a.PeerField)
			}
		}
	case statsplan.SourceConstant:
		v, ok = a.Const, a.ConstOK
	}
	// Header attributes not captured (trailers that never came) stay missing.
	st.v, st.ok, st.done = v, ok, true
	return v, ok
}

// setPeer decodes the other side's metadata header (through the plugin's cache).
func (h *httpContext) setPeer(header string) {
	w, err := h.p.peers.get(header)
	if err != nil {
		proxywasm.LogDebugf("telemetry: ignoring peer metadata: %v", err)
	}
	h.peer = w
}

// :status and :authority are fallbacks (for hosts without response.code, and for clusters
// that name no service), so they are read only when needed, which is in the log phase:
// Envoy keeps a stream's headers readable there, for its access log.

// responseStatus is the response's :status, "" when there was none.
func (h *httpContext) responseStatus() string {
	if !h.statusRead {
		h.status, h.statusRead = responseHeaders.read(":status"), true
	}
	return h.status
}

// authority is the request's :authority.
func (h *httpContext) authority() string { return requestHeaders.read(":authority") }

// peerWorkload is the other side's workload, nil if unknown.
func (h *httpContext) peerWorkload() *workload { return h.peer }

// report records the finished request.
func (p *pluginContext) report(h *httpContext) {
	pl := p.plan
	used := &pl.UsedLabels
	vals := p.values
	p.setSideLabels(vals, h.outbound, h.peerWorkload(), h.authority)

	vals[statsplan.LabelRequestProtocol] = protocolHTTP
	if h.grpc {
		vals[statsplan.LabelRequestProtocol] = protocolGRPC
	}

	if used[statsplan.LabelResponseCode] {
		code, ok := p.intProperty(pathResponseCode)
		if !ok {
			code, _ = strconv.ParseInt(h.responseStatus(), 10, 64) // 0 when the stream never got a response, as Istio
		}
		vals[statsplan.LabelResponseCode] = statusText(code, p.statuses)
	}

	if used[statsplan.LabelGrpcResponseStatus] {
		vals[statsplan.LabelGrpcResponseStatus] = "" // Istio leaves it empty for plain HTTP
		if h.grpc {
			if n, ok := p.intProperty(pathGRPCStatus); ok {
				vals[statsplan.LabelGrpcResponseStatus] = statusText(n, p.statuses)
			} else if h.grpcStatus != "" {
				vals[statsplan.LabelGrpcResponseStatus] = h.grpcStatus
			} else {
				vals[statsplan.LabelGrpcResponseStatus] = grpcStatusNoInfo
			}
		}
	}
	p.setDimensions(vals, h)

	var durMs int64
	var durOK bool
	if pl.NeedDuration {
		durMs, durOK = p.durationMs(h)
	}
	for i := range pl.Metrics {
		m := &pl.Metrics[i]
		var v int64
		ok := true
		switch m.Value {
		case statsplan.ValueOne:
			v = 1
		case statsplan.ValueDurationMs:
			v, ok = durMs, durOK
		case statsplan.ValueRequestBytes:
			if v, ok = p.intProperty(pathRequestTotalSize); !ok {
				v, ok = h.reqBody, true
			}
		case statsplan.ValueResponseBytes:
			if v, ok = p.intProperty(pathResponseTotalSize); !ok {
				v, ok = h.respBody, true
			}
		case statsplan.ValueExpr:
			var r expr.Value
			r, ok = m.ValueExpr.Eval(h)
			v = r.Int
		}
		p.mvals[i], p.mok[i] = v, ok
	}
	p.reg.report(vals, p.mvals, p.mok, false)
}

// setSideLabels sets the labels an HTTP request and a TCP connection take the same way:
// the reporter, both sides' workloads (this proxy's from its node, the other's from peer
// metadata, nil when unknown) and principals, the destination service (from the cluster,
// else the authority, nil for a connection), the response flags and the connection
// security policy.
func (p *pluginContext) setSideLabels(vals []string, outbound bool, peer *workload, authority func() string) {
	pl := p.plan
	used := &pl.UsedLabels
	if outbound {
		vals[statsplan.LabelReporter] = statsplan.ReporterSource
		setWorkloadLabels(vals, true, p.local)
		setWorkloadLabels(vals, false, peer)
	} else {
		vals[statsplan.LabelReporter] = statsplan.ReporterDestination
		setWorkloadLabels(vals, true, peer)
		setWorkloadLabels(vals, false, p.local)
	}

	if used[statsplan.LabelSourcePrincipal] || used[statsplan.LabelDestinationPrincipal] {
		srcPath, dstPath := pathInboundPeerSAN, pathInboundLocalSAN
		if outbound {
			srcPath, dstPath = pathOutboundLocalSAN, pathOutboundPeerSAN
		}
		vals[statsplan.LabelSourcePrincipal] = p.stringProperty(srcPath)
		vals[statsplan.LabelDestinationPrincipal] = p.stringProperty(dstPath)
	}

	if used[statsplan.LabelDestinationService] || used[statsplan.LabelDestinationServiceName] || used[statsplan.LabelDestinationServiceNamespace] {
		var cluster string
		if b, ok := readProperty(pathClusterName); ok {
			cluster = p.str(b)
		}
		svc, name, ns := destinationService(cluster, authority, pl.UseHostHeader)
		if ns == "" {
			ns = vals[statsplan.LabelDestinationWorkloadNamespace]
		}
		vals[statsplan.LabelDestinationService], vals[statsplan.LabelDestinationServiceName], vals[statsplan.LabelDestinationServiceNamespace] = svc, name, ns
	}

	if used[statsplan.LabelResponseFlags] {
		flags, _ := p.intProperty(pathResponseFlags)
		vals[statsplan.LabelResponseFlags] = p.flagsText(uint64(flags))
	}

	if used[statsplan.LabelConnectionSecurityPolicy] {
		vals[statsplan.LabelConnectionSecurityPolicy] = unknown // Istio: the client side cannot know
		if !outbound {
			if b, ok := readProperty(pathConnectionMTLS); ok && len(b) == 1 {
				vals[statsplan.LabelConnectionSecurityPolicy] = policyNone
				if b[0] != 0 {
					vals[statsplan.LabelConnectionSecurityPolicy] = policyMutualTLS
				}
			}
		}
	}
}

// setDimensions evaluates the configured dimensions with r.
func (p *pluginContext) setDimensions(vals []string, r expr.Reader) {
	for i, d := range p.plan.Dimensions {
		v, ok := d.Eval(r)
		if ok {
			vals[statsplan.NumStandardLabels+i] = expr.Format(d.Type(), v)
		} else {
			vals[statsplan.NumStandardLabels+i] = unknown // as Istio reports a failed dimension
		}
	}
}

// durationMs is the request's duration: Envoy's request.duration, else the time since
// the request headers on the guest's clock.
func (p *pluginContext) durationMs(h *httpContext) (int64, bool) {
	if ns, ok := p.intProperty(pathRequestDuration); ok {
		p.durationFromHost = true
		return ns / int64(time.Millisecond), true
	}
	if h.start.IsZero() {
		return 0, false
	}
	return time.Since(h.start).Milliseconds(), true
}

// hostSink is the metric API of the proxy-wasm host.
type hostSink struct{}

func (hostSink) define(kind statsplan.Kind, name string) uint32 {
	switch kind {
	case statsplan.Gauge:
		return uint32(proxywasm.DefineGaugeMetric(name))
	case statsplan.Histogram:
		return uint32(proxywasm.DefineHistogramMetric(name))
	}
	return uint32(proxywasm.DefineCounterMetric(name))
}

func (hostSink) record(kind statsplan.Kind, id uint32, v int64) {
	switch kind {
	case statsplan.Counter:
		if v > 0 {
			proxywasm.MetricCounter(id).Increment(uint64(v))
		}
	case statsplan.Gauge:
		// The SDK has no gauge set; Istio's recordMetric sets gauges.
		g := proxywasm.MetricGauge(id)
		if d := v - g.Value(); d != 0 {
			g.Add(d)
		}
	case statsplan.Histogram:
		if v >= 0 {
			proxywasm.MetricHistogram(id).Record(uint64(v))
		}
	}
}
