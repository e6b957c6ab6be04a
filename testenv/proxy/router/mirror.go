package router

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/route"
	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
)

// mirrorPolicy is one compiled request_mirror_policies entry.
type mirrorPolicy struct {
	cluster       string
	clusterHeader string
	fraction      fraction
	noSuffix      bool
}

// fraction is a FractionalPercent: enabled when a random value modulo the denominator is
// below the numerator (Envoy's featureEnabled with the runtime default).
type fraction struct{ numerator, denominator uint64 }

func fractionOf(fp *typev3.FractionalPercent) fraction {
	if fp == nil {
		return fraction{numerator: 100, denominator: 100}
	}
	return fraction{numerator: uint64(fp.GetNumerator()), denominator: route.Denominator(fp)}
}

func (f fraction) sample() bool { return rand.Uint64N(f.denominator) < f.numerator }

func compileMirrors(ps []*routev3.RouteAction_RequestMirrorPolicy) []mirrorPolicy {
	out := make([]mirrorPolicy, 0, len(ps))
	for _, p := range ps {
		mp := mirrorPolicy{cluster: p.GetCluster(), clusterHeader: p.GetClusterHeader(),
			fraction: fraction{numerator: 100, denominator: 100}, noSuffix: p.GetDisableShadowHostSuffixAppend()}
		if rf := p.GetRuntimeFraction(); rf != nil {
			mp.fraction = fractionOf(rf.GetDefaultValue())
		}
		out = append(out, mp)
	}
	return out
}

// shadowHost appends Envoy's "-shadow" suffix to the authority's host part, keeping a port:
// "svc:8080" becomes "svc-shadow:8080".
func shadowHost(host string) string {
	// Envoy's HeaderUtility::getPortStart: the last ':' not inside an IPv6 literal.
	port := strings.LastIndexByte(host, ':')
	if port < 0 || port < strings.LastIndexByte(host, ']') || port+1 > len(host) {
		return host + "-shadow"
	}
	return host[:port] + "-shadow" + host[port:]
}

// mirrorTarget is a mirror chosen for one request.
type mirrorTarget struct {
	cl       *upstream.Cluster
	noSuffix bool
}

// selectMirrors samples the route's mirror policies for one request (Envoy decides when
// the request headers arrive); policies whose cluster is unknown are skipped.
func selectMirrors(pols []mirrorPolicy, req *http.Request, clusters *upstream.Manager) []mirrorTarget {
	var out []mirrorTarget
	for _, p := range pols {
		if !p.fraction.sample() {
			continue
		}
		name := p.cluster
		if p.clusterHeader != "" {
			name = req.Header.Get(p.clusterHeader)
		}
		if name == "" {
			continue
		}
		if cl := clusters.Get(name); cl != nil {
			out = append(out, mirrorTarget{cl: cl, noSuffix: p.noSuffix})
		}
	}
	return out
}

// mirror sends a shadow copy of the upstream request (its headers after the route's
// mutations, its body as it arrives) to each target, fire and forget: the response is read
// and dropped, failures only show in the shadow cluster's statistics. A shadow lives on
// after the downstream stream, bounded by the route timeout and the server's lifetime.
func mirror(clusters *upstream.Manager, targets []mirrorTarget, out *http.Request, body *requestBody, timeout time.Duration, http2 bool) {
	for _, t := range targets {
		req := &http.Request{Method: out.Method, URL: cloneURL(out), Header: out.Header.Clone(),
			Host: out.Host, Proto: out.Proto, ProtoMajor: out.ProtoMajor, ProtoMinor: out.ProtoMinor,
			ContentLength: out.ContentLength}
		if !t.noSuffix {
			req.Host = shadowHost(req.Host)
		}
		if body != nil {
			req.Body = body.cursor(false)
		}
		go shadow(clusters.Context(), t.cl, req, timeout, http2)
	}
}

func cloneURL(r *http.Request) *url.URL {
	u := *r.URL
	return &u
}

func shadow(parent context.Context, cl *upstream.Cluster, req *http.Request, timeout time.Duration, http2 bool) {
	ctx, cancel := context.WithCancel(parent)
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(parent, timeout)
	}
	defer cancel()
	host := cl.Choose(&upstream.LBContext{Request: req})
	if host == nil {
		return
	}
	useH2 := cl.UsesHTTP2(http2)
	release, err := cl.Breakers(0).Acquire(ctx, useH2)
	if err != nil {
		return
	}
	defer release()
	started := time.Now()
	cl.Stats.UpstreamRqTotal.Inc()
	cl.Stats.UpstreamRqActive.Inc()
	host.RequestStarted()
	defer func() {
		cl.Stats.UpstreamRqActive.Dec()
		host.RequestFinished()
	}()
	resp, err := cl.RoundTrip(req.WithContext(ctx), host, http2)
	if err != nil {
		cl.ReportResult(host, upstream.LocalOriginConnectFailed)
		cl.Stats.RecordResponse(http.StatusServiceUnavailable, time.Since(started))
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	cl.ReportStatus(host, resp.StatusCode)
	cl.Stats.RecordResponse(resp.StatusCode, time.Since(started))
}
