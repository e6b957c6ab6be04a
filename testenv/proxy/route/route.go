// Package route compiles an Envoy RouteConfiguration into a matcher: virtual hosts by
// domain (exact, suffix and prefix wildcards, then "*"), routes by path (prefix, path,
// safe regex, path-separated prefix), headers and query parameters, and the route actions
// the router carries out (clusters, weighted clusters, rewrites, redirects, direct
// responses, header manipulation).
package route

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// DefaultTimeout is Envoy's default route timeout.
const DefaultTimeout = 15 * time.Second

// Config is a compiled route configuration.
type Config struct {
	Name  string
	Proto *routev3.RouteConfiguration

	exact    map[string]*VirtualHost
	suffix   []wildcard // "*.example.com", longest first
	prefix   []wildcard // "example.*", longest first
	catchAll *VirtualHost
	headers  HeaderOps
}

type wildcard struct {
	part string
	vh   *VirtualHost
}

// VirtualHost is a compiled virtual host.
type VirtualHost struct {
	Name    string
	Proto   *routev3.VirtualHost
	Routes  []*Route
	headers HeaderOps
	config  *Config
}

// Route is a compiled route.
type Route struct {
	Name  string
	Proto *routev3.Route
	VHost *VirtualHost

	match   matcher
	headers HeaderOps

	// Action fields; at most one of Clusters, Redirect, Direct is set.
	Clusters      []WeightedCluster
	totalWeight   uint32
	ClusterHeader string
	Redirect      *routev3.RedirectAction
	Direct        *routev3.DirectResponseAction
	Action        *routev3.RouteAction

	memo sync.Map
}

// Memo returns the value cached under key for this route, building it once. Filters keep
// what they compile from a route's configuration (retry, hash and mirror policies, per
// filter configs) here, so it lives exactly as long as the route configuration.
func (r *Route) Memo(key any, build func() any) any {
	if v, ok := r.memo.Load(key); ok {
		return v
	}
	v, _ := r.memo.LoadOrStore(key, build())
	return v
}

// WeightedCluster is one target of a route.
type WeightedCluster struct {
	Name    string
	Weight  uint32
	headers HeaderOps
	Proto   *routev3.WeightedCluster_ClusterWeight
}

// Compile compiles rc; errors name the virtual host and route.
func Compile(rc *routev3.RouteConfiguration) (*Config, error) {
	if err := rc.ValidateAll(); err != nil {
		return nil, fmt.Errorf("route configuration %s: %w", rc.GetName(), err)
	}
	c := &Config{Name: rc.GetName(), Proto: rc, exact: map[string]*VirtualHost{}}
	var err error
	if c.headers, err = compileHeaders(rc.GetRequestHeadersToAdd(), rc.GetRequestHeadersToRemove(),
		rc.GetResponseHeadersToAdd(), rc.GetResponseHeadersToRemove()); err != nil {
		return nil, fmt.Errorf("route configuration %s: %w", rc.GetName(), err)
	}
	for _, vhp := range rc.GetVirtualHosts() {
		vh, err := compileVHost(c, vhp)
		if err != nil {
			return nil, fmt.Errorf("route configuration %s: virtual host %s: %w", rc.GetName(), vhp.GetName(), err)
		}
		for _, d := range vhp.GetDomains() {
			d = strings.ToLower(d)
			switch {
			case d == "*":
				if c.catchAll != nil {
					return nil, fmt.Errorf("route configuration %s: only a single wildcard domain is permitted (virtual host %s)", rc.GetName(), vhp.GetName())
				}
				c.catchAll = vh
			case strings.HasPrefix(d, "*"):
				c.suffix = append(c.suffix, wildcard{part: d[1:], vh: vh})
			case strings.HasSuffix(d, "*"):
				c.prefix = append(c.prefix, wildcard{part: d[:len(d)-1], vh: vh})
			default:
				if _, dup := c.exact[d]; dup {
					return nil, fmt.Errorf("route configuration %s: duplicate domain %q (virtual host %s)", rc.GetName(), d, vhp.GetName())
				}
				c.exact[d] = vh
			}
		}
	}
	sort.SliceStable(c.suffix, func(i, j int) bool { return len(c.suffix[i].part) > len(c.suffix[j].part) })
	sort.SliceStable(c.prefix, func(i, j int) bool { return len(c.prefix[i].part) > len(c.prefix[j].part) })
	return c, nil
}

// validateAction rejects what the router could only fail on at request time: hash policies
// it cannot compute and retry back-off intervals out of order.
func validateAction(a *routev3.RouteAction) error {
	for i, hp := range a.GetHashPolicy() {
		switch s := hp.GetPolicySpecifier().(type) {
		case *routev3.RouteAction_HashPolicy_Header_:
			if rr := s.Header.GetRegexRewrite(); rr != nil {
				if _, err := regexp.Compile(rr.GetPattern().GetRegex()); err != nil {
					return fmt.Errorf("hash_policy[%d].header.regex_rewrite: %w", i, err)
				}
			}
		case *routev3.RouteAction_HashPolicy_Cookie_, *routev3.RouteAction_HashPolicy_ConnectionProperties_,
			*routev3.RouteAction_HashPolicy_QueryParameter_:
		default:
			return fmt.Errorf("hash_policy[%d]: %T is not supported", i, s)
		}
	}
	if err := validateRetry(a.GetRetryPolicy()); err != nil {
		return err
	}
	return nil
}

func validateRetry(rp *routev3.RetryPolicy) error {
	bo := rp.GetRetryBackOff()
	if bo == nil || bo.GetMaxInterval() == nil {
		return nil
	}
	if bo.GetMaxInterval().AsDuration() < bo.GetBaseInterval().AsDuration() {
		return fmt.Errorf("retry_policy.retry_back_off: max_interval must be greater than or equal to the base_interval")
	}
	return nil
}

func compileVHost(c *Config, p *routev3.VirtualHost) (*VirtualHost, error) {
	vh := &VirtualHost{Name: p.GetName(), Proto: p, config: c}
	if err := validateRetry(p.GetRetryPolicy()); err != nil {
		return nil, err
	}
	var err error
	if vh.headers, err = compileHeaders(p.GetRequestHeadersToAdd(), p.GetRequestHeadersToRemove(),
		p.GetResponseHeadersToAdd(), p.GetResponseHeadersToRemove()); err != nil {
		return nil, err
	}
	for i, rp := range p.GetRoutes() {
		r, err := compileRoute(vh, rp)
		if err != nil {
			return nil, fmt.Errorf("route %d (%s): %w", i, rp.GetName(), err)
		}
		vh.Routes = append(vh.Routes, r)
	}
	return vh, nil
}

func compileRoute(vh *VirtualHost, p *routev3.Route) (*Route, error) {
	r := &Route{Name: p.GetName(), Proto: p, VHost: vh}
	m, err := compileMatch(p.GetMatch())
	if err != nil {
		return nil, err
	}
	r.match = m
	if r.headers, err = compileHeaders(p.GetRequestHeadersToAdd(), p.GetRequestHeadersToRemove(),
		p.GetResponseHeadersToAdd(), p.GetResponseHeadersToRemove()); err != nil {
		return nil, err
	}
	switch a := p.GetAction().(type) {
	case *routev3.Route_Route:
		r.Action = a.Route
		switch s := a.Route.GetClusterSpecifier().(type) {
		case *routev3.RouteAction_Cluster:
			r.Clusters = []WeightedCluster{{Name: s.Cluster, Weight: 1}}
		case *routev3.RouteAction_WeightedClusters:
			for _, wc := range s.WeightedClusters.GetClusters() {
				h, err := compileHeaders(wc.GetRequestHeadersToAdd(), wc.GetRequestHeadersToRemove(),
					wc.GetResponseHeadersToAdd(), wc.GetResponseHeadersToRemove())
				if err != nil {
					return nil, fmt.Errorf("weighted cluster %s: %w", wc.GetName(), err)
				}
				w := wc.GetWeight().GetValue()
				r.Clusters = append(r.Clusters, WeightedCluster{Name: wc.GetName(), Weight: w, headers: h, Proto: wc})
				r.totalWeight += w
			}
			if r.totalWeight == 0 {
				return nil, fmt.Errorf("weighted clusters: total weight is zero")
			}
		case *routev3.RouteAction_ClusterHeader:
			r.ClusterHeader = strings.ToLower(s.ClusterHeader)
		default:
			return nil, fmt.Errorf("cluster specifier %T is not supported", s)
		}
		if rr := a.Route.GetRegexRewrite(); rr != nil {
			if _, err := regexp.Compile(rr.GetPattern().GetRegex()); err != nil {
				return nil, fmt.Errorf("regex_rewrite: %w", err)
			}
		}
		if err := validateAction(a.Route); err != nil {
			return nil, err
		}
	case *routev3.Route_Redirect:
		r.Redirect = a.Redirect
	case *routev3.Route_DirectResponse:
		r.Direct = a.DirectResponse
	case *routev3.Route_NonForwardingAction:
		return nil, fmt.Errorf("non_forwarding_action is not supported")
	default:
		return nil, fmt.Errorf("route has no action")
	}
	return r, nil
}

// VirtualHostFor selects the virtual host for an authority, Envoy's order: exact domain,
// longest suffix wildcard, longest prefix wildcard, then "*". When nothing matches and
// the authority has a port, the port-less authority is tried as well (Envoy's
// strip-any-host-port behaviour that Istio relies on for "host:port" requests).
func (c *Config) VirtualHostFor(authority string) *VirtualHost {
	host := strings.ToLower(authority)
	if vh := c.lookup(host); vh != nil {
		return vh
	}
	if h, _, ok := strings.Cut(host, ":"); ok && !strings.Contains(h, "]") && h != "" {
		if vh := c.lookup(h); vh != nil {
			return vh
		}
	}
	return c.catchAll
}

func (c *Config) lookup(host string) *VirtualHost {
	if vh := c.exact[host]; vh != nil {
		return vh
	}
	for _, w := range c.suffix {
		if len(host) > len(w.part) && strings.HasSuffix(host, w.part) {
			return w.vh
		}
	}
	for _, w := range c.prefix {
		if len(host) > len(w.part) && strings.HasPrefix(host, w.part) {
			return w.vh
		}
	}
	return nil
}

// Match finds the route for a request; nil when no virtual host or route matches (NR).
func (c *Config) Match(req *http.Request) *Route {
	vh := c.VirtualHostFor(req.Host)
	if vh == nil {
		return nil
	}
	for _, r := range vh.Routes {
		if r.match.matches(req) {
			return r
		}
	}
	return nil
}

// PickCluster chooses the target of a forwarding route: the single cluster, the cluster
// named by the cluster header, or one of the weighted clusters the way Envoy picks them:
// a random value per request (or the value of the header named by the weighted clusters'
// header_name, when it holds an unsigned integer) modulo the total weight, walked through
// the clusters' cumulative weights. Splits are therefore statistical, as with Envoy.
func (r *Route) PickCluster(req *http.Request) (*WeightedCluster, bool) {
	if r.ClusterHeader != "" {
		name := req.Header.Get(r.ClusterHeader)
		if name == "" {
			return nil, false
		}
		return &WeightedCluster{Name: name, Weight: 1}, true
	}
	if len(r.Clusters) == 0 {
		return nil, false
	}
	if len(r.Clusters) == 1 {
		return &r.Clusters[0], true
	}
	v := rand.Uint64()
	if hn := r.Action.GetWeightedClusters().GetHeaderName(); hn != "" {
		if n, err := strconv.ParseUint(req.Header.Get(hn), 10, 64); err == nil {
			v = n
		}
	}
	slot := uint32(v % uint64(r.totalWeight))
	for i := range r.Clusters {
		if slot < r.Clusters[i].Weight {
			return &r.Clusters[i], true
		}
		slot -= r.Clusters[i].Weight
	}
	return &r.Clusters[len(r.Clusters)-1], true
}

// PerFilterConfig returns the most specific of PerFilterConfigs, the one that applies to a
// filter that does not merge levels; nil when there is none.
func (r *Route) PerFilterConfig(name string, wc *WeightedCluster) *anypb.Any {
	if all := r.PerFilterConfigs(name, wc); len(all) > 0 {
		return all[0]
	}
	return nil
}

// PerFilterConfigs returns every typed_per_filter_config for a filter name, most specific
// first: weighted cluster, route, virtual host, route configuration. A
// config.route.v3.FilterConfig wrapper is unwrapped (a disabled one is skipped).
func (r *Route) PerFilterConfigs(name string, wc *WeightedCluster) []*anypb.Any {
	var levels []map[string]*anypb.Any
	if wc != nil && wc.Proto != nil {
		levels = append(levels, wc.Proto.GetTypedPerFilterConfig())
	}
	levels = append(levels, r.Proto.GetTypedPerFilterConfig(), r.VHost.Proto.GetTypedPerFilterConfig(),
		r.VHost.config.Proto.GetTypedPerFilterConfig())
	var out []*anypb.Any
	for _, l := range levels {
		a := l[name]
		if a == nil {
			continue
		}
		fc := &routev3.FilterConfig{}
		if a.MessageIs(fc) {
			if err := a.UnmarshalTo(fc); err != nil || fc.GetDisabled() || fc.GetConfig() == nil {
				continue
			}
			a = fc.GetConfig()
		}
		out = append(out, a)
	}
	return out
}

// Timeout is the route timeout (0 disables it).
func (r *Route) Timeout() time.Duration {
	if r.Action == nil || r.Action.GetTimeout() == nil {
		return DefaultTimeout
	}
	return r.Action.GetTimeout().AsDuration()
}

// ApplyRequestHeaders applies the request header mutations of the weighted cluster, route,
// virtual host and route configuration, in Envoy's default order (most specific first, so
// the route configuration's "set" wins).
func (r *Route) ApplyRequestHeaders(h http.Header, wc *WeightedCluster, vars Vars) {
	if wc != nil {
		wc.headers.request(h, vars)
	}
	r.headers.request(h, vars)
	r.VHost.headers.request(h, vars)
	r.VHost.config.headers.request(h, vars)
}

// ApplyResponseHeaders applies the response header mutations (see ApplyRequestHeaders).
func (r *Route) ApplyResponseHeaders(h http.Header, wc *WeightedCluster, vars Vars) {
	if wc != nil {
		wc.headers.response(h, vars)
	}
	r.headers.response(h, vars)
	r.VHost.headers.response(h, vars)
	r.VHost.config.headers.response(h, vars)
}

// ApplyConfigResponseHeaders applies only the route configuration's response headers (for
// local replies without a route).
func (c *Config) ApplyConfigResponseHeaders(h http.Header, vars Vars) { c.headers.response(h, vars) }

// RewritePath applies prefix_rewrite or regex_rewrite to a path (query kept); the second
// result reports whether it changed.
func (r *Route) RewritePath(path string) (string, bool) {
	if r.Action == nil {
		return path, false
	}
	p, q, hasQ := strings.Cut(path, "?")
	out := p
	switch {
	case r.Action.GetPrefixRewrite() != "":
		prefix := r.Proto.GetMatch().GetPrefix()
		if prefix == "" {
			prefix = r.Proto.GetMatch().GetPath()
		}
		if prefix == "" {
			prefix = r.Proto.GetMatch().GetPathSeparatedPrefix()
		}
		if len(p) >= len(prefix) {
			out = r.Action.GetPrefixRewrite() + p[len(prefix):]
		}
	case r.Action.GetRegexRewrite() != nil:
		rr := r.Action.GetRegexRewrite()
		re := regexp.MustCompile(rr.GetPattern().GetRegex())
		out = re.ReplaceAllString(p, envoySubstitution(rr.GetSubstitution()))
	default:
		return path, false
	}
	if hasQ {
		out += "?" + q
	}
	return out, true
}

// envoySubstitution turns Envoy's \1 back-references into Go's ${1}.
func envoySubstitution(s string) string {
	re := regexp.MustCompile(`\\(\d)`)
	return re.ReplaceAllString(s, "$${$1}")
}

// RedirectURL builds the Location of a redirect route for req, and its status code.
func (r *Route) RedirectURL(req *http.Request) (string, int) {
	rd := r.Redirect
	scheme := "http"
	if req.TLS != nil {
		scheme = "https"
	}
	if s := rd.GetSchemeRedirect(); s != "" {
		scheme = s
	}
	if rd.GetHttpsRedirect() {
		scheme = "https"
	}
	host := req.Host
	if h := rd.GetHostRedirect(); h != "" {
		host = h
	}
	if p := rd.GetPortRedirect(); p != 0 {
		hn := host
		if h, _, ok := strings.Cut(host, ":"); ok {
			hn = h
		}
		host = fmt.Sprintf("%s:%d", hn, p)
	}
	path := req.URL.RequestURI()
	switch {
	case rd.GetPathRedirect() != "":
		// Envoy keeps the request's query unless the new path brings its own.
		_, q, hasQ := strings.Cut(path, "?")
		path = rd.GetPathRedirect()
		if hasQ && !strings.Contains(path, "?") {
			path += "?" + q
		}
	case rd.GetPrefixRewrite() != "":
		p, q, hasQ := strings.Cut(path, "?")
		prefix := r.Proto.GetMatch().GetPrefix()
		if len(p) >= len(prefix) {
			p = rd.GetPrefixRewrite() + p[len(prefix):]
		}
		path = p
		if hasQ {
			path += "?" + q
		}
	}
	if rd.GetStripQuery() {
		path, _, _ = strings.Cut(path, "?")
	}
	code := http.StatusMovedPermanently
	switch rd.GetResponseCode() {
	case routev3.RedirectAction_FOUND:
		code = http.StatusFound
	case routev3.RedirectAction_SEE_OTHER:
		code = http.StatusSeeOther
	case routev3.RedirectAction_TEMPORARY_REDIRECT:
		code = http.StatusTemporaryRedirect
	case routev3.RedirectAction_PERMANENT_REDIRECT:
		code = http.StatusPermanentRedirect
	}
	return (&url.URL{Scheme: scheme, Host: host}).String() + path, code
}

// DirectBody returns the body of a direct response.
func (r *Route) DirectBody() []byte {
	b := r.Direct.GetBody()
	switch s := b.GetSpecifier().(type) {
	case *corev3.DataSource_InlineString:
		return []byte(s.InlineString)
	case *corev3.DataSource_InlineBytes:
		return s.InlineBytes
	}
	return nil
}
