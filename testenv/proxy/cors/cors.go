// Package cors is Envoy's CORS filter (envoy.filters.http.cors) for meshproxy: the
// CorsPolicy of the route, virtual host (and weighted cluster, route configuration) from
// typed_per_filter_config, or else the legacy cors fields of the route and virtual host;
// preflight requests answered by the proxy, allowed origins echoed with credentials and
// exposed headers on other responses, filter_enabled and shadow_enabled, and the
// http.<stat_prefix>.cors.origin_valid / origin_invalid statistics.
package cors

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/route"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// TypeURL is the CORS filter's type URL.
const TypeURL = "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"

// policy is one compiled CorsPolicy (either message type).
type policy struct {
	origins                       []*route.StringMatcher
	methods, headers, expose, age string
	credentials, pna, forward     *bool
	enabled, shadow               *corev3.RuntimeFractionalPercent
}

type policySource interface {
	GetAllowOriginStringMatch() []*matcherv3.StringMatcher
	GetAllowMethods() string
	GetAllowHeaders() string
	GetExposeHeaders() string
	GetMaxAge() string
	GetAllowCredentials() *wrapperspb.BoolValue
	GetFilterEnabled() *corev3.RuntimeFractionalPercent
	GetShadowEnabled() *corev3.RuntimeFractionalPercent
	GetAllowPrivateNetworkAccess() *wrapperspb.BoolValue
	GetForwardNotMatchingPreflights() *wrapperspb.BoolValue
}

func boolOf(v *wrapperspb.BoolValue) *bool {
	if v == nil {
		return nil
	}
	b := v.GetValue()
	return &b
}

func compile(src policySource) (*policy, error) {
	p := &policy{methods: src.GetAllowMethods(), headers: src.GetAllowHeaders(), expose: src.GetExposeHeaders(),
		age: src.GetMaxAge(), credentials: boolOf(src.GetAllowCredentials()), pna: boolOf(src.GetAllowPrivateNetworkAccess()),
		forward: boolOf(src.GetForwardNotMatchingPreflights()), enabled: src.GetFilterEnabled(), shadow: src.GetShadowEnabled()}
	for i, m := range src.GetAllowOriginStringMatch() {
		sm, err := route.CompileStringMatcher(m)
		if err != nil {
			return nil, fmt.Errorf("allow_origin_string_match[%d]: %w", i, err)
		}
		p.origins = append(p.origins, sm)
	}
	return p, nil
}

func sample(f *corev3.RuntimeFractionalPercent, dflt bool) bool {
	if f == nil {
		return dflt
	}
	fp := f.GetDefaultValue()
	den := route.Denominator(fp)
	return rand.Uint64N(den) < uint64(fp.GetNumerator())
}

// Config is the configured filter (its own config is empty; policies come from routes).
type Config struct {
	name  string
	store *stats.Store
	mu    sync.Mutex
	stats map[string][2]*stats.Counter
}

// Factory builds the filter for TypeURL.
func Factory(ctx *hcm.Context, name string, a *anypb.Any) (hcm.FilterConfig, error) {
	p := &corsv3.Cors{}
	if err := a.UnmarshalTo(p); err != nil {
		return nil, err
	}
	if err := p.ValidateAll(); err != nil {
		return nil, err
	}
	return &Config{name: name, store: ctx.Store, stats: map[string][2]*stats.Counter{}}, nil
}

func (c *Config) counters(prefix string) [2]*stats.Counter {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cs, ok := c.stats[prefix]; ok {
		return cs
	}
	sc := c.store.Scope(prefix + "cors")
	cs := [2]*stats.Counter{sc.Counter("origin_valid"), sc.Counter("origin_invalid")}
	c.stats[prefix] = cs
	return cs
}

// NewFilter makes a stream's instance.
func (c *Config) NewFilter(s *hcm.Stream) (hcm.Filter, error) { return &filter{cfg: c}, nil }

type filter struct {
	cfg      *Config
	policies []*policy
	isCORS   bool
	origin   string
}

type policiesKey struct{ name string }

// policiesFor returns the route's policies, most specific first: typed_per_filter_config
// at every level, or (when there is none) the legacy route and virtual host cors fields.
func (f *filter) policiesFor(s *hcm.Stream) []*policy {
	rt := s.Route()
	if rt == nil {
		return nil
	}
	wc := s.RouteCluster()
	compileAll := func() any {
		var out []*policy
		for _, a := range rt.PerFilterConfigs(f.cfg.name, wc) {
			cp := &corsv3.CorsPolicy{}
			if err := a.UnmarshalTo(cp); err != nil {
				s.Log.Warn("cors: typed_per_filter_config is not a CorsPolicy", "route", rt.Name, "err", err)
				continue
			}
			if p, err := compile(cp); err == nil {
				out = append(out, p)
			} else {
				s.Log.Warn("cors: invalid policy", "route", rt.Name, "err", err)
			}
		}
		if len(out) > 0 {
			return out
		}
		var legacy []*routev3.CorsPolicy
		if rt.Action != nil && rt.Action.GetCors() != nil { //nolint:staticcheck // the legacy fields still configure CORS
			legacy = append(legacy, rt.Action.GetCors()) //nolint:staticcheck
		}
		if c := rt.VHost.Proto.GetCors(); c != nil { //nolint:staticcheck
			legacy = append(legacy, c)
		}
		for _, c := range legacy {
			if p, err := compile(c); err == nil {
				out = append(out, p)
			}
		}
		return out
	}
	if wc != nil && wc.Proto != nil {
		// Weighted clusters may carry their own policy: not cached per route.
		return compileAll().([]*policy)
	}
	return rt.Memo(policiesKey{f.cfg.name}, compileAll).([]*policy)
}

func (f *filter) origins() []*route.StringMatcher {
	for _, p := range f.policies {
		if len(p.origins) > 0 {
			return p.origins
		}
	}
	return nil
}

func (f *filter) str(get func(*policy) string) string {
	for _, p := range f.policies {
		if v := get(p); v != "" {
			return v
		}
	}
	return ""
}

func (f *filter) flag(get func(*policy) *bool, dflt bool) bool {
	for _, p := range f.policies {
		if v := get(p); v != nil {
			return *v
		}
	}
	return dflt
}

func (f *filter) originAllowed(origin string) bool {
	for _, m := range f.origins() {
		if m.Match("*") || m.Match(origin) {
			return true
		}
	}
	return false
}

func (f *filter) DecodeHeaders(s *hcm.Stream) hcm.Status {
	f.policies = f.policiesFor(s)
	if len(f.policies) == 0 {
		return hcm.Continue
	}
	enabled := sample(f.policies[0].enabled, true)
	shadow := sample(f.policies[0].shadow, false)
	if !enabled && !shadow {
		return hcm.Continue
	}
	r := s.Request
	origin := r.Header.Get("origin")
	if origin == "" {
		return hcm.Continue
	}
	allowed := f.originAllowed(origin)
	cs := f.cfg.counters(s.StatPrefix)
	if allowed {
		cs[0].Inc()
		f.origin = origin
	} else {
		cs[1].Inc()
	}
	if !enabled {
		return hcm.Continue // shadow mode: statistics only
	}
	f.isCORS = true
	if r.Method != http.MethodOptions || r.Header.Get("access-control-request-method") == "" {
		return hcm.Continue
	}
	// A preflight request.
	if !allowed && f.flag(func(p *policy) *bool { return p.forward }, true) {
		return hcm.Continue
	}
	h := http.Header{}
	if allowed {
		h.Set("access-control-allow-origin", origin)
	}
	if f.flag(func(p *policy) *bool { return p.credentials }, false) {
		h.Set("access-control-allow-credentials", "true")
	}
	if m := f.str(func(p *policy) string { return p.methods }); m == "*" {
		h.Set("access-control-allow-methods", r.Header.Get("access-control-request-method"))
	} else if m != "" {
		h.Set("access-control-allow-methods", m)
	}
	if hs := f.str(func(p *policy) string { return p.headers }); hs == "*" {
		if v := r.Header.Get("access-control-request-headers"); v != "" {
			h.Set("access-control-allow-headers", v)
		}
	} else if hs != "" {
		h.Set("access-control-allow-headers", hs)
	}
	if age := f.str(func(p *policy) string { return p.age }); age != "" {
		h.Set("access-control-max-age", age)
	}
	if f.flag(func(p *policy) *bool { return p.pna }, false) && r.Header.Get("access-control-request-private-network") == "true" {
		h.Set("access-control-allow-private-network", "true")
	}
	s.Response = &hcm.Response{Status: http.StatusOK, Header: h, Local: true}
	s.Info.SetResponse(http.StatusOK, "cors_response")
	return hcm.Stop
}

func (f *filter) EncodeHeaders(s *hcm.Stream) hcm.Status {
	if !f.isCORS || f.origin == "" || s.Response == nil {
		return hcm.Continue
	}
	h := s.Response.Header
	if h == nil {
		h = http.Header{}
		s.Response.Header = h
	}
	h.Set("access-control-allow-origin", f.origin)
	if f.flag(func(p *policy) *bool { return p.credentials }, false) {
		h.Set("access-control-allow-credentials", "true")
	}
	if e := f.str(func(p *policy) string { return p.expose }); e != "" {
		h.Set("access-control-expose-headers", e)
	}
	return hcm.Continue
}

func (f *filter) Log(*hcm.Stream)     {}
func (f *filter) Destroy(*hcm.Stream) {}
