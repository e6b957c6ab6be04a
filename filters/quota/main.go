// Command quota is the mesh's rate limit: a proxy-wasm HTTP filter that charges each
// request against token buckets (Envoy's local rate limit) or fixed and rolling windows
// (Istio's memquota), one bucket per descriptor value, shared by every VM of the proxy
// through shared data, and answers 429 when one runs dry; descriptors in the global mode
// are decided by a rate-limit service shared by every proxy (Envoy's global rate limit,
// Istio's redisquota), asked over gRPC. Build it as a reactor with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o quota.wasm ./quota
//
// # Configuration
//
// The plugin configuration is JSON; unknown fields and invalid values fail the plugin at
// start, with the field's path in the log:
//
//	{
//	  "name": "ingress",
//	  "shadow": false,
//	  "rate_limit_headers": true,
//	  "cas_retries": 5,
//	  "tick_period": "1s",
//	  "descriptors": [
//	    {
//	      "name": "per_user",
//	      "entries": [
//	        {"key": "user", "source": "header", "header": "x-user-id"},
//	        {"key": "api", "source": "path_prefix", "prefixes": ["/api/v1/", "/api/"]}
//	      ],
//	      "token_bucket": {"max_tokens": 100, "tokens_per_fill": 10, "fill_interval": "1s"},
//	      "overrides": [
//	        {"match": {"user": "batch"}, "token_bucket": {"max_tokens": 1000, "tokens_per_fill": 100, "fill_interval": "1s"}},
//	        {"match": {"user": "canary"}, "shadow": true}
//	      ]
//	    },
//	    {
//	      "name": "per_source",
//	      "entries": [{"key": "source", "source": "source_principal", "default": "unknown"}],
//	      "quota": {"max_amount": 600, "valid_duration": "60s", "rolling_window": true, "bucket_duration": "6s"}
//	    },
//	    {
//	      "name": "global",
//	      "quota": {"max_amount": 10000, "valid_duration": "1s"}
//	    }
//	  ]
//	}
//
// Top level:
//
//   - name: scopes the shared-data keys (letters, digits, '_', '-', '.'); default the
//     plugin_name property, else "default". Plugins with the same scope and descriptor
//     names share buckets.
//   - shadow: the default for every descriptor: count and add headers, never reject.
//   - rate_limit_headers: x-ratelimit-limit, -remaining and -reset on allowed responses
//     (default false, as Envoy's enable_x_ratelimit_headers). 429s and shadow denials
//     always carry them.
//   - cas_retries: compare-and-swap retries before failing open (default 5, 0..100).
//   - tick_period: how often OnTick writes refills to shared data; default the shortest
//     fill interval, window or slot, within 100ms..1m. Decisions never wait for it.
//   - rate_limit_service: where descriptors in mode "global" or "both" are decided (see
//     Global mode); required with them, an error without them.
//   - descriptors: required, at most 64, evaluated in order.
//
// A descriptor (Envoy's descriptor, memquota's quota):
//
//   - name: required, unique; the metric tag and part of the key.
//   - mode: "local" (default), "global" or "both" (see Global mode).
//   - entries: up to 16 key/value pairs taken from the request; each distinct value
//     tuple has its own bucket. No entries: one bucket for all requests. An entry whose
//     value is absent makes the descriptor not apply to the request, unless it has a
//     "default" value. Sources: "header" (with "header": a lower-case name), "path_prefix"
//     (with "prefixes": the longest prefix of :path that matches; none matching is
//     absent), "method", "authority" (:authority as sent), "destination_service"
//     (:authority without the port), "source_principal" (property
//     connection.uri_san_peer_certificate, the SPIFFE identity under mTLS),
//     "source_workload" (property downstream_peer.workload, Istio's peer metadata, where
//     the host publishes it), "property" (with "path": any property), "generic_key"
//     (with "value": always that value, Envoy's generic_key action). Istio's older
//     peer metadata header is a "header" source: x-envoy-peer-metadata-id.
//   - exactly one of token_bucket {max_tokens (required, 0 denies everything),
//     tokens_per_fill (default 1), fill_interval (required)} and quota {max_amount
//     (required), valid_duration (required), rolling_window (default false: fixed
//     windows aligned to the Unix epoch), bucket_duration (rolling only; the slot, default
//     valid_duration/10, at most 64 slots)}. Durations are Go durations ("1s", "250ms").
//   - shadow: overrides the top-level shadow.
//   - overrides: the first whose "match" (entry key → exact value) holds gives the
//     bucket its own token_bucket or quota and/or shadow (memquota's overrides).
//
// # Decisions
//
// Every descriptor that applies is charged one unit, in order, until one denies: an
// enforced denial answers 429 (content-type text/plain, x-ratelimit-limit,
// x-ratelimit-remaining, x-ratelimit-reset and retry-after, both in seconds rounded up)
// and charges no later descriptor; a shadow denial is counted and the request goes on.
// Buckets charged before a denial keep the charge (as Envoy's do). Headers on a
// forwarded response describe the binding descriptor: a shadow denial if any, else the
// one with the fewest remaining. They replace upstream headers of the same names.
//
// # Shared data
//
// A bucket is the shared-data key
//
//	wasmesh.quota/<scope>/<descriptor>/<len>:<value>/<len>:<value>...
//
// (values longer than 64 bytes as #<FNV-64a hex>), holding the encoding documented in
// filters/internal/ratelimit: a tag byte, then tokens and last fill time, a window's use
// and start, or a rolling window's slots. A request reads the value and its CAS, computes
// and writes it back with the CAS, retrying cas_retries times when another VM wrote in
// between, then fails open. OnTick writes the refills of the buckets this VM has used.
//
// # Metrics
//
// Tags are encoded in the name the way Istio's stats filter does, for the proxy's
// stats_tags to extract (tag=.=value;.; before the name):
//
//	descriptor=.=<name>;.;decision=.=<allowed|denied|shadow_denied>;.;wasmesh_quota_requests_total
//	descriptor=.=<name>;.;reason=.=<cas_exhausted|store_error>;.;wasmesh_quota_fail_open_total
//
// A request allowed by failing open counts in both. The global mode adds
//
//	descriptor=.=<name>;.;decision=.=<allowed|denied|shadow_denied>;.;wasmesh_quota_global_requests_total
//	decision=.=<ok|over_limit|error>;.;wasmesh_quota_global_calls_total
//	reason=.=<timeout|unavailable|grpc_error|bad_response|call_failed>;.;wasmesh_quota_global_errors_total
//	wasmesh_quota_global_failure_mode_allowed_total
//	wasmesh_quota_global_cancelled_total
//
// per descriptor as the service answered for it, per call (Envoy's ratelimit.ok,
// over_limit, error and failure_mode_allowed), errors by cause, and calls cancelled because
// the stream ended first.
//
// # Global mode
//
// A descriptor in mode "global" is not counted here: its entries, built as in the local
// mode, go to the rate-limit service, which holds its limit (the service's configuration
// matches them by key and value; the descriptor's name is only the metric tag here). In
// mode "both" the descriptor's local bucket is charged first, as Envoy pairs its local and
// global rate limits: a request it denies gets its 429 at once and the service is not
// asked; one it allows goes on to the service. Every global descriptor that applies to a
// request goes in one RateLimitRequest (domain, descriptors, hits_addend 1) to
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit with proxy_grpc_call, and
// the request waits for the answer. The call's target is a serialized GrpcService
// {envoy_grpc: {cluster_name, authority}}, the form Envoy parses first:
//
//	{
//	  "rate_limit_service": {
//	    "cluster": "outbound|8081||ratelimit.wasmesh-system.svc.cluster.local",
//	    "domain": "mesh",
//	    "timeout": "20ms",
//	    "failure_mode_deny": false,
//	    "status_on_error": 500,
//	    "request_type": "both"
//	  },
//	  "descriptors": [
//	    {"name": "front", "mode": "global",
//	     "entries": [{"key": "generic_key", "source": "generic_key", "value": "front"}]},
//	    {"name": "per_user", "mode": "both",
//	     "entries": [{"key": "user", "source": "header", "header": "x-user-id"}],
//	     "token_bucket": {"max_tokens": 20, "tokens_per_fill": 20, "fill_interval": "1s"}}
//	  ]
//	}
//
// rate_limit_service takes the fields of Envoy's envoy.filters.http.ratelimit that apply
// to a filter with its own descriptors (its "stage" picks route rate_limits actions, which
// this filter does not read): cluster (required; the Envoy cluster of the service, HTTP/2),
// authority (the :authority of the calls; default the cluster name, as Envoy's envoy_grpc),
// domain (required), timeout (default 20ms, whole milliseconds; "0s" waits as long as the
// stream does), failure_mode_deny (default false), status_on_error (default 500, the
// status of a request denied because the service failed), request_type ("internal",
// "external" or "both", the default: which requests ask the service, by
// x-envoy-internal: true).
//
// A mode "global" descriptor needs at least one entry and takes no token_bucket or
// quota; its overrides may only set shadow. The answer decides as Envoy's filter does:
//
//   - OVER_LIMIT: the descriptors whose status is OVER_LIMIT (all of them if none is) are
//     denied. Unless all of those are shadow, the request gets the local mode's 429, its
//     x-ratelimit-limit and -remaining from the first denying descriptor's status
//     (current_limit.requests_per_unit, limit_remaining) and x-ratelimit-reset and
//     retry-after from the longest duration_until_reset among them, at least 1s, as
//     Envoy's retry-after; plus the answer's response_headers_to_add.
//   - Otherwise (OK, or UNKNOWN, which Envoy takes as OK): the request goes on with the
//     answer's request_headers_to_add; its response gets response_headers_to_add, and the
//     x-ratelimit headers as in the local mode, the service's statuses that carry a
//     current_limit competing with the local buckets for the fewest remaining.
//   - An error (proxy_grpc_call refused, a gRPC status other than OK, a timeout, an
//     answer that does not decode): the request goes on and counts as failure mode
//     allowed, or with failure_mode_deny gets status_on_error.
//
// A stream that ends before the answer cancels the call (proxy_grpc_cancel). The answer
// comes to the root context; the filter finds the stream by the call's id and makes it
// effective before resuming or answering it.
package main

import (
	"errors"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasmesh/wasmesh/filters/internal/guestgc"
	"github.com/wasmesh/wasmesh/filters/internal/intern"
	"github.com/wasmesh/wasmesh/filters/internal/ratelimit"
)

// init registers the VM context: a reactor's host runs _initialize (package
// initialisers), never main.
func init() { proxywasm.SetVMContext(theVM) }

// theVM is the VM context, which the gRPC callbacks the SDK does not dispatch reach
// directly (grpc_wasip1.go).
var theVM = &vmContext{}

func main() {}

// vmContext carries what tests replace; the zero value is production.
type vmContext struct {
	types.DefaultVMContext
	// now is the clock; nil means time.Now, which reads the host's WASI clock.
	now func() time.Time
	// wrapStore, if set, wraps the shared-data store (tests interpose on CAS writes).
	wrapStore func(ratelimit.Store) ratelimit.Store
	// grpc, if set, replaces the host's gRPC calls (native tests).
	grpc grpcHost
	// calls are the pending rate-limit service calls, by callout id.
	calls map[uint32]*httpContext
}

func (vm *vmContext) NewPluginContext(uint32) types.PluginContext {
	return vm.newPlugin()
}

func (vm *vmContext) newPlugin() *pluginContext {
	p := &pluginContext{now: vm.now, wrapStore: vm.wrapStore, vm: vm}
	if vm.calls == nil {
		vm.calls = map[uint32]*httpContext{}
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p
}

// sharedData is the limiter's store: proxy-wasm shared data.
type sharedData struct{}

func (*sharedData) Get(key string) ([]byte, uint32, error) {
	v, cas, err := proxywasm.GetSharedData(key)
	if errors.Is(err, types.ErrorStatusNotFound) {
		return nil, 0, ratelimit.ErrNotFound
	}
	return v, cas, err
}

func (*sharedData) Set(key string, value []byte, cas uint32) error {
	err := proxywasm.SetSharedData(key, value, cas)
	if errors.Is(err, types.ErrorStatusCasMismatch) {
		return ratelimit.ErrCASMismatch
	}
	return err
}

type pluginContext struct {
	types.DefaultPluginContext
	vm        *vmContext
	now       func() time.Time
	wrapStore func(ratelimit.Store) ratelimit.Store

	cfg       *settings
	limiter   ratelimit.Limiter
	refresher ratelimit.Refresher // nil when the limiter keeps no state
	loggedErr bool
	scratch   scratch
	// strs interns attribute values read per request (see readAttr).
	strs   *intern.Table
	global globalRuntime
}

// maxInterned bounds the attribute values kept: past it, values are allocated per request.
const maxInterned = 1024

func (p *pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
		proxywasm.LogCriticalf("quota: reading plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	cfg, err := parseConfig(data)
	if err != nil {
		proxywasm.LogCriticalf("quota: %v", err)
		return types.OnPluginStartStatusFailed
	}
	scope := cfg.name
	if scope == "" {
		scope = "default"
		if b, err := proxywasm.GetProperty([]string{"plugin_name"}); err == nil && len(b) > 0 {
			scope = string(b)
		}
	}
	for _, d := range cfg.descriptors {
		d.start(scope)
	}
	if cfg.service != nil {
		p.global.start(cfg.descriptors)
	}
	var store ratelimit.Store = &sharedData{}
	if p.wrapStore != nil {
		store = p.wrapStore(store)
	}
	shared := ratelimit.NewShared(store, cfg.casRetries)
	p.cfg, p.limiter, p.refresher = cfg, shared, shared
	p.scratch.init(cfg)
	p.strs = intern.New(maxInterned)
	if err := proxywasm.SetTickPeriodMilliSeconds(uint32(cfg.tickPeriod / time.Millisecond)); err != nil {
		// Only the stored values go stale: requests refill from the clock.
		proxywasm.LogWarnf("quota: setting the tick period: %v", err)
	}
	return types.OnPluginStartStatusOK
}

// OnTick writes due refills of every bucket this VM knows, so shared data reflects the
// clock even for buckets no request touches.
func (p *pluginContext) OnTick() {
	if p.refresher == nil {
		return
	}
	now := p.now()
	for _, d := range p.cfg.descriptors {
		if d.mode == modeGlobal {
			continue
		}
		for _, b := range d.rt.buckets {
			p.refresher.Refresh(b.key, b.policy, now)
		}
	}
}

func (p *pluginContext) NewHttpContext(contextID uint32) types.HttpContext {
	return &httpContext{plugin: p, id: contextID}
}

// outcome is the decision that shapes the response headers.
type outcome struct {
	set      bool
	shadowed bool // denied in shadow mode
	d        ratelimit.Decision
}

// httpContext is one stream. Its fields are ordered, and the global mode's kept behind a
// pointer, so that it stays in the smallest allocation size class for the local mode.
type httpContext struct {
	types.DefaultHttpContext
	plugin *pluginContext
	result outcome
	id     uint32 // the stream's context id, made effective again in gRPC callbacks
	local  bool   // a local reply was sent
	global *globalRequest
}

func (h *httpContext) OnHttpRequestHeaders(int, bool) types.Action {
	p := h.plugin
	now := p.now()
	p.scratch.reset()
	service := p.askService()
	for _, d := range p.cfg.descriptors {
		if d.mode == modeGlobal && !service {
			continue
		}
		b, ok := p.bucketFor(d)
		if !ok {
			continue
		}
		if d.mode == modeGlobal {
			h.ask(d, b)
			continue
		}
		req := &p.scratch.req
		*req = ratelimit.Request{Key: b.key, Policy: b.policy, Hits: 1, Descriptor: d.name, Entries: p.scratch.entries}
		dec := p.limiter.Decide(req, now)
		p.count(d, b, dec)
		switch {
		case dec.Allowed:
			if !h.result.set || !h.result.shadowed && dec.Remaining < h.result.d.Remaining {
				h.result = outcome{set: true, d: dec}
			}
		case b.shadow:
			if !h.result.shadowed {
				h.result = outcome{set: true, shadowed: true, d: dec}
			}
		default:
			// A local denial answers before the service is asked, as Envoy's local rate
			// limit runs before its global one.
			h.result = outcome{set: true, d: dec}
			return h.deny(d, dec, nil)
		}
		if d.mode == modeBoth && service {
			h.ask(d, b)
		}
	}
	if h.global != nil {
		return h.call()
	}
	return types.ActionContinue
}

// OnHttpStreamDone cancels a call the stream no longer waits for, and lets the collector
// keep the heap small (guestgc).
func (h *httpContext) OnHttpStreamDone() {
	if h.global != nil && h.global.waiting {
		h.cancel()
	}
	guestgc.StreamDone()
}

func (p *pluginContext) count(d *descriptor, b *bucket, dec ratelimit.Decision) {
	m := &d.rt.metrics
	switch {
	case dec.Allowed:
		m.allowed.Increment(1)
	case b.shadow:
		m.shadowDenied.Increment(1)
	default:
		m.denied.Increment(1)
	}
	switch dec.FailOpen {
	case ratelimit.CASExhausted:
		m.casExhausted.Increment(1)
	case ratelimit.StoreError:
		m.storeError.Increment(1)
		if !p.loggedErr { // once: a broken store would otherwise log on every request
			p.loggedErr = true
			proxywasm.LogErrorf("quota: shared data failed for %q; failing open (counted in wasmesh_quota_fail_open_total)", b.key)
		}
	}
}

// deny answers 429; extra are the rate-limit service's headers, which replace ours of
// the same name (Envoy lets the service's content-type win on its local reply).
func (h *httpContext) deny(d *descriptor, dec ratelimit.Decision, extra [][2]string) types.Action {
	headers := [][2]string{
		{"content-type", "text/plain; charset=utf-8"},
		{"x-ratelimit-limit", uitoa(dec.Limit)},
		{"x-ratelimit-remaining", uitoa(dec.Remaining)},
		{"x-ratelimit-reset", seconds(dec.Reset)},
		{"retry-after", seconds(dec.Reset)},
	}
	if extra != nil {
		headers = mergeHeaders(headers, extra)
	}
	body := []byte("too many requests: quota " + d.name + " exhausted\n")
	if err := proxywasm.SendHttpResponse(429, headers, body, -1); err != nil {
		// Failing to reject is failing open; the denial is already counted.
		proxywasm.LogErrorf("quota: sending 429 for %q: %v", d.name, err)
		return types.ActionContinue
	}
	h.local = true
	return types.ActionPause
}

// OnHttpResponseHeaders adds the rate limit headers to forwarded responses. Envoy runs a
// local reply through the response callbacks too; the 429 already has them.
func (h *httpContext) OnHttpResponseHeaders(int, bool) types.Action {
	if h.global != nil && !h.local {
		h.addServiceHeaders()
	}
	r := h.result
	if h.local || !r.set || !r.shadowed && !h.plugin.cfg.headers {
		return types.ActionContinue
	}
	for _, kv := range [...][2]string{
		{"x-ratelimit-limit", uitoa(r.d.Limit)},
		{"x-ratelimit-remaining", uitoa(r.d.Remaining)},
		{"x-ratelimit-reset", seconds(r.d.Reset)},
	} {
		if err := proxywasm.ReplaceHttpResponseHeader(kv[0], kv[1]); err != nil {
			proxywasm.LogErrorf("quota: setting response header %q: %v", kv[0], err)
		}
	}
	return types.ActionContinue
}
