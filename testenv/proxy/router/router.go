// Package router is Envoy's router filter (envoy.filters.http.router), the terminal filter
// of the HTTP connection manager: it carries out the stream's route (direct response,
// redirect, or forwarding to a cluster chosen by the route), picks a host through the
// cluster's load balancer (with the route's hash policy), sends the request over the
// cluster's connection pool within the cluster's circuit breakers, retries it by the
// route's retry policy, enforces the route, per try and idle timeouts, mirrors it to
// shadow clusters, and turns failures into Envoy's local replies with response flags.
//
// Retries live in retry.go, request mirroring in mirror.go, hash policies in hash.go and
// the replayable request body in body.go.
package router

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/internal/latch"
	"github.com/wasmesh/wasmesh/testenv/proxy/route"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
)

// TypeURL is the router's type URL.
const TypeURL = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"

// Envoy's local reply bodies.
const (
	bodyNoHealthyUpstream = "no healthy upstream"
	bodyTimeout           = "upstream request timeout"
	bodyStreamTimeout     = "stream timeout"
	resetPrefix           = "upstream connect error or disconnect/reset before headers. "
)

var (
	errGlobalTimeout = errors.New("route timeout")
	errPerTryTimeout = errors.New("per try timeout")
	errIdleTimeout   = errors.New("stream idle timeout")
)

// Config is the router's filter config.
type Config struct {
	ctx   *hcm.Context
	proto *routerv3.Router
}

// Factory builds router configs; register it for TypeURL.
func Factory(ctx *hcm.Context, _ string, a *anypb.Any) (hcm.FilterConfig, error) {
	p := &routerv3.Router{}
	if err := a.UnmarshalTo(p); err != nil {
		return nil, err
	}
	if err := p.ValidateAll(); err != nil {
		return nil, err
	}
	return &Config{ctx: ctx, proto: p}, nil
}

// NewFilter makes the router instance of a stream.
func (c *Config) NewFilter(*hcm.Stream) (hcm.Filter, error) { return &filter{cfg: c}, nil }

type filter struct {
	cfg *Config
}

func (f *filter) EncodeHeaders(*hcm.Stream) hcm.Status { return hcm.Continue }
func (f *filter) Log(*hcm.Stream)                      {}
func (f *filter) Destroy(*hcm.Stream)                  {}

func (f *filter) DecodeHeaders(s *hcm.Stream) hcm.Status {
	rt := s.Route()
	if rt == nil {
		return s.SendLocalReply(http.StatusNotFound, "", nil, "route_not_found", streaminfo.NoRouteFound)
	}
	vars := headerVars(s)
	switch {
	case rt.Direct != nil:
		h := http.Header{}
		rt.ApplyResponseHeaders(h, nil, vars)
		st := s.SendLocalReply(int(rt.Direct.GetStatus()), string(rt.DirectBody()), h, "direct_response", 0)
		return st
	case rt.Redirect != nil:
		loc, code := rt.RedirectURL(s.Request)
		h := http.Header{"Location": {loc}}
		rt.ApplyResponseHeaders(h, nil, vars)
		return s.SendLocalReply(code, "", h, "via_route_redirect", 0)
	}
	wc := s.RouteCluster()
	if wc == nil {
		return s.SendLocalReply(http.StatusServiceUnavailable, "", nil, "cluster_not_found", streaminfo.NoClusterFound)
	}
	cl := f.cfg.ctx.Clusters.Get(wc.Name)
	if cl == nil {
		return s.SendLocalReply(http.StatusServiceUnavailable, "", nil, "cluster_not_found", streaminfo.NoClusterFound)
	}
	pol := policyOf(rt)
	if pol.err != nil {
		s.Log.Warn("route policy cannot be applied", "route", rt.Name, "err", pol.err)
		return s.SendLocalReply(http.StatusInternalServerError, "", nil, "route_configuration_error", 0)
	}
	fw := &forwarder{f: f, s: s, rt: rt, wc: wc, cl: cl, vars: vars, pol: pol,
		suppress: f.cfg.proto.GetSuppressEnvoyHeaders()}
	return fw.run()
}

// routePolicy is what the router compiles from a route once (kept in the route's memo).
type routePolicy struct {
	err           error
	retry         *retryPolicy
	hash          *hashPolicy
	mirrors       []mirrorPolicy
	priority      int
	attemptInReq  bool
	attemptInResp bool
	bufferLimit   int
	idle          time.Duration
	idleSet       bool
}

type policyKey struct{}

func policyOf(rt *route.Route) *routePolicy {
	return rt.Memo(policyKey{}, func() any {
		p := &routePolicy{}
		a, vh := rt.Action, rt.VHost.Proto
		rp := a.GetRetryPolicy()
		if rp == nil {
			// A route's policy replaces the virtual host's entirely (no merging).
			rp = vh.GetRetryPolicy()
		}
		if p.retry, p.err = compileRetryPolicy(rp); p.err != nil {
			return p
		}
		if p.hash, p.err = compileHashPolicy(a.GetHashPolicy()); p.err != nil {
			return p
		}
		p.mirrors = compileMirrors(a.GetRequestMirrorPolicies())
		p.priority = int(a.GetPriority())
		p.attemptInReq = vh.GetIncludeRequestAttemptCount()
		p.attemptInResp = vh.GetIncludeAttemptCountInResponse()
		if l := rt.Proto.GetPerRequestBufferLimitBytes(); l != nil {
			p.bufferLimit = int(l.GetValue())
		} else if l := vh.GetPerRequestBufferLimitBytes(); l != nil {
			p.bufferLimit = int(l.GetValue())
		}
		if t := a.GetIdleTimeout(); t != nil {
			p.idle, p.idleSet = t.AsDuration(), true
		}
		return p
	}).(*routePolicy)
}

// timeouts are the request's route (global) and per try timeouts after the request headers
// that override them.
type timeouts struct {
	global, perTry time.Duration
	alt            bool // x-envoy-upstream-rq-timeout-alt-response: 204 instead of 504
}

// finalTimeouts is Envoy's FilterUtility::finalTimeout: the route timeout, or
// x-envoy-upstream-rq-timeout-ms; the retry policy's per try timeout, or
// x-envoy-upstream-rq-per-try-timeout-ms, ignored when not below the route timeout; the
// headers are consumed and x-envoy-expected-rq-timeout-ms tells the upstream.
func finalTimeouts(rt *route.Route, pol *routePolicy, h http.Header, suppress bool) timeouts {
	t := timeouts{global: rt.Timeout()}
	if pol.retry != nil {
		t.perTry = pol.retry.perTry
	}
	if v := h.Get("x-envoy-upstream-rq-timeout-ms"); v != "" {
		if ms, err := strconv.ParseUint(v, 10, 63); err == nil {
			t.global = time.Duration(ms) * time.Millisecond
		}
		h.Del("x-envoy-upstream-rq-timeout-ms")
	}
	if v := h.Get("x-envoy-upstream-rq-per-try-timeout-ms"); v != "" {
		if ms, err := strconv.ParseUint(v, 10, 63); err == nil {
			t.perTry = time.Duration(ms) * time.Millisecond
		}
		h.Del("x-envoy-upstream-rq-per-try-timeout-ms")
	}
	if t.global != 0 && t.perTry >= t.global {
		t.perTry = 0
	}
	if h.Get("x-envoy-upstream-rq-timeout-alt-response") != "" {
		t.alt = true
		h.Del("x-envoy-upstream-rq-timeout-alt-response")
	}
	expected := t.perTry
	if expected == 0 {
		expected = t.global
	}
	if expected > 0 && !suppress {
		h.Set("x-envoy-expected-rq-timeout-ms", strconv.FormatInt(expected.Milliseconds(), 10))
	}
	return t
}

// forwarder is one forwarded request: its attempts, timers, retry state and body.
type forwarder struct {
	f        *filter
	s        *hcm.Stream
	rt       *route.Route
	wc       *route.WeightedCluster
	cl       *upstream.Cluster
	vars     route.Vars
	pol      *routePolicy
	suppress bool

	out  *http.Request
	tm   timeouts
	rs   *retryState
	body *requestBody
	// done is set when the downstream request is complete (its body fully read), which
	// is when Envoy arms the route and per try timers.
	done    latch.Latch
	gctx    context.Context
	gcancel context.CancelCauseFunc
	lbctx   *upstream.LBContext
	cookies []string

	timersMu sync.Mutex
	timers   []*time.Timer
	idle     time.Duration
	lastAct  atomic.Int64
	attempts int
	retried  bool
}

// attemptResult is one upstream attempt's outcome.
type attemptResult struct {
	resp    *http.Response
	fail    failure
	err     error
	host    *upstream.Host
	started time.Time
	cancel  context.CancelCauseFunc
	release func()
	local   string
}

func (fw *forwarder) run() hcm.Status {
	s, cl := fw.s, fw.cl
	fw.out = fw.f.upstreamRequest(s, fw.rt, fw.wc, fw.vars)
	fw.tm = finalTimeouts(fw.rt, fw.pol, fw.out.Header, fw.suppress)
	fw.rs = newRetryState(fw.pol.retry, fw.out.Header, cl.Breakers(fw.pol.priority), cl.Stats)
	fw.gctx, fw.gcancel = context.WithCancelCause(s.Context())
	fw.startIdleTimer()

	targets := selectMirrors(fw.pol.mirrors, s.Request, fw.f.cfg.ctx.Clusters)
	if b := s.Request.Body; b != nil && b != http.NoBody {
		keep := fw.rs != nil || len(targets) > 0
		limit := s.BufferLimit()
		if fw.pol.bufferLimit > 0 {
			limit = min(limit, fw.pol.bufferLimit)
		}
		fw.body = newRequestBody(b, s.Info, &fw.done, fw.touch, keep, limit, func() {
			// Envoy gives up retries and shadows when the body outgrows the buffer.
			cl.Stats.RetryOrShadowAbandoned.Inc()
			fw.rs.disable()
		})
	} else {
		fw.done.Set()
	}
	fw.done.OnSet(func() {
		if fw.tm.global > 0 {
			fw.addTimer(time.AfterFunc(fw.tm.global, func() { fw.gcancel(errGlobalTimeout) }))
		}
	})
	if len(targets) > 0 {
		mirror(fw.f.cfg.ctx.Clusters, targets, fw.out, fw.body, fw.tm.global, s.HTTP2)
	}
	fw.lbctx = &upstream.LBContext{Request: s.Request}
	if rp := fw.pol.retry; rp != nil {
		fw.lbctx.AvoidAttempted, fw.lbctx.HostSelectionAttempts = rp.previousHosts, rp.hostSelectionMax
	}
	if hp := fw.pol.hash; hp != nil {
		in := &hashInput{req: s.Request, peer: s.Info.DownstreamPeer, local: s.Info.DownstreamLocal}
		fw.lbctx.Hash, fw.lbctx.HasHash = hp.generate(in)
		fw.cookies = in.setCookies
	}

	var flags streaminfo.Flag
	var res *attemptResult
	for {
		fw.attempts++
		res = fw.attempt()
		fw.report(res)
		if res.fail == failDownstream || fw.rs == nil || s.Interrupted() {
			break
		}
		would := fw.rs.wouldRetry(res) && (fw.body == nil || fw.body.replayable())
		st := fw.rs.shouldRetry(would)
		if st != retryYes {
			flags |= flagFor(st)
			break
		}
		fw.retried = true
		fw.discard(res)
		if err := fw.rs.backOff(fw.gctx); err != nil {
			res = &attemptResult{fail: fw.classify(nil, fw.gctx)}
			break
		}
	}
	if res.resp == nil {
		return fw.fail(res, flags)
	}
	return fw.respond(res, flags)
}

func (fw *forwarder) addTimer(t *time.Timer) {
	fw.timersMu.Lock()
	fw.timers = append(fw.timers, t)
	fw.timersMu.Unlock()
}

// finish stops the request's timers and gives back what it holds.
func (fw *forwarder) finish() {
	fw.timersMu.Lock()
	for _, t := range fw.timers {
		t.Stop()
	}
	fw.timers = nil
	fw.timersMu.Unlock()
	fw.rs.release()
	fw.gcancel(nil)
}

// startIdleTimer runs the stream idle timeout (the route's idle_timeout, else the
// connection manager's stream_idle_timeout): it fires when neither request nor response
// bytes moved for the whole period.
func (fw *forwarder) startIdleTimer() {
	fw.idle = fw.s.StreamIdleTimeout
	if fw.pol.idleSet {
		fw.idle = fw.pol.idle
	}
	if fw.idle <= 0 {
		return
	}
	fw.touch()
	var fire func()
	fire = func() {
		since := time.Since(time.Unix(0, fw.lastAct.Load()))
		if since < fw.idle {
			fw.addTimer(time.AfterFunc(fw.idle-since, fire))
			return
		}
		fw.gcancel(errIdleTimeout)
	}
	fw.addTimer(time.AfterFunc(fw.idle, fire))
}

func (fw *forwarder) touch() {
	if fw.idle > 0 {
		fw.lastAct.Store(time.Now().UnixNano())
	}
}

// perTryTimer is one attempt's per try timeout, armed once the request is complete and
// stopped when the response headers arrive.
type perTryTimer struct {
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
	fired   atomic.Bool
}

func (p *perTryTimer) arm(d time.Duration, cancel context.CancelCauseFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.t = time.AfterFunc(d, func() {
		p.fired.Store(true)
		cancel(errPerTryTimeout)
	})
}

func (p *perTryTimer) stop() bool {
	p.mu.Lock()
	p.stopped = true
	if p.t != nil {
		p.t.Stop()
	}
	p.mu.Unlock()
	return p.fired.Load()
}

func (fw *forwarder) chooseHost() *upstream.Host {
	cl := fw.cl
	if cl.Config.GetType() == clusterv3.Cluster_ORIGINAL_DST {
		addr := fw.s.Info.DownstreamLocal
		if cl.Config.GetOriginalDstLbConfig().GetUseHttpHeader() {
			hdr := cl.Config.GetOriginalDstLbConfig().GetHttpHeaderName()
			if hdr == "" {
				hdr = "x-envoy-original-dst-host"
			}
			if v := fw.s.Request.Header.Get(hdr); v != "" {
				addr = v
			}
		}
		return upstream.OriginalDstHost(addr)
	}
	return cl.Choose(fw.lbctx)
}

// attempt sends one try to one host.
func (fw *forwarder) attempt() *attemptResult {
	s, cl := fw.s, fw.cl
	res := &attemptResult{started: time.Now()}
	host := fw.chooseHost()
	if host == nil {
		res.fail = failNoHost
		return res
	}
	res.host = host
	fw.lbctx.Attempted = append(fw.lbctx.Attempted, host)
	actx, acancel := context.WithCancelCause(fw.gctx)
	res.cancel = acancel
	release, err := cl.Breakers(fw.pol.priority).Acquire(actx, cl.UsesHTTP2(s.HTTP2))
	if err != nil {
		if errors.Is(err, upstream.ErrOverflow) {
			res.fail = failOverflow
		} else {
			res.fail = fw.classify(err, actx)
		}
		acancel(nil)
		return res
	}
	res.release = release
	pt := &perTryTimer{}
	if d := fw.tm.perTry; d > 0 {
		fw.done.OnSet(func() { pt.arm(d, acancel) })
	}
	var local atomic.Value
	trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		if a := ci.Conn.LocalAddr(); a != nil {
			local.Store(a.String())
		}
		s.Info.SetUpstreamTLS(upstream.ConnTLS(ci.Conn))
	}}
	req := fw.out.WithContext(httptrace.WithClientTrace(actx, trace))
	if fw.body != nil {
		req.Body = fw.body.cursor(true)
	}
	if fw.pol.attemptInReq {
		req.Header = fw.out.Header.Clone()
		req.Header.Set("x-envoy-attempt-count", strconv.Itoa(fw.attempts))
	}
	cl.Stats.UpstreamRqTotal.Inc()
	cl.Stats.UpstreamRqActive.Inc()
	host.RequestStarted()
	resp, err := cl.RoundTrip(req, host, s.HTTP2)
	if pt.stop() && err == nil {
		// The per try timer fired as the headers arrived: the attempt's context is gone.
		_ = resp.Body.Close()
		resp, err = nil, errPerTryTimeout
	}
	res.local, _ = local.Load().(string)
	s.Info.SetUpstream(host.Address, res.local)
	if err != nil {
		res.err = err
		res.fail = fw.classify(err, actx)
		fw.endAttempt(res)
		return res
	}
	res.resp = resp
	return res
}

// endAttempt releases what an attempt holds (its breaker unit, its context, the active
// counts).
func (fw *forwarder) endAttempt(res *attemptResult) {
	if res.host != nil {
		fw.cl.Stats.UpstreamRqActive.Dec()
		res.host.RequestFinished()
	}
	if res.release != nil {
		res.release()
		res.release = nil
	}
	if res.cancel != nil {
		res.cancel(nil)
	}
}

// classify tells why an attempt failed.
func (fw *forwarder) classify(err error, actx context.Context) failure {
	if fw.s.Context().Err() != nil {
		return failDownstream
	}
	switch context.Cause(actx) {
	case errGlobalTimeout:
		return failGlobalTimeout
	case errPerTryTimeout:
		return failPerTryTimeout
	case errIdleTimeout:
		return failIdleTimeout
	}
	if errors.Is(err, errPerTryTimeout) {
		return failPerTryTimeout
	}
	var ce *upstream.ConnectError
	if errors.As(err, &ce) {
		return failConnect
	}
	var se http2.StreamError
	if errors.As(err, &se) && se.Code == http2.ErrCodeRefusedStream {
		return failRefusedStream
	}
	return failReset
}

// report feeds outlier detection and the timeout counters.
func (fw *forwarder) report(res *attemptResult) {
	cl := fw.cl
	switch {
	case res.resp != nil:
		cl.ReportResult(res.host, upstream.LocalOriginConnectSuccess)
		cl.ReportStatus(res.host, res.resp.StatusCode)
	case res.fail == failConnect || res.fail == failReset || res.fail == failRefusedStream:
		cl.ReportResult(res.host, upstream.LocalOriginConnectFailed)
	case res.fail == failPerTryTimeout:
		cl.Stats.UpstreamRqPerTryTimeout.Inc()
		cl.ReportResult(res.host, upstream.LocalOriginTimeout)
	case res.fail == failGlobalTimeout:
		cl.Stats.UpstreamRqTimeout.Inc()
		cl.ReportResult(res.host, upstream.LocalOriginTimeout)
	}
}

// discard drops an attempt that is retried: its response is charged to the retry.*
// statistics, as Envoy does, and not to the request's.
func (fw *forwarder) discard(res *attemptResult) {
	if res.resp != nil {
		_ = res.resp.Body.Close()
		fw.cl.Stats.RecordRetriedResponse(res.resp.StatusCode, time.Since(res.started))
		fw.endAttempt(res)
	}
}

// fail answers the request locally after its last attempt failed.
func (fw *forwarder) fail(res *attemptResult, flags streaminfo.Flag) hcm.Status {
	s, cl := fw.s, fw.cl
	defer fw.finish()
	if s.ApplyInterrupt() {
		return hcm.Stop
	}
	if res.fail == failDownstream {
		s.Info.AddFlag(streaminfo.DownstreamConnectionTermination)
		s.Response = &hcm.Response{Local: true}
		return hcm.Stop
	}
	hdr := http.Header{}
	var code int
	var body, details string
	var flag streaminfo.Flag
	retried := ""
	if fw.retried {
		retried = "retried and the latest "
	}
	switch res.fail {
	case failNoHost:
		code, body, details, flag = http.StatusServiceUnavailable, bodyNoHealthyUpstream, "no_healthy_upstream", streaminfo.NoHealthyUpstream
	case failOverflow:
		code, flag = http.StatusServiceUnavailable, streaminfo.UpstreamOverflow
		body = resetPrefix + retried + "reset reason: overflow"
		details = "upstream_reset_before_response_started{overflow}"
		if !fw.suppress {
			hdr.Set("x-envoy-overloaded", "true")
		}
	case failConnect:
		var ce *upstream.ConnectError
		reason := ""
		if errors.As(res.err, &ce) {
			reason = ce.Err.Error()
			s.Info.SetUpstreamFailure(reason)
		}
		code, flag = http.StatusServiceUnavailable, streaminfo.UpstreamConnectionFailure
		body = resetPrefix + retried + "reset reason: connection failure, transport failure reason: " + reason
		details = "upstream_reset_before_response_started{connection_failure}"
	case failRefusedStream:
		code, flag = http.StatusServiceUnavailable, streaminfo.UpstreamRemoteReset
		body = resetPrefix + retried + "reset reason: remote refused stream reset"
		details = "upstream_reset_before_response_started{remote_refused_stream_reset}"
	case failReset:
		code, flag = http.StatusServiceUnavailable, streaminfo.UpstreamConnectionTermination
		body = resetPrefix + retried + "reset reason: connection termination"
		details = "upstream_reset_before_response_started{connection_termination}"
	case failPerTryTimeout, failGlobalTimeout:
		code, body, flag = http.StatusGatewayTimeout, bodyTimeout, streaminfo.UpstreamRequestTimeout
		details = "upstream_response_timeout"
		if res.fail == failPerTryTimeout {
			details = "upstream_per_try_timeout"
		}
		if fw.tm.alt {
			code, body = http.StatusNoContent, ""
		}
	case failIdleTimeout:
		// Envoy answers 504 once the request was received in full, 408 before.
		code = http.StatusRequestTimeout
		if fw.done.IsSet() {
			code = http.StatusGatewayTimeout
		}
		body, details, flag = bodyStreamTimeout, "stream_idle_timeout", streaminfo.StreamIdleTimeout
	}
	if res.fail != failIdleTimeout {
		cl.Stats.RecordResponse(code, time.Since(res.started))
	}
	if fw.pol.attemptInResp && fw.attempts > 0 {
		hdr.Set("x-envoy-attempt-count", strconv.Itoa(fw.attempts))
	}
	return s.SendLocalReply(code, body, hdr, details, flag|flags)
}

// respond passes the upstream response on.
func (fw *forwarder) respond(res *attemptResult, flags streaminfo.Flag) hcm.Status {
	s, cl, resp := fw.s, fw.cl, res.resp
	if s.Interrupted() {
		// A filter answered from the request body while the upstream already answered.
		_ = resp.Body.Close()
		cl.Stats.RecordResponse(resp.StatusCode, time.Since(res.started))
		fw.endAttempt(res)
		fw.finish()
		s.ApplyInterrupt()
		return hcm.Stop
	}
	if flags != 0 {
		s.Info.AddFlag(flags)
	}
	h := make(http.Header, len(resp.Header)+2)
	for k, v := range resp.Header {
		if hcm.HopHeader(k) {
			continue
		}
		h[k] = v
	}
	if !fw.suppress {
		h.Set("x-envoy-upstream-service-time", strconv.FormatInt(time.Since(res.started).Milliseconds(), 10))
	}
	for _, c := range fw.cookies {
		h.Add("set-cookie", c)
	}
	if fw.pol.attemptInResp {
		h.Set("x-envoy-attempt-count", strconv.Itoa(fw.attempts))
	}
	fw.rt.ApplyResponseHeaders(h, fw.wc, fw.vars)
	s.Info.SetResponse(resp.StatusCode, "via_upstream")
	code, started := resp.StatusCode, res.started
	body := &upstreamBody{rc: resp.Body, fw: fw, done: func() {
		cl.Stats.RecordResponse(code, time.Since(started))
		fw.endAttempt(res)
		fw.finish()
	}}
	s.Response = &hcm.Response{Status: resp.StatusCode, Header: h, Body: body, Trailer: func() http.Header { return resp.Trailer }}
	return hcm.Stop
}

// upstreamRequest builds the request sent upstream: the downstream request without
// hop-by-hop headers, with the route's rewrites and header mutations.
func (f *filter) upstreamRequest(s *hcm.Stream, rt *route.Route, wc *route.WeightedCluster, vars route.Vars) *http.Request {
	r := s.Request
	out := r.Clone(s.Context())
	out.RequestURI = ""
	// Connection handling is per hop, and the proxy answers Expect: 100-continue itself
	// (Envoy's default).
	out.Close = false
	out.Header.Del("Expect")
	for k := range out.Header {
		if hcm.HopHeader(k) {
			out.Header.Del(k)
		}
	}
	if te := r.Header.Get("te"); te == "trailers" {
		out.Header.Set("te", "trailers")
	}
	if p, changed := rt.RewritePath(r.URL.RequestURI()); changed {
		out.Header.Set("x-envoy-original-path", r.URL.RequestURI())
		if u, err := r.URL.Parse(p); err == nil {
			out.URL.Path, out.URL.RawPath, out.URL.RawQuery = u.Path, u.RawPath, u.RawQuery
		}
	}
	if a := rt.Action; a != nil {
		switch {
		case a.GetHostRewriteLiteral() != "":
			out.Host = a.GetHostRewriteLiteral()
		case a.GetHostRewriteHeader() != "":
			if v := r.Header.Get(a.GetHostRewriteHeader()); v != "" {
				out.Host = v
			}
		}
	}
	rt.ApplyRequestHeaders(out.Header, wc, vars)
	out.Body = nil
	return out
}

// headerVars resolves the header value variables Envoy supports in route header
// mutations.
func headerVars(s *hcm.Stream) route.Vars {
	return func(name string) (string, bool) {
		switch name {
		case "DOWNSTREAM_REMOTE_ADDRESS":
			return s.Info.DownstreamPeer, true
		case "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT":
			h, _, err := net.SplitHostPort(s.Info.DownstreamPeer)
			return h, err == nil
		case "DOWNSTREAM_LOCAL_ADDRESS":
			return s.Info.DownstreamLocal, true
		case "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT":
			h, _, err := net.SplitHostPort(s.Info.DownstreamLocal)
			return h, err == nil
		case "PROTOCOL":
			return s.Info.Protocol, true
		case "UPSTREAM_CLUSTER":
			return s.Info.Snapshot().ClusterName, true
		}
		return "", false
	}
}

// upstreamBody is the upstream response body on its way downstream: reads are stream
// activity; a read cut by the route timeout is recorded as UT; done runs once, on Close.
type upstreamBody struct {
	rc   io.ReadCloser
	fw   *forwarder
	once sync.Once
	done func()
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.fw.touch()
	}
	if err != nil && err != io.EOF {
		switch context.Cause(b.fw.gctx) {
		case errGlobalTimeout:
			b.fw.cl.Stats.UpstreamRqTimeout.Inc()
			b.fw.s.Info.AddFlag(streaminfo.UpstreamRequestTimeout)
		case errIdleTimeout:
			b.fw.s.Info.AddFlag(streaminfo.StreamIdleTimeout)
		}
	}
	return n, err
}

func (b *upstreamBody) Close() error {
	err := b.rc.Close()
	b.once.Do(b.done)
	return err
}
