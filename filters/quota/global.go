package main

import (
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasmesh/wasmesh/filters/internal/ratelimit"
)

// The global mode: descriptors in mode "global" or "both" go, in one RateLimitRequest
// per request, to envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over
// proxy_grpc_call, while the request waits. Envoy's envoy.filters.http.ratelimit is the
// model: OVER_LIMIT answers 429; an error or timeout lets the request go on (counted as
// failure_mode_allowed) unless failure_mode_deny, which answers status_on_error (500);
// a stream that ends first cancels the call.

// Reasons of wasmesh_quota_global_errors_total.
const (
	reasonCallFailed  = "call_failed"  // proxy_grpc_call refused (unknown cluster, ...)
	reasonTimeout     = "timeout"      // DEADLINE_EXCEEDED
	reasonUnavailable = "unavailable"  // UNAVAILABLE: no healthy host, connect failed
	reasonGRPCError   = "grpc_error"   // any other gRPC status
	reasonBadResponse = "bad_response" // no message, or one that does not decode
)

var errorReasons = [...]string{reasonCallFailed, reasonTimeout, reasonUnavailable, reasonGRPCError, reasonBadResponse}

// gRPC status codes the errors are told apart by.
const (
	grpcDeadlineExceeded = 4
	grpcUnavailable      = 14
)

// globalRuntime is the plugin's state for the global mode.
type globalRuntime struct {
	req     rlsRequest
	metrics struct {
		ok, overLimit, errored, failureModeAllowed, cancelled proxywasm.MetricCounter
		errors                                                map[string]proxywasm.MetricCounter
	}
	loggedErr bool
}

// globalMetrics are the per-descriptor counters of the service's answers.
type globalMetrics struct {
	allowed, denied, shadowDenied proxywasm.MetricCounter
}

func (g *globalRuntime) start(ds []*descriptor) {
	m := &g.metrics
	m.ok = proxywasm.DefineCounterMetric(callsMetric("ok"))
	m.overLimit = proxywasm.DefineCounterMetric(callsMetric("over_limit"))
	m.errored = proxywasm.DefineCounterMetric(callsMetric("error"))
	m.failureModeAllowed = proxywasm.DefineCounterMetric("wasmesh_quota_global_failure_mode_allowed_total")
	m.cancelled = proxywasm.DefineCounterMetric("wasmesh_quota_global_cancelled_total")
	m.errors = map[string]proxywasm.MetricCounter{}
	for _, r := range errorReasons {
		m.errors[r] = proxywasm.DefineCounterMetric(taggedName("wasmesh_quota_global_errors_total", [2]string{"reason", r}))
	}
	for _, d := range ds {
		if d.mode == modeLocal {
			continue
		}
		gm := &d.rt.global
		gm.allowed = proxywasm.DefineCounterMetric(globalRequestsMetric(d.name, "allowed"))
		gm.denied = proxywasm.DefineCounterMetric(globalRequestsMetric(d.name, "denied"))
		gm.shadowDenied = proxywasm.DefineCounterMetric(globalRequestsMetric(d.name, "shadow_denied"))
	}
}

// callsMetric counts calls by the service's overall answer (or error).
func callsMetric(decision string) string {
	return taggedName("wasmesh_quota_global_calls_total", [2]string{"decision", decision})
}

// globalRequestsMetric counts, per descriptor, what the service said of it.
func globalRequestsMetric(descriptor, decision string) string {
	return taggedName("wasmesh_quota_global_requests_total", [2]string{"descriptor", descriptor}, [2]string{"decision", decision})
}

// globalRequest is a stream's exchange with the service: the descriptors asked, the
// pending call, and the headers the answer asks to add to the response.
type globalRequest struct {
	asked      []asked
	callout    uint32
	waiting    bool
	addHeaders [][2]string
}

// asked is a descriptor in the pending request, in the order of the request.
type asked struct {
	d      *descriptor
	shadow bool
}

// askService says whether the service decides this request (Envoy's request_type, by
// x-envoy-internal).
func (p *pluginContext) askService() bool {
	svc := p.cfg.service
	if svc == nil {
		return false
	}
	if svc.requestType == requestBoth {
		return true
	}
	v, err := proxywasm.GetHttpRequestHeader("x-envoy-internal")
	internal := err == nil && v == "true"
	return internal == (svc.requestType == requestInternal)
}

// ask adds the descriptor, with the entries bucketFor just resolved, to the request.
func (h *httpContext) ask(d *descriptor, b *bucket) {
	p := h.plugin
	if h.global == nil {
		h.global = &globalRequest{}
		p.global.req.start(p.cfg.service.domain)
	}
	p.global.req.addDescriptor(p.scratch.entries)
	h.global.asked = append(h.global.asked, asked{d: d, shadow: b.shadow})
}

// call sends the request to the service and pauses the stream until the answer.
func (h *httpContext) call() types.Action {
	p := h.plugin
	svc := p.cfg.service
	msg := p.global.req.finish(1) // hits_addend: one request
	id, err := p.vm.host().call(svc.grpcService, rlsService, rlsMethod, msg, svc.timeout)
	if err != nil {
		p.logGlobal("calling the rate-limit service on cluster %q: %v", svc.cluster, err)
		if h.failed(reasonCallFailed) {
			return types.ActionPause
		}
		return types.ActionContinue
	}
	h.global.callout, h.global.waiting = id, true
	p.vm.calls[id] = h
	return types.ActionPause
}

// answered takes the service's message (callback; the stream is paused).
func (h *httpContext) answered(msg []byte, readErr error) {
	h.global.waiting = false
	p := h.plugin
	if err := proxywasm.SetEffectiveContext(h.id); err != nil {
		p.logGlobal("returning to stream %d: %v", h.id, err)
		return
	}
	resp, err := (*rlsResponse)(nil), readErr
	if err == nil {
		resp, err = parseRateLimitResponse(msg)
	}
	if err != nil {
		p.logGlobal("reading the rate-limit service's answer: %v", err)
		h.resumeUnless(h.failed(reasonBadResponse))
		return
	}
	h.resumeUnless(h.decide(resp))
}

// closed ends a call that got no message (callback; the stream is paused).
func (h *httpContext) closed(code uint32, message string) {
	h.global.waiting = false
	p := h.plugin
	if err := proxywasm.SetEffectiveContext(h.id); err != nil {
		p.logGlobal("returning to stream %d: %v", h.id, err)
		return
	}
	reason := reasonGRPCError
	switch code {
	case 0:
		reason = reasonBadResponse // OK without a message
	case grpcDeadlineExceeded:
		reason = reasonTimeout
	case grpcUnavailable:
		reason = reasonUnavailable
	}
	p.logGlobal("the rate-limit service call ended with gRPC status %d (%s)", code, message)
	h.resumeUnless(h.failed(reason))
}

// resumeUnless resumes the paused request unless it was answered locally.
func (h *httpContext) resumeUnless(replied bool) {
	if replied {
		return
	}
	if err := proxywasm.ResumeHttpRequest(); err != nil {
		h.plugin.logGlobal("resuming the request: %v", err)
	}
}

// failed applies the failure policy; true when it answered the request.
func (h *httpContext) failed(reason string) bool {
	p := h.plugin
	svc := p.cfg.service
	m := &p.global.metrics
	m.errored.Increment(1)
	m.errors[reason].Increment(1)
	if !svc.failureModeDeny {
		m.failureModeAllowed.Increment(1)
		return false
	}
	body := []byte("rate limit service error\n")
	if err := proxywasm.SendHttpResponse(svc.statusOnError, [][2]string{{"content-type", "text/plain; charset=utf-8"}}, body, -1); err != nil {
		p.logGlobal("sending %d: %v", svc.statusOnError, err)
		return false
	}
	h.local = true
	return true
}

// decide applies the service's answer; true when it answered the request (429).
func (h *httpContext) decide(resp *rlsResponse) bool {
	m := &h.plugin.global.metrics
	over := resp.overall == rlsOverLimit
	if over {
		m.overLimit.Increment(1)
	} else { // Envoy takes anything but OVER_LIMIT as OK
		m.ok.Increment(1)
	}
	// Which descriptors are over: those whose status says so; an OVER_LIMIT answer that
	// names none holds for all.
	named := false
	for i := range h.global.asked {
		named = named || over && i < len(resp.statuses) && resp.statuses[i].code == rlsOverLimit
	}
	var deny *descriptor
	var denial ratelimit.Decision
	for i, a := range h.global.asked {
		var st rlsStatus
		if i < len(resp.statuses) {
			st = resp.statuses[i]
		}
		dec := ratelimit.Decision{Allowed: true, Limit: st.limit, Remaining: st.remaining, Reset: st.reset}
		if over && (!named || st.code == rlsOverLimit) {
			dec.Allowed = false
		}
		gm := &a.d.rt.global
		switch {
		case dec.Allowed:
			gm.allowed.Increment(1)
			if st.hasLimit && (!h.result.set || !h.result.shadowed && dec.Remaining < h.result.d.Remaining) {
				h.result = outcome{set: true, d: dec}
			}
		case a.shadow:
			gm.shadowDenied.Increment(1)
			if !h.result.shadowed {
				h.result = outcome{set: true, shadowed: true, d: dec}
			}
		default:
			gm.denied.Increment(1)
			if deny == nil {
				deny, denial = a.d, dec
			}
			// Retry when every denying limit has room again (Envoy's retry-after: the
			// largest duration_until_reset of the over-limit statuses).
			denial.Reset = max(denial.Reset, dec.Reset)
		}
	}
	if deny == nil {
		h.global.addHeaders = resp.responseHeaders
		for _, kv := range resp.requestHeaders {
			if err := proxywasm.AddHttpRequestHeader(kv[0], kv[1]); err != nil {
				h.plugin.logGlobal("adding request header %q: %v", kv[0], err)
			}
		}
		return false
	}
	denial.Reset = max(denial.Reset, time.Second) // Envoy clamps retry-after to 1 s at least
	h.result = outcome{set: true, d: denial}
	return h.deny(deny, denial, resp.responseHeaders) == types.ActionPause
}

// cancel drops the pending call of a stream that ended first; the caller checks that
// one is pending.
func (h *httpContext) cancel() {
	g := h.global
	g.waiting = false
	p := h.plugin
	delete(p.vm.calls, g.callout)
	p.global.metrics.cancelled.Increment(1)
	if err := p.vm.host().cancel(g.callout); err != nil {
		p.logGlobal("cancelling call %d: %v", g.callout, err)
	}
}

// logGlobal logs the first global-mode error of the plugin: a broken service would
// otherwise log on every request. The metrics count them all.
func (p *pluginContext) logGlobal(format string, args ...any) {
	if p.global.loggedErr {
		return
	}
	p.global.loggedErr = true
	proxywasm.LogErrorf("quota: "+format+" (further errors are counted in wasmesh_quota_global_errors_total, not logged)", args...)
}

// addServiceHeaders adds the response_headers_to_add of an OK answer to the upstream's
// response, as Envoy's filter does.
func (h *httpContext) addServiceHeaders() {
	for _, kv := range h.global.addHeaders {
		if err := proxywasm.AddHttpResponseHeader(kv[0], kv[1]); err != nil {
			h.plugin.logGlobal("adding response header %q: %v", kv[0], err)
		}
	}
}

// mergeHeaders returns ours with each of theirs replacing ours of the same name, or added.
func mergeHeaders(ours, theirs [][2]string) [][2]string {
	for _, kv := range theirs {
		replaced := false
		for i := range ours {
			if ours[i][0] == kv[0] {
				ours[i][1], replaced = kv[1], true
			}
		}
		if !replaced {
			ours = append(ours, kv)
		}
	}
	return ours
}
