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
// The labels are Istio's standard labels in Istio's order (see labels.go), "unknown"
// where a value is not known; the local side comes from the proxy's node metadata
// (WORKLOAD_NAME, NAMESPACE, CLUSTER_ID, LABELS, ...), the other side from peer metadata
// exchange (peer.go). Tags travel in the metric name for the proxy's stats_tags to
// extract (tagname.go); distinct label sets per metric are capped (registry.go). The
// configuration is Istio's stats plugin configuration (config.go), with CEL-subset
// expressions (expr.go) over Envoy's attributes (attrs.go).
package main

import (
	"errors"
	"strconv"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	_ "github.com/wasmesh/wasmesh/filters/internal/guestgc" // the collector's target in wasip1 builds
	"github.com/wasmesh/wasmesh/filters/internal/intern"
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

	plan     *plan
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
	return types.OnPluginStartStatusOK
}

func (p *pluginContext) configure(data []byte) error {
	pl, err := loadPlan(data, readProperty)
	if err != nil {
		return err
	}
	id := readLocalNode()
	p.plan = pl
	p.local = newWorkload(id)
	p.localHeader = encodePeerMetadata(id)
	p.localID = localNodeID(id)
	p.peers = newPeerCache(pl.maxPeerCache)
	p.statuses = newStatusTable()
	p.values = make([]string, numStandardLabels+len(pl.dims))
	p.mvals = make([]int64, len(pl.metrics))
	p.mok = make([]bool, len(pl.metrics))
	p.reg = newRegistry(pl, hostSink{})
	p.strs = intern.New(maxInterned)
	p.flags = map[uint64]string{}
	p.direction, _ = p.intProperty(pathListenerDirection)
	return nil
}

// Properties are read into the guest's memory by the host; values are decoded from there,
// and the strings that labels keep are interned: a service, a principal or a status code is
// the same string from one request to the next.

// property reads a property.
func (p *pluginContext) property(path []string) ([]byte, bool) {
	b, err := proxywasm.GetProperty(path)
	return b, err == nil
}

func (p *pluginContext) intProperty(path []string) (int64, bool) {
	b, ok := p.property(path)
	if !ok {
		return 0, false
	}
	v, ok := decodeProperty(typeInt, b)
	return v.i, ok
}

// stringProperty returns a string property, "unknown" when absent or empty.
func (p *pluginContext) stringProperty(path []string) string {
	b, ok := p.property(path)
	if !ok || len(b) == 0 {
		return unknown
	}
	return p.str(b)
}

// readHeader reads a request or response header.
func readHeader(response bool, name string) (string, bool) {
	get := proxywasm.GetHttpRequestHeader
	if response {
		get = proxywasm.GetHttpResponseHeader
	}
	v, err := get(name)
	return v, err == nil
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
	switch p.plan.reporter {
	case reporterSource:
		return true
	case reporterDest:
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
	h := &httpContext{p: p}
	if n := len(p.plan.attrs); n > 0 {
		h.slots = make([]slotState, n)
	}
	return h
}

type slotState struct {
	v        value
	ok, done bool
}

type httpContext struct {
	types.DefaultHttpContext
	p *pluginContext

	outbound bool
	start    time.Time
	grpc     bool

	// Captured in the header callbacks.
	authority  string
	status     string
	grpcStatus string
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
	if u := &p.plan.usedLabels; u[lblDestinationService] || u[lblDestinationServiceName] || u[lblDestinationServiceNamespace] {
		h.authority, _ = readHeader(false, ":authority")
	}
	ct, _ := readHeader(false, "content-type")
	h.grpc = isGRPC(ct)
	h.capture(p.plan.requestHeaderSlots, proxywasm.GetHttpRequestHeader)

	if h.outbound {
		// Replacing also discards whatever the application put in these headers.
		logIfErr(proxywasm.ReplaceHttpRequestHeader(headerPeerMetadata, p.localHeader))
		logIfErr(proxywasm.ReplaceHttpRequestHeader(headerPeerID, p.localID))
		return types.ActionContinue
	}
	// Server side: take the client's identity and keep it from the application.
	if b, ok := readHeader(false, headerPeerMetadata); ok {
		h.setPeer(b)
		logIfErr(proxywasm.RemoveHttpRequestHeader(headerPeerMetadata))
	}
	logIfErr(proxywasm.RemoveHttpRequestHeader(headerPeerID))
	return types.ActionContinue
}

func (h *httpContext) OnHttpRequestBody(size int, _ bool) types.Action {
	h.reqBody += int64(size)
	return types.ActionContinue
}

func (h *httpContext) OnHttpResponseHeaders(int, bool) types.Action {
	p := h.p
	h.status, _ = readHeader(true, ":status")
	if h.grpc {
		h.grpcStatus, _ = readHeader(true, "grpc-status")
	}
	h.capture(p.plan.responseHeaderSlots, proxywasm.GetHttpResponseHeader)

	if !h.outbound {
		logIfErr(proxywasm.ReplaceHttpResponseHeader(headerPeerMetadata, p.localHeader))
		logIfErr(proxywasm.ReplaceHttpResponseHeader(headerPeerID, p.localID))
		return types.ActionContinue
	}
	// Client side: take the server's identity and keep it from the application.
	if b, ok := readHeader(true, headerPeerMetadata); ok {
		h.setPeer(b)
		logIfErr(proxywasm.RemoveHttpResponseHeader(headerPeerMetadata))
	}
	logIfErr(proxywasm.RemoveHttpResponseHeader(headerPeerID))
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
	h.capture(h.p.plan.responseTrailerSlots, proxywasm.GetHttpResponseTrailer)
	return types.ActionContinue
}

func (h *httpContext) OnHttpStreamDone() { h.p.report(h) }

func logIfErr(err error) {
	if err != nil {
		proxywasm.LogErrorf("telemetry: %v", err)
	}
}

// capture stores the header values that expression attributes read.
func (h *httpContext) capture(slots []int, get func(string) (string, error)) {
	for _, s := range slots {
		a := h.p.plan.attrs[s]
		st := &h.slots[s]
		st.done = true
		if v, err := get(a.header); err == nil {
			st.v, st.ok = value{s: applyPathPart(a.part, v)}, true
		}
	}
}

// attr reads an expression attribute for this request, once.
func (h *httpContext) attr(slot int) (value, bool) {
	st := &h.slots[slot]
	if st.done {
		return st.v, st.ok
	}
	a := h.p.plan.attrs[slot]
	var v value
	var ok bool
	switch a.src {
	case srcProperty:
		if b, found := h.p.property(a.path); found {
			v, ok = decodeProperty(a.typ, b)
		}
		if !ok {
			var s string
			switch a.fallback {
			case fallbackStatus:
				s = h.status
			case fallbackGRPCStatus:
				s = h.grpcStatus
			}
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				v, ok = value{i: n}, true
			}
		}
	case srcPeer:
		// upstream_peer is the server, known on the client side; downstream_peer the
		// client, known on the server side.
		if w := h.peerWorkload(); w != nil && a.upstream == h.outbound {
			if a.label != "" {
				v.s, ok = w.id.Labels[a.label]
			} else {
				v.s, ok = w.field(a.field)
			}
		}
	case srcConst:
		v, ok = a.constVal, a.constOK
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

// peerWorkload is the other side's workload, nil if unknown.
func (h *httpContext) peerWorkload() *workload { return h.peer }

// report records the finished request.
func (p *pluginContext) report(h *httpContext) {
	pl := p.plan
	used := &pl.usedLabels
	vals := p.values
	peer := h.peerWorkload()

	if h.outbound {
		vals[lblReporter] = reporterSource
		setWorkloadLabels(vals, true, p.local)
		setWorkloadLabels(vals, false, peer)
	} else {
		vals[lblReporter] = reporterDest
		setWorkloadLabels(vals, true, peer)
		setWorkloadLabels(vals, false, p.local)
	}

	if used[lblSourcePrincipal] || used[lblDestinationPrincipal] {
		srcPath, dstPath := pathInboundPeerSAN, pathInboundLocalSAN
		if h.outbound {
			srcPath, dstPath = pathOutboundLocalSAN, pathOutboundPeerSAN
		}
		vals[lblSourcePrincipal] = p.stringProperty(srcPath)
		vals[lblDestinationPrincipal] = p.stringProperty(dstPath)
	}

	if used[lblDestinationService] || used[lblDestinationServiceName] || used[lblDestinationServiceNamespace] {
		var cluster string
		if b, ok := p.property(pathClusterName); ok {
			cluster = p.str(b)
		}
		svc, name, ns := destinationService(cluster, h.authority, pl.useHostHeader)
		if ns == "" {
			ns = vals[lblDestinationWorkloadNamespace]
		}
		vals[lblDestinationService], vals[lblDestinationServiceName], vals[lblDestinationServiceNamespace] = svc, name, ns
	}

	vals[lblRequestProtocol] = protocolHTTP
	if h.grpc {
		vals[lblRequestProtocol] = protocolGRPC
	}

	if used[lblResponseCode] {
		code, ok := p.intProperty(pathResponseCode)
		if !ok {
			code, _ = strconv.ParseInt(h.status, 10, 64) // 0 when the stream never got a response, as Istio
		}
		vals[lblResponseCode] = statusText(code, p.statuses)
	}

	if used[lblGrpcResponseStatus] {
		vals[lblGrpcResponseStatus] = "" // Istio leaves it empty for plain HTTP
		if h.grpc {
			if n, ok := p.intProperty(pathGRPCStatus); ok {
				vals[lblGrpcResponseStatus] = statusText(n, p.statuses)
			} else if h.grpcStatus != "" {
				vals[lblGrpcResponseStatus] = h.grpcStatus
			} else {
				vals[lblGrpcResponseStatus] = grpcStatusNoInfo
			}
		}
	}

	if used[lblResponseFlags] {
		flags, _ := p.intProperty(pathResponseFlags)
		vals[lblResponseFlags] = p.flagsText(uint64(flags))
	}

	if used[lblConnectionSecurityPolicy] {
		vals[lblConnectionSecurityPolicy] = unknown // Istio: the client side cannot know
		if !h.outbound {
			if b, ok := p.property(pathConnectionMTLS); ok && len(b) == 1 {
				vals[lblConnectionSecurityPolicy] = policyNone
				if b[0] != 0 {
					vals[lblConnectionSecurityPolicy] = policyMutualTLS
				}
			}
		}
	}

	for i, d := range pl.dims {
		v, ok := d.expr.eval(h)
		if ok {
			vals[numStandardLabels+i] = format(d.expr.typ(), v)
		} else {
			vals[numStandardLabels+i] = unknown // as Istio reports a failed dimension
		}
	}

	var durMs int64
	var durOK bool
	if pl.needDuration {
		durMs, durOK = p.durationMs(h)
	}
	for i := range pl.metrics {
		m := &pl.metrics[i]
		var v int64
		ok := true
		switch m.value {
		case valueOne:
			v = 1
		case valueDurationMs:
			v, ok = durMs, durOK
		case valueRequestBytes:
			if v, ok = p.intProperty(pathRequestTotalSize); !ok {
				v, ok = h.reqBody, true
			}
		case valueResponseBytes:
			if v, ok = p.intProperty(pathResponseTotalSize); !ok {
				v, ok = h.respBody, true
			}
		case valueExpr:
			var r value
			r, ok = m.valueExpr.eval(h)
			v = r.i
		}
		p.mvals[i], p.mok[i] = v, ok
	}
	p.reg.report(vals, p.mvals, p.mok)
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

func (hostSink) define(kind metricKind, name string) uint32 {
	switch kind {
	case kindGauge:
		return uint32(proxywasm.DefineGaugeMetric(name))
	case kindHistogram:
		return uint32(proxywasm.DefineHistogramMetric(name))
	}
	return uint32(proxywasm.DefineCounterMetric(name))
}

func (hostSink) record(kind metricKind, id uint32, v int64) {
	switch kind {
	case kindCounter:
		if v > 0 {
			proxywasm.MetricCounter(id).Increment(uint64(v))
		}
	case kindGauge:
		// The SDK has no gauge set; Istio's recordMetric sets gauges.
		g := proxywasm.MetricGauge(id)
		if d := v - g.Value(); d != 0 {
			g.Add(d)
		}
	case kindHistogram:
		if v >= 0 {
			proxywasm.MetricHistogram(id).Record(uint64(v))
		}
	}
}
