// Package router is Envoy's router filter (envoy.filters.http.router), the terminal filter
// of the HTTP connection manager: it carries out the stream's route (direct response,
// redirect, or forwarding to a cluster chosen by the route), picks a host through the
// cluster's load balancer, sends the request over the cluster's connection pool and turns
// failures into Envoy's local replies with response flags.
//
// Retries (retry.go), request mirroring (mirror.go) and hash policies (hash.go) plug into
// the forwarding loop through small interfaces so that each lives in its own file.
package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
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
	resetPrefix           = "upstream connect error or disconnect/reset before headers. reset reason: "
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
	return f.forward(s, rt, wc, cl, vars)
}

// attemptResult is one upstream attempt's outcome.
type attemptResult struct {
	resp    *http.Response
	err     error
	host    *upstream.Host
	flag    streaminfo.Flag
	code    int
	body    string
	details string
	started time.Time
	cancel  context.CancelFunc
}

func (f *filter) forward(s *hcm.Stream, rt *route.Route, wc *route.WeightedCluster, cl *upstream.Cluster, vars route.Vars) hcm.Status {
	release, err := cl.Admit(s.Context())
	if err != nil {
		cl.Stats.UpstreamRqPendingOverflow.Inc()
		return s.SendLocalReply(http.StatusServiceUnavailable, resetPrefix+"overflow",
			http.Header{"X-Envoy-Overflow": {"true"}}, "upstream_reset_before_response_started{overflow}", streaminfo.UpstreamOverflow)
	}
	out := f.upstreamRequest(s, rt, wc, vars)
	timeout := rt.Timeout()
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
		out.Header.Set("x-envoy-expected-rq-timeout-ms", strconv.FormatInt(timeout.Milliseconds(), 10))
	}
	mirror(f.cfg.ctx, s, rt, out)
	retry := newRetryState(rt, cl, out)
	lbctx := &upstream.LBContext{Request: s.Request}
	lbctx.Hash, lbctx.HasHash = requestHash(rt, s.Request)

	var res attemptResult
	for {
		res = f.attempt(s, cl, out, lbctx, deadline, retry.PerTryTimeout())
		cl.Report(res.host, res.code, res.err)
		if res.host != nil {
			lbctx.Attempted = append(lbctx.Attempted, res.host)
		}
		if res.flag == streaminfo.DownstreamConnectionTermination || !retry.ShouldRetry(s.Context(), &res, deadline) {
			break
		}
		if res.resp != nil {
			_ = res.resp.Body.Close()
		}
		if res.cancel != nil {
			res.cancel()
		}
		cl.Stats.UpstreamRqRetry.Inc()
		out = retry.NextRequest(out)
	}
	if res.resp == nil {
		release()
		if res.cancel != nil {
			res.cancel()
		}
		if res.flag == streaminfo.DownstreamConnectionTermination {
			s.Info.AddFlag(res.flag)
			s.Response = &hcm.Response{Local: true}
			return hcm.Stop
		}
		flag := res.flag | retry.ExhaustedFlag()
		return s.SendLocalReply(res.code, res.body, nil, res.details, flag)
	}
	resp := res.resp
	h := http.Header{}
	for k, v := range resp.Header {
		if hcm.HopHeader(k) {
			continue
		}
		h[k] = v
	}
	h.Set("x-envoy-upstream-service-time", strconv.FormatInt(time.Since(res.started).Milliseconds(), 10))
	rt.ApplyResponseHeaders(h, wc, vars)
	s.Info.SetResponse(resp.StatusCode, "via_upstream")
	body := &upstreamBody{rc: resp.Body, done: func() {
		release()
		if res.cancel != nil {
			res.cancel()
		}
	}}
	s.Response = &hcm.Response{Status: resp.StatusCode, Header: h, Body: body, Trailer: func() http.Header { return resp.Trailer }}
	return hcm.Stop
}

// attempt sends one try to one host.
func (f *filter) attempt(s *hcm.Stream, cl *upstream.Cluster, req *http.Request, lbctx *upstream.LBContext, deadline time.Time, perTry time.Duration) attemptResult {
	res := attemptResult{started: time.Now()}
	host := cl.Choose(lbctx)
	if host == nil && cl.Config.GetType().String() == "ORIGINAL_DST" {
		host = upstream.OriginalDstHost(s.Info.DownstreamLocal)
	}
	if host == nil {
		res.flag, res.code, res.body, res.details = streaminfo.NoHealthyUpstream, http.StatusServiceUnavailable, bodyNoHealthyUpstream, "no_healthy_upstream"
		return res
	}
	res.host = host
	ctx := s.Context()
	var cancel context.CancelFunc = func() {}
	tryDeadline := deadline
	if perTry > 0 && (tryDeadline.IsZero() || time.Now().Add(perTry).Before(tryDeadline)) {
		tryDeadline = time.Now().Add(perTry)
	}
	if !tryDeadline.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, tryDeadline)
	}
	var local atomic.Value
	trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		if a := ci.Conn.LocalAddr(); a != nil {
			local.Store(a.String())
		}
	}}
	ctx = httptrace.WithClientTrace(ctx, trace)
	try := req.WithContext(ctx)
	cl.Stats.UpstreamRqTotal.Inc()
	cl.Stats.UpstreamRqActive.Inc()
	host.ActiveRequests.Add(1)
	resp, err := cl.RoundTrip(try, host, s.HTTP2)
	l, _ := local.Load().(string)
	s.Info.SetUpstream(host.Address, l)
	if err != nil {
		cl.Stats.UpstreamRqActive.Dec()
		host.ActiveRequests.Add(-1)
		cancel()
		res.err = err
		var ce *upstream.ConnectError
		switch {
		case s.Context().Err() != nil:
			res.flag = streaminfo.DownstreamConnectionTermination
		case errors.Is(ctx.Err(), context.DeadlineExceeded) && !tryDeadline.IsZero():
			cl.Stats.UpstreamRqTimeout.Inc()
			res.flag, res.code, res.body, res.details = streaminfo.UpstreamRequestTimeout, http.StatusGatewayTimeout, bodyTimeout, "upstream_response_timeout"
			cl.Stats.RecordResponse(http.StatusGatewayTimeout, time.Since(res.started))
		case errors.As(err, &ce):
			s.Info.SetUpstreamFailure(ce.Err.Error())
			res.flag, res.code = streaminfo.UpstreamConnectionFailure, http.StatusServiceUnavailable
			res.body = resetPrefix + "connection failure, transport failure reason: " + ce.Err.Error()
			res.details = "upstream_reset_before_response_started{connection_failure}"
			cl.Stats.RecordResponse(0, time.Since(res.started))
		default:
			res.flag, res.code = streaminfo.UpstreamConnectionTermination, http.StatusServiceUnavailable
			res.body = resetPrefix + "connection termination"
			res.details = "upstream_reset_before_response_started{connection_termination}"
			cl.Stats.RecordResponse(0, time.Since(res.started))
		}
		return res
	}
	res.resp = resp
	res.code = resp.StatusCode
	res.cancel = cancel
	started := res.started
	stats := cl.Stats
	var once sync.Once
	resp.Body = &upstreamBody{rc: resp.Body, done: func() {
		once.Do(func() {
			stats.UpstreamRqActive.Dec()
			host.ActiveRequests.Add(-1)
			stats.RecordResponse(resp.StatusCode, time.Since(started))
		})
	}}
	return res
}

// upstreamRequest builds the request sent upstream: the downstream request without
// hop-by-hop headers, with the route's rewrites and header mutations.
func (f *filter) upstreamRequest(s *hcm.Stream, rt *route.Route, wc *route.WeightedCluster, vars route.Vars) *http.Request {
	r := s.Request
	out := r.Clone(s.Context())
	out.RequestURI = ""
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
	if r.Body != nil && r.Body != http.NoBody {
		out.Body = &countingBody{rc: r.Body, info: s.Info}
	}
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

type countingBody struct {
	rc   io.ReadCloser
	info *streaminfo.Info
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.info.AddBytes(uint64(n), 0)
	}
	return n, err
}

func (b *countingBody) Close() error { return b.rc.Close() }

// upstreamBody runs done once, when the body is closed.
type upstreamBody struct {
	rc   io.ReadCloser
	once sync.Once
	done func()
}

func (b *upstreamBody) Read(p []byte) (int, error) { return b.rc.Read(p) }

func (b *upstreamBody) Close() error {
	err := b.rc.Close()
	b.once.Do(b.done)
	return err
}

var _ = fmt.Sprintf
