package rbac

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"

	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// HTTPTypeURL is the HTTP filter's type URL.
const HTTPTypeURL = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"

// DeniedBody is the body of Envoy's 403 for a denied request.
const DeniedBody = "RBAC: access denied"

// The FilterState keys under which a stream's RBAC results are kept for the access log
// and later filters: Envoy's dynamic metadata of the filter.
const (
	ShadowEffectivePolicyID = "envoy.filters.http.rbac.shadow_effective_policy_id"
	ShadowEngineResult      = "envoy.filters.http.rbac.shadow_engine_result"
	AccessLogHint           = "envoy.common.access_log_hint"
)

// engines are the enforced and shadow engines of one filter (either may be nil).
type engines struct{ rules, shadow *Engine }

func compileEngines(rules, shadow *rbacv3.RBAC, matcher, shadowMatcher bool) (engines, error) {
	var e engines
	var err error
	if matcher || shadowMatcher {
		return e, fmt.Errorf("matcher and shadow_matcher are not supported; use rules and shadow_rules")
	}
	if rules != nil {
		if e.rules, err = Compile(rules); err != nil {
			return e, fmt.Errorf("rules: %w", err)
		}
	}
	if shadow != nil {
		if e.shadow, err = Compile(shadow); err != nil {
			return e, fmt.Errorf("shadow_rules: %w", err)
		}
	}
	return e, nil
}

// counters are a filter's statistics in a scope: <prefix>rbac.[<rules prefix>]allowed and
// denied, <prefix>rbac.<shadow prefix>shadow_allowed and shadow_denied.
type counters struct{ allowed, denied, shadowAllowed, shadowDenied *stats.Counter }

func newCounters(store *stats.Store, prefix, rulesPrefix, shadowPrefix string) *counters {
	p := prefix + "rbac."
	return &counters{allowed: store.Counter(p + rulesPrefix + "allowed"), denied: store.Counter(p + rulesPrefix + "denied"),
		shadowAllowed: store.Counter(p + shadowPrefix + "shadow_allowed"), shadowDenied: store.Counter(p + shadowPrefix + "shadow_denied")}
}

// HTTPConfig is a configured envoy.filters.http.rbac.
type HTTPConfig struct {
	engines
	store                     *stats.Store
	rulesPrefix, shadowPrefix string
	counters                  sync.Map // connection manager stat prefix → *counters
}

// HTTPFactory builds the HTTP filter for HTTPTypeURL.
func HTTPFactory(ctx *hcm.Context, _ string, a *anypb.Any) (hcm.FilterConfig, error) {
	p := &rbachttp.RBAC{}
	if err := a.UnmarshalTo(p); err != nil {
		return nil, err
	}
	if err := p.ValidateAll(); err != nil {
		return nil, err
	}
	e, err := compileEngines(p.GetRules(), p.GetShadowRules(), p.GetMatcher() != nil, p.GetShadowMatcher() != nil)
	if err != nil {
		return nil, err
	}
	return &HTTPConfig{engines: e, store: ctx.Store, rulesPrefix: p.GetRulesStatPrefix(), shadowPrefix: p.GetShadowRulesStatPrefix()}, nil
}

// NewFilter makes a stream's instance.
func (c *HTTPConfig) NewFilter(s *hcm.Stream) (hcm.Filter, error) {
	st, ok := c.counters.Load(s.StatPrefix)
	if !ok {
		st, _ = c.counters.LoadOrStore(s.StatPrefix, newCounters(c.store, s.StatPrefix, c.rulesPrefix, c.shadowPrefix))
	}
	return &httpFilter{cfg: c, st: st.(*counters)}, nil
}

type httpFilter struct {
	cfg *HTTPConfig
	st  *counters
}

// DecodeHeaders evaluates the shadow rules (counted and recorded, never enforced), then the
// rules: a denied request gets Envoy's 403 with the matched policy in the details.
func (f *httpFilter) DecodeHeaders(s *hcm.Stream) hcm.Status {
	in := streamInput(s)
	if e := f.cfg.shadow; e != nil {
		d := e.Evaluate(in)
		result := "allowed"
		if d.Allowed {
			f.st.shadowAllowed.Inc()
		} else {
			result = "denied"
			f.st.shadowDenied.Inc()
		}
		if s.FilterState != nil {
			s.FilterState[ShadowEngineResult] = result
			if d.Matched {
				s.FilterState[ShadowEffectivePolicyID] = d.PolicyID
			}
		}
	}
	e := f.cfg.rules
	if e == nil {
		return hcm.Continue
	}
	d := e.Evaluate(in)
	if e.Action() == rbacv3.RBAC_LOG && d.Matched && s.FilterState != nil {
		s.FilterState[AccessLogHint] = true
	}
	if d.Allowed {
		f.st.allowed.Inc()
		return hcm.Continue
	}
	f.st.denied.Inc()
	return s.SendLocalReply(http.StatusForbidden, DeniedBody, nil, ResponseDetails(d), 0)
}

// ResponseDetails is Envoy's response code details of a denial: the policy that matched
// (a DENY policy), or "none" when no ALLOW policy did.
func ResponseDetails(d Decision) string {
	id := "none"
	if d.Matched {
		id = strings.Join(strings.Fields(d.PolicyID), "_")
	}
	return "rbac_access_denied_matched_policy[" + id + "]"
}

func (f *httpFilter) EncodeHeaders(*hcm.Stream) hcm.Status { return hcm.Continue }
func (f *httpFilter) Log(*hcm.Stream)                      {}
func (f *httpFilter) Destroy(*hcm.Stream)                  {}

// streamInput is what the engine sees of a stream: the connection's addresses and TLS, and
// the request.
func streamInput(s *hcm.Stream) *Input {
	in := &Input{Request: s.Request, DirectRemote: hostAddr(s.Info.DownstreamPeer), TLS: s.Info.DownstreamTLS}
	if ap, err := netip.ParseAddrPort(s.Info.DownstreamLocal); err == nil {
		in.Local = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	in.Remote = in.DirectRemote
	// With use_remote_address false (Istio's sidecars) and no trusted hops, Envoy takes the
	// original client from the last x-forwarded-for address.
	if xff := s.Request.Header.Values("x-forwarded-for"); len(xff) > 0 {
		parts := strings.Split(xff[len(xff)-1], ",")
		if a, err := netip.ParseAddr(strings.TrimSpace(parts[len(parts)-1])); err == nil {
			in.Remote = a.Unmap()
		}
	}
	return in
}

func hostAddr(hostport string) netip.Addr {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		h = hostport
	}
	a, err := netip.ParseAddr(h)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap()
}
