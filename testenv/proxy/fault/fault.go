// Package fault is Envoy's fault injection filter (envoy.filters.http.fault) for
// meshproxy: request delays, aborts (HTTP or gRPC status) and response rate limits, each
// by a FractionalPercent, limited to requests for an upstream cluster, from downstream
// nodes and matching headers, optionally controlled by the x-envoy-fault-* request headers,
// with max_active_faults, the DI and FI response flags and the
// http.<stat_prefix>.fault.* statistics. A route's typed_per_filter_config replaces the
// filter's configuration for that route, as in Envoy (Istio configures faults that way).
package fault

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	faultcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/fault/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/route"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

// TypeURL is the fault filter's type URL.
const TypeURL = "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"

// The request headers that control faults when the configuration allows it.
const (
	hdrAbort           = "x-envoy-fault-abort-request"
	hdrAbortGRPC       = "x-envoy-fault-abort-grpc-request"
	hdrAbortPercent    = "x-envoy-fault-abort-request-percentage"
	hdrDelay           = "x-envoy-fault-delay-request"
	hdrDelayPercent    = "x-envoy-fault-delay-request-percentage"
	hdrThroughput      = "x-envoy-fault-throughput-response"
	hdrThroughputPct   = "x-envoy-fault-throughput-response-percentage"
	hdrDownstreamNode  = "x-envoy-downstream-service-node"
	hdrDownstreamClust = "x-envoy-downstream-service-cluster"
)

// settings are one compiled HTTPFault (the filter's, or a route's).
type settings struct {
	delay          *faultcommonv3.FaultDelay
	abort          *faultv3.FaultAbort
	rateLimit      *faultcommonv3.FaultRateLimit
	upstream       string
	nodes          map[string]bool
	headers        route.HeaderMatchers
	maxActive      uint64
	hasMaxActive   bool
	noClusterStats bool
}

func compile(p *faultv3.HTTPFault) (*settings, error) {
	if err := p.ValidateAll(); err != nil {
		return nil, err
	}
	s := &settings{delay: p.GetDelay(), abort: p.GetAbort(), rateLimit: p.GetResponseRateLimit(),
		upstream: p.GetUpstreamCluster(), noClusterStats: p.GetDisableDownstreamClusterStats()}
	if len(p.GetDownstreamNodes()) > 0 {
		s.nodes = map[string]bool{}
		for _, n := range p.GetDownstreamNodes() {
			s.nodes[n] = true
		}
	}
	var err error
	if s.headers, err = route.CompileHeaderMatchers(p.GetHeaders()); err != nil {
		return nil, fmt.Errorf("headers: %w", err)
	}
	if m := p.GetMaxActiveFaults(); m != nil {
		s.maxActive, s.hasMaxActive = uint64(m.GetValue()), true
	}
	return s, nil
}

// Config is the configured filter.
type Config struct {
	name     string
	settings *settings
	store    *stats.Store

	mu    sync.Mutex
	stats map[string]*faultStats // by connection manager stat prefix
}

type faultStats struct {
	scope                                 stats.Scope
	delays, aborts, rateLimited, overflow *stats.Counter
	active                                *stats.Gauge
}

// Factory builds the filter for TypeURL.
func Factory(ctx *hcm.Context, name string, a *anypb.Any) (hcm.FilterConfig, error) {
	p := &faultv3.HTTPFault{}
	if err := a.UnmarshalTo(p); err != nil {
		return nil, err
	}
	s, err := compile(p)
	if err != nil {
		return nil, err
	}
	return &Config{name: name, settings: s, store: ctx.Store, stats: map[string]*faultStats{}}, nil
}

func (c *Config) statsFor(prefix string) *faultStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.stats[prefix]; st != nil {
		return st
	}
	sc := c.store.Scope(prefix + "fault")
	st := &faultStats{scope: sc, delays: sc.Counter("delays_injected"), aborts: sc.Counter("aborts_injected"),
		rateLimited: sc.Counter("response_rl_injected"), overflow: sc.Counter("faults_overflow"), active: sc.Gauge("active_faults")}
	c.stats[prefix] = st
	return st
}

// NewFilter makes a stream's instance.
func (c *Config) NewFilter(s *hcm.Stream) (hcm.Filter, error) {
	return &filter{cfg: c, st: c.statsFor(s.StatPrefix)}, nil
}

type filter struct {
	cfg     *Config
	st      *faultStats
	active  bool
	limitKB uint64
}

type perRouteKey struct{ name string }

// settingsFor returns the route's fault settings when it has its own, else the filter's.
func (f *filter) settingsFor(s *hcm.Stream) *settings {
	rt := s.Route()
	if rt == nil {
		return f.cfg.settings
	}
	v := rt.Memo(perRouteKey{f.cfg.name}, func() any {
		a := rt.PerFilterConfig(f.cfg.name, s.RouteCluster())
		if a == nil {
			return (*settings)(nil)
		}
		p := &faultv3.HTTPFault{}
		if err := a.UnmarshalTo(p); err != nil {
			s.Log.Warn("fault: typed_per_filter_config is not an HTTPFault", "route", rt.Name, "err", err)
			return (*settings)(nil)
		}
		st, err := compile(p)
		if err != nil {
			s.Log.Warn("fault: invalid typed_per_filter_config", "route", rt.Name, "err", err)
			return (*settings)(nil)
		}
		return st
	}).(*settings)
	if v != nil {
		return v
	}
	return f.cfg.settings
}

// enabled samples a FractionalPercent, the numerator optionally lowered by a request
// header (never raised above the configured one).
func enabled(p *typev3.FractionalPercent, r *http.Request, header string) bool {
	num := uint64(p.GetNumerator())
	if v := r.Header.Get(header); v != "" && header != "" {
		if n, err := strconv.ParseUint(v, 10, 32); err == nil {
			num = min(num, n)
		}
	}
	den := route.Denominator(p)
	return rand.Uint64N(den) < num
}

func (f *filter) inject() {
	if !f.active {
		f.active = true
		f.st.active.Inc()
	}
}

func (f *filter) DecodeHeaders(s *hcm.Stream) hcm.Status {
	cfg := f.settingsFor(s)
	r := s.Request
	if cfg.hasMaxActive && uint64(max(f.st.active.Value(), 0)) >= cfg.maxActive {
		f.st.overflow.Inc()
		return hcm.Continue
	}
	if cfg.upstream != "" {
		wc := s.RouteCluster()
		if wc == nil || wc.Name != cfg.upstream {
			return hcm.Continue
		}
	}
	if cfg.nodes != nil && !cfg.nodes[r.Header.Get(hdrDownstreamNode)] {
		return hcm.Continue
	}
	if !cfg.headers.Match(r) {
		return hcm.Continue
	}
	downstream := ""
	if !cfg.noClusterStats {
		downstream = r.Header.Get(hdrDownstreamClust)
	}
	f.setupRateLimit(cfg, r)
	if d, ok := delayOf(cfg.delay, r); ok {
		f.inject()
		f.st.delays.Inc()
		if downstream != "" {
			f.st.scope.Counter(downstream + ".delays_injected").Inc()
		}
		s.Info.AddFlag(streaminfo.DelayInjected)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-s.Context().Done():
			t.Stop()
			s.Info.AddFlag(streaminfo.DownstreamConnectionTermination)
			s.Response = &hcm.Response{Local: true}
			return hcm.Stop
		}
	}
	if code, grpc, ok := abortOf(cfg.abort, r); ok {
		f.inject()
		f.st.aborts.Inc()
		if downstream != "" {
			f.st.scope.Counter(downstream + ".aborts_injected").Inc()
		}
		return s.SendLocalReplyGRPC(code, "fault filter abort", nil, "fault_filter_abort", streaminfo.FaultInjected, grpc)
	}
	return hcm.Continue
}

// delayOf decides the request's delay: a fixed delay or, with header_delay, the
// x-envoy-fault-delay-request milliseconds.
func delayOf(d *faultcommonv3.FaultDelay, r *http.Request) (time.Duration, bool) {
	if d == nil {
		return 0, false
	}
	var dur time.Duration
	pctHeader := ""
	switch t := d.GetFaultDelaySecifier().(type) {
	case *faultcommonv3.FaultDelay_FixedDelay:
		dur = t.FixedDelay.AsDuration()
	case *faultcommonv3.FaultDelay_HeaderDelay_:
		ms, err := strconv.ParseUint(r.Header.Get(hdrDelay), 10, 63)
		if err != nil {
			return 0, false
		}
		dur, pctHeader = time.Duration(ms)*time.Millisecond, hdrDelayPercent
	}
	if dur <= 0 || !enabled(d.GetPercentage(), r, pctHeader) {
		return 0, false
	}
	return dur, true
}

// abortOf decides the request's abort: the configured HTTP or gRPC status or, with
// header_abort, the x-envoy-fault-abort-request / -grpc-request value.
func abortOf(a *faultv3.FaultAbort, r *http.Request) (code, grpc int, ok bool) {
	if a == nil {
		return 0, -1, false
	}
	grpc = -1
	pctHeader := ""
	switch t := a.GetErrorType().(type) {
	case *faultv3.FaultAbort_HttpStatus:
		code = int(t.HttpStatus)
	case *faultv3.FaultAbort_GrpcStatus:
		code, grpc = http.StatusOK, int(t.GrpcStatus)
	case *faultv3.FaultAbort_HeaderAbort_:
		pctHeader = hdrAbortPercent
		if v, err := strconv.Atoi(r.Header.Get(hdrAbort)); err == nil && v >= 200 && v < 600 {
			code = v
		}
		if v, err := strconv.Atoi(r.Header.Get(hdrAbortGRPC)); err == nil && v >= 0 && v <= 16 {
			code, grpc = http.StatusOK, v
		}
		if code == 0 {
			return 0, -1, false
		}
	}
	if !enabled(a.GetPercentage(), r, pctHeader) {
		return 0, -1, false
	}
	return code, grpc, true
}

func (f *filter) setupRateLimit(cfg *settings, r *http.Request) {
	rl := cfg.rateLimit
	if rl == nil {
		return
	}
	var kbps uint64
	pctHeader := ""
	switch t := rl.GetLimitType().(type) {
	case *faultcommonv3.FaultRateLimit_FixedLimit_:
		kbps = t.FixedLimit.GetLimitKbps()
	case *faultcommonv3.FaultRateLimit_HeaderLimit_:
		v, err := strconv.ParseUint(r.Header.Get(hdrThroughput), 10, 63)
		if err != nil || v == 0 {
			return
		}
		kbps, pctHeader = v, hdrThroughputPct
	}
	if kbps == 0 || !enabled(rl.GetPercentage(), r, pctHeader) {
		return
	}
	f.inject()
	f.st.rateLimited.Inc()
	f.limitKB = kbps
}

func (f *filter) EncodeHeaders(s *hcm.Stream) hcm.Status {
	if f.limitKB > 0 && s.Response != nil && s.Response.Body != nil {
		s.Response.Body = &limitedBody{rc: s.Response.Body, bytesPerTick: max(int(f.limitKB*1024/16), 1)}
	}
	return hcm.Continue
}

func (f *filter) Log(*hcm.Stream) {}

func (f *filter) Destroy(*hcm.Stream) {
	if f.active {
		f.st.active.Dec()
	}
}

// limitedBody releases at most the rate limit's worth of bytes every 1/16 s, as Envoy's
// StreamRateLimiter does.
type limitedBody struct {
	rc           io.ReadCloser
	bytesPerTick int
	next         time.Time
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if !b.next.IsZero() {
		if d := time.Until(b.next); d > 0 {
			time.Sleep(d)
		}
	}
	if len(p) > b.bytesPerTick {
		p = p[:b.bytesPerTick]
	}
	n, err := b.rc.Read(p)
	b.next = time.Now().Add(time.Second / 16 * time.Duration(n) / time.Duration(b.bytesPerTick))
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }
