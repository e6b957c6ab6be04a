package xds

import (
	"maps"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	faultcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/fault/v3"
	cors "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	previoushosts "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	previouspriorities "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshconfig "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// HTTP filter names routes carry per-filter configuration for.
const (
	FaultFilter  = "envoy.filters.http.fault"
	CorsFilter   = "envoy.filters.http.cors"
	RouterFilter = "envoy.filters.http.router"
)

var noTimeout = durationpb.New(0)

// routeCtx is what translating one VirtualService for one listener port needs.
type routeCtx struct {
	scope *Scope
	mesh  *meshconfig.MeshConfig
	port  uint32
	grpc  bool // proxyless gRPC client: its xDS client reads different fields
}

// vsRoutes translates the http routes of vs that apply on the port, in order; it stops after
// a route that matches everything, as Envoy would never reach the rest.
func (rc *routeCtx) vsRoutes(vs *virtualService) []*route.Route {
	var out []*route.Route
	for i, hr := range vs.spec.GetHttp() {
		ns := vs.cfg.Namespace
		if i < len(vs.routeNS) {
			ns = vs.routeNS[i]
		}
		if len(hr.GetMatch()) == 0 {
			if r := rc.translateRoute(vs, hr, nil, ns); r != nil {
				out = append(out, r)
			}
			break
		}
		catchAll := false
		for _, m := range hr.GetMatch() {
			if r := rc.translateRoute(vs, hr, m, ns); r != nil {
				out = append(out, r)
				if isCatchAll(r) {
					catchAll = true
					break
				}
			}
		}
		if catchAll {
			break
		}
	}
	return out
}

// sourceMatches applies a match's port, gateways, sourceLabels and sourceNamespace, which
// select the proxies and listeners a route exists for rather than requests.
func (rc *routeCtx) sourceMatches(m *networking.HTTPMatchRequest) bool {
	if m == nil {
		return true
	}
	if m.GetPort() != 0 && m.GetPort() != rc.port {
		return false
	}
	if len(m.GetGateways()) > 0 {
		return appliesToMesh(m.GetGateways())
	}
	if !config.SelectorMatches(m.GetSourceLabels(), rc.scope.labels) {
		return false
	}
	return m.GetSourceNamespace() == "" || m.GetSourceNamespace() == rc.scope.Namespace
}

func (rc *routeCtx) translateRoute(vs *virtualService, in *networking.HTTPRoute, m *networking.HTTPMatchRequest, ns string) *route.Route {
	if !rc.sourceMatches(m) {
		return nil
	}
	name := in.GetName()
	if m.GetName() != "" {
		name = name + "." + m.GetName()
	}
	out := &route.Route{
		Name:     name,
		Match:    translateMatch(m),
		Metadata: configMetadata(vs.meta),
	}
	if m.GetStatPrefix() != "" {
		out.StatPrefix = m.GetStatPrefix()
	}
	authority := ""
	if h := in.GetHeaders(); h != nil {
		ops := translateHeaders(h)
		out.RequestHeadersToAdd, out.ResponseHeadersToAdd = ops.reqAdd, ops.respAdd
		out.RequestHeadersToRemove, out.ResponseHeadersToRemove = ops.reqRemove, ops.respRemove
		authority = ops.authority
	}
	switch {
	case in.GetRedirect() != nil:
		applyRedirect(out, in.GetRedirect(), rc.port)
	case in.GetDirectResponse() != nil:
		applyDirectResponse(out, in.GetDirectResponse())
	default:
		rc.applyDestinations(out, in, ns, authority)
	}
	out.Decorator = &route.Decorator{Operation: routeOperation(out, vs.cfg.Name, rc.port)}
	if in.GetFault() != nil || (in.GetCorsPolicy() != nil && !rc.grpc) {
		out.TypedPerFilterConfig = map[string]*anypb.Any{}
	}
	if f := in.GetFault(); f != nil {
		out.TypedPerFilterConfig[FaultFilter] = mustAny(translateFault(f))
	}
	if c := in.GetCorsPolicy(); c != nil && !rc.grpc {
		out.TypedPerFilterConfig[CorsFilter] = mustAny(translateCors(c))
	}
	return out
}

// destinationCluster names the cluster of a destination: its port, else the service's only
// port, else the listener's port.
func (rc *routeCtx) destinationCluster(d *networking.Destination, ns string) (string, string) {
	host := resolveHost(d.GetHost(), ns)
	port := rc.port
	if d.GetPort() != nil {
		port = d.GetPort().GetNumber()
	} else if svc := rc.scope.Service(host); svc != nil && len(svc.Ports) == 1 {
		port = svc.Ports[0].Port
	}
	return OutboundClusterName(port, d.GetSubset(), host), host
}

func (rc *routeCtx) applyDestinations(out *route.Route, in *networking.HTTPRoute, ns, authority string) {
	action := &route.RouteAction{}
	rc.setTimeout(action, in.GetTimeout())
	out.Action = &route.Route_Route{Route: action}
	if rw := in.GetRewrite(); rw != nil {
		if rr := rw.GetUriRegexRewrite(); rr != nil {
			action.RegexRewrite = &matcher.RegexMatchAndSubstitute{Pattern: &matcher.RegexMatcher{Regex: rr.GetMatch()}, Substitution: rr.GetRewrite()}
		} else if rw.GetUri() != "" {
			action.PrefixRewrite = rw.GetUri()
		}
		if rw.GetAuthority() != "" {
			authority = rw.GetAuthority()
		}
	}
	if authority != "" {
		action.HostRewriteSpecifier = &route.RouteAction_HostRewriteLiteral{HostRewriteLiteral: authority}
	}
	if in.GetMirror() != nil {
		if pct := mirrorPercent(in.GetMirrorPercentage(), in.GetMirrorPercent()); pct != nil {
			cluster, _ := rc.destinationCluster(in.GetMirror(), ns)
			action.RequestMirrorPolicies = append(action.RequestMirrorPolicies, mirrorPolicy(cluster, pct))
		}
	}
	for _, mp := range in.GetMirrors() {
		if pct := mirrorPercent(mp.GetPercentage(), nil); pct != nil {
			cluster, _ := rc.destinationCluster(mp.GetDestination(), ns)
			action.RequestMirrorPolicies = append(action.RequestMirrorPolicies, mirrorPolicy(cluster, pct))
		}
	}
	consistentHash := false
	if len(in.GetRoute()) == 1 {
		d := in.GetRoute()[0]
		cluster, host := rc.destinationCluster(d.GetDestination(), ns)
		action.ClusterSpecifier = &route.RouteAction_Cluster{Cluster: cluster}
		if h := d.GetHeaders(); h != nil {
			ops := translateHeaders(h)
			out.RequestHeadersToAdd = append(out.RequestHeadersToAdd, ops.reqAdd...)
			out.RequestHeadersToRemove = append(out.RequestHeadersToRemove, ops.reqRemove...)
			out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, ops.respAdd...)
			out.ResponseHeadersToRemove = append(out.ResponseHeadersToRemove, ops.respRemove...)
			if ops.authority != "" && action.HostRewriteSpecifier == nil {
				action.HostRewriteSpecifier = &route.RouteAction_HostRewriteLiteral{HostRewriteLiteral: ops.authority}
			}
		}
		if hp := hashPolicy(rc.consistentHash(host, d.GetDestination())); hp != nil {
			action.HashPolicy = append(action.HashPolicy, hp)
			consistentHash = true
		}
	} else {
		wc := &route.WeightedCluster{}
		for _, d := range in.GetRoute() {
			if d.GetWeight() == 0 {
				continue // a zero weight is no destination at all, as in Istio
			}
			cluster, host := rc.destinationCluster(d.GetDestination(), ns)
			cw := &route.WeightedCluster_ClusterWeight{Name: cluster, Weight: wrapperspb.UInt32(uint32(d.GetWeight()))}
			if h := d.GetHeaders(); h != nil {
				ops := translateHeaders(h)
				cw.RequestHeadersToAdd, cw.RequestHeadersToRemove = ops.reqAdd, ops.reqRemove
				cw.ResponseHeadersToAdd, cw.ResponseHeadersToRemove = ops.respAdd, ops.respRemove
				if ops.authority != "" {
					cw.HostRewriteSpecifier = &route.WeightedCluster_ClusterWeight_HostRewriteLiteral{HostRewriteLiteral: ops.authority}
				}
			}
			if hp := hashPolicy(rc.consistentHash(host, d.GetDestination())); hp != nil {
				action.HashPolicy = append(action.HashPolicy, hp)
			}
			wc.Clusters = append(wc.Clusters, cw)
		}
		action.ClusterSpecifier = &route.RouteAction_WeightedClusters{WeightedClusters: wc}
	}
	policy := in.GetRetries()
	if policy == nil {
		policy = rc.mesh.GetDefaultHttpRetryPolicy()
	}
	action.RetryPolicy = retryPolicy(policy, consistentHash)
}

// setTimeout applies a route timeout (0: none, Istio's default). Envoy reads timeout and,
// for gRPC requests, max_grpc_timeout; gRPC's own xDS client reads max_stream_duration.
func (rc *routeCtx) setTimeout(action *route.RouteAction, d *durationpb.Duration) {
	action.Timeout = noTimeout
	if d != nil {
		action.Timeout = d
	}
	if rc.grpc {
		action.MaxStreamDuration = &route.RouteAction_MaxStreamDuration{MaxStreamDuration: action.Timeout}
		return
	}
	action.MaxGrpcTimeout = action.Timeout //nolint:staticcheck // Istio still sets it: the replacement regressed
}

// consistentHash finds the hash key the destination's DestinationRule asks for: the subset's
// port-level setting, else the subset's, else the port-level one, else the rule's.
func (rc *routeCtx) consistentHash(host string, d *networking.Destination) *networking.LoadBalancerSettings_ConsistentHashLB {
	dr := rc.scope.DestinationRule(host)
	if dr == nil {
		return nil
	}
	portHash := func(pls []*networking.TrafficPolicy_PortTrafficPolicy) *networking.LoadBalancerSettings_ConsistentHashLB {
		if d.GetPort() == nil {
			return nil
		}
		for _, pl := range pls {
			if pl.GetPort().GetNumber() == d.GetPort().GetNumber() {
				return pl.GetLoadBalancer().GetConsistentHash()
			}
		}
		return nil
	}
	tp := dr.spec.GetTrafficPolicy()
	hash := tp.GetLoadBalancer().GetConsistentHash()
	plsHash := portHash(tp.GetPortLevelSettings())
	var subsetHash, subsetPLSHash *networking.LoadBalancerSettings_ConsistentHashLB
	if s := dr.subset(d.GetSubset()); s != nil && d.GetSubset() != "" {
		subsetHash = s.GetTrafficPolicy().GetLoadBalancer().GetConsistentHash()
		subsetPLSHash = portHash(s.GetTrafficPolicy().GetPortLevelSettings())
	}
	switch {
	case subsetPLSHash != nil:
		return subsetPLSHash
	case subsetHash != nil:
		return subsetHash
	case plsHash != nil:
		return plsHash
	}
	return hash
}

// hashPolicy is the route's hash key for a consistent-hash cluster.
func hashPolicy(ch *networking.LoadBalancerSettings_ConsistentHashLB) *route.RouteAction_HashPolicy {
	switch k := ch.GetHashKey().(type) {
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName:
		return &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_Header_{
			Header: &route.RouteAction_HashPolicy_Header{HeaderName: k.HttpHeaderName}}}
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpCookie:
		c := &route.RouteAction_HashPolicy_Cookie{Name: k.HttpCookie.GetName(), Ttl: k.HttpCookie.GetTtl(), Path: k.HttpCookie.GetPath()}
		for _, a := range k.HttpCookie.GetAttributes() {
			c.Attributes = append(c.Attributes, &route.RouteAction_HashPolicy_CookieAttribute{Name: a.GetName(), Value: a.GetValue()})
		}
		return &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_Cookie_{Cookie: c}}
	case *networking.LoadBalancerSettings_ConsistentHashLB_UseSourceIp:
		return &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_ConnectionProperties_{
			ConnectionProperties: &route.RouteAction_HashPolicy_ConnectionProperties{SourceIp: k.UseSourceIp}}}
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpQueryParameterName:
		return &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_QueryParameter_{
			QueryParameter: &route.RouteAction_HashPolicy_QueryParameter{Name: k.HttpQueryParameterName}}}
	}
	return nil
}

// DefaultRetryOn is what Istio retries when a route has no retry policy.
const DefaultRetryOn = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"

// retryPolicy is Istio's translation of HTTPRetry: nil in means the default policy (2
// retries on connection failures, refused streams, gRPC unavailable/cancelled and 503, on a
// host not tried before); attempts 0 means no retries; otherwise the default with the
// fields given overriding it. Consistent hashing keeps retries on the same host.
func retryPolicy(in *networking.HTTPRetry, consistentHash bool) *route.RetryPolicy {
	out := &route.RetryPolicy{
		NumRetries:                    wrapperspb.UInt32(2),
		RetryOn:                       DefaultRetryOn,
		RetriableStatusCodes:          []uint32{http.StatusServiceUnavailable},
		HostSelectionRetryMaxAttempts: 5,
	}
	if !consistentHash {
		out.RetryHostPredicate = []*route.RetryPolicy_RetryHostPredicate{previousHostsPredicate()}
	}
	if in == nil {
		return out
	}
	if in.GetAttempts() <= 0 {
		return nil
	}
	out.NumRetries = wrapperspb.UInt32(uint32(in.GetAttempts()))
	if in.GetRetryOn() != "" {
		out.RetryOn, out.RetriableStatusCodes = parseRetryOn(in.GetRetryOn())
		if len(out.RetriableStatusCodes) > 0 && !strings.Contains(out.RetryOn, "retriable-status-codes") {
			if out.RetryOn == "" {
				out.RetryOn = "retriable-status-codes"
			} else {
				out.RetryOn += ",retriable-status-codes"
			}
		}
	}
	if in.GetPerTryTimeout() != nil {
		out.PerTryTimeout = in.GetPerTryTimeout()
	}
	if in.GetRetryIgnorePreviousHosts() != nil {
		out.RetryHostPredicate = nil
		if in.GetRetryIgnorePreviousHosts().GetValue() {
			out.RetryHostPredicate = []*route.RetryPolicy_RetryHostPredicate{previousHostsPredicate()}
		}
	}
	if in.GetRetryRemoteLocalities().GetValue() {
		out.RetryPriority = &route.RetryPolicy_RetryPriority{
			Name:       "envoy.retry_priorities.previous_priorities",
			ConfigType: &route.RetryPolicy_RetryPriority_TypedConfig{TypedConfig: mustAny(&previouspriorities.PreviousPrioritiesConfig{UpdateFrequency: 2})},
		}
	}
	if in.GetBackoff() != nil {
		out.RetryBackOff = &route.RetryPolicy_RetryBackOff{BaseInterval: in.GetBackoff()}
	}
	return out
}

func previousHostsPredicate() *route.RetryPolicy_RetryHostPredicate {
	return &route.RetryPolicy_RetryHostPredicate{
		Name:       "envoy.retry_host_predicates.previous_hosts",
		ConfigType: &route.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: mustAny(&previoushosts.PreviousHostsPredicate{})},
	}
}

// parseRetryOn splits retryOn into Envoy's retry_on and the HTTP status codes among it.
func parseRetryOn(s string) (string, []uint32) {
	var on []string
	var codes []uint32
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if n, err := strconv.Atoi(part); err == nil && http.StatusText(n) != "" {
			codes = append(codes, uint32(n))
			continue
		}
		on = append(on, part)
	}
	return strings.Join(on, ","), codes
}

func translateMatch(in *networking.HTTPMatchRequest) *route.RouteMatch {
	out := &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}}
	if in == nil {
		return out
	}
	for _, name := range slices.Sorted(maps.Keys(in.GetHeaders())) {
		out.Headers = append(out.Headers, headerMatcher(name, in.GetHeaders()[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(in.GetWithoutHeaders())) {
		sm := in.GetWithoutHeaders()[name]
		h := headerMatcher(name, sm)
		h.InvertMatch = true
		if !isPresentMatch(sm) {
			h.TreatMissingHeaderAsEmpty = true
		}
		out.Headers = append(out.Headers, h)
	}
	sort.SliceStable(out.Headers, func(i, j int) bool { return out.Headers[i].Name < out.Headers[j].Name })
	switch u := in.GetUri().GetMatchType().(type) {
	case *networking.StringMatch_Exact:
		out.PathSpecifier = &route.RouteMatch_Path{Path: u.Exact}
	case *networking.StringMatch_Prefix:
		out.PathSpecifier = &route.RouteMatch_Prefix{Prefix: u.Prefix}
	case *networking.StringMatch_Regex:
		out.PathSpecifier = &route.RouteMatch_SafeRegex{SafeRegex: &matcher.RegexMatcher{Regex: u.Regex}}
	}
	out.CaseSensitive = wrapperspb.Bool(!in.GetIgnoreUriCase())
	if in.GetMethod() != nil {
		out.Headers = append(out.Headers, headerMatcher(":method", in.GetMethod()))
	}
	if in.GetAuthority() != nil {
		out.Headers = append(out.Headers, headerMatcher(":authority", in.GetAuthority()))
	}
	if in.GetScheme() != nil {
		out.Headers = append(out.Headers, headerMatcher(":scheme", in.GetScheme()))
	}
	for _, name := range slices.Sorted(maps.Keys(in.GetQueryParams())) {
		sm := in.GetQueryParams()[name]
		q := &route.QueryParameterMatcher{Name: name}
		if isPresentMatch(sm) {
			q.QueryParameterMatchSpecifier = &route.QueryParameterMatcher_PresentMatch{PresentMatch: true}
		} else {
			q.QueryParameterMatchSpecifier = &route.QueryParameterMatcher_StringMatch{StringMatch: stringMatcher(sm)}
		}
		out.QueryParameters = append(out.QueryParameters, q)
	}
	return out
}

// isPresentMatch: a matcher without a type, or Istio's regex "*", only asks for presence.
func isPresentMatch(m *networking.StringMatch) bool {
	return m == nil || m.GetMatchType() == nil || m.GetRegex() == "*"
}

func headerMatcher(name string, m *networking.StringMatch) *route.HeaderMatcher {
	out := &route.HeaderMatcher{Name: name}
	if isPresentMatch(m) {
		out.HeaderMatchSpecifier = &route.HeaderMatcher_PresentMatch{PresentMatch: true}
		return out
	}
	out.HeaderMatchSpecifier = &route.HeaderMatcher_StringMatch{StringMatch: stringMatcher(m)}
	return out
}

func stringMatcher(m *networking.StringMatch) *matcher.StringMatcher {
	switch t := m.GetMatchType().(type) {
	case *networking.StringMatch_Exact:
		return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: t.Exact}}
	case *networking.StringMatch_Prefix:
		return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Prefix{Prefix: t.Prefix}}
	case *networking.StringMatch_Regex:
		return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_SafeRegex{SafeRegex: &matcher.RegexMatcher{Regex: t.Regex}}}
	}
	return nil
}

// isCatchAll reports whether a route matches every request.
func isCatchAll(r *route.Route) bool {
	m := r.GetMatch()
	all := false
	switch p := m.GetPathSpecifier().(type) {
	case *route.RouteMatch_Prefix:
		all = p.Prefix == "/"
	case *route.RouteMatch_SafeRegex:
		all = p.SafeRegex.GetRegex() == ".*"
	}
	return all && len(m.GetHeaders()) == 0 && len(m.GetQueryParameters()) == 0 && len(m.GetDynamicMetadata()) == 0
}

type headerOps struct {
	reqAdd, respAdd       []*core.HeaderValueOption
	reqRemove, respRemove []string
	authority             string
}

// translateHeaders turns set into overwrite-or-add and add into append-or-add, sorted by
// name; setting :authority or host rewrites the authority instead.
func translateHeaders(h *networking.Headers) headerOps {
	var ops headerOps
	values := func(m map[string]string, appendAction bool, authority *string) []*core.HeaderValueOption {
		var out []*core.HeaderValueOption
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if config.IsAuthorityHeader(k) {
				if authority != nil {
					*authority = m[k]
				}
				continue
			}
			if strings.HasPrefix(k, ":") {
				continue
			}
			action := core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
			if appendAction {
				action = core.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
			}
			out = append(out, &core.HeaderValueOption{Header: &core.HeaderValue{Key: k, Value: m[k]}, AppendAction: action})
		}
		return out
	}
	var setAuth, addAuth string
	ops.reqAdd = append(values(h.GetRequest().GetSet(), false, &setAuth), values(h.GetRequest().GetAdd(), true, &addAuth)...)
	ops.respAdd = append(values(h.GetResponse().GetSet(), false, nil), values(h.GetResponse().GetAdd(), true, nil)...)
	ops.authority = addAuth
	if setAuth != "" {
		ops.authority = setAuth
	}
	ops.reqRemove = h.GetRequest().GetRemove()
	ops.respRemove = h.GetResponse().GetRemove()
	return ops
}

func applyRedirect(out *route.Route, in *networking.HTTPRedirect, port uint32) {
	r := &route.RedirectAction{HostRedirect: in.GetAuthority()}
	switch {
	case in.GetPrefixRewrite() != "":
		r.PathRewriteSpecifier = &route.RedirectAction_PrefixRewrite{PrefixRewrite: in.GetPrefixRewrite()}
	case in.GetUri() != "":
		r.PathRewriteSpecifier = &route.RedirectAction_PathRedirect{PathRedirect: in.GetUri()}
	}
	if in.GetScheme() != "" {
		r.SchemeRewriteSpecifier = &route.RedirectAction_SchemeRedirect{SchemeRedirect: in.GetScheme()}
	}
	if in.GetRedirectPort() != nil {
		switch p := in.GetRedirectPort().(type) {
		case *networking.HTTPRedirect_DerivePort:
			// Envoy cannot take the port from the request, but routes are built per listener
			// port, which is the request's port.
			if p.DerivePort == networking.HTTPRedirect_FROM_REQUEST_PORT {
				r.PortRedirect = port
			}
		case *networking.HTTPRedirect_Port:
			r.PortRedirect = p.Port
		}
		scheme := in.GetScheme()
		if scheme == "" {
			scheme = "http"
		}
		if (r.PortRedirect == 80 && scheme == "http") || (r.PortRedirect == 443 && scheme == "https") {
			r.PortRedirect = 0
		}
	}
	switch in.GetRedirectCode() {
	case 0, 301:
		r.ResponseCode = route.RedirectAction_MOVED_PERMANENTLY
	case 302:
		r.ResponseCode = route.RedirectAction_FOUND
	case 303:
		r.ResponseCode = route.RedirectAction_SEE_OTHER
	case 307:
		r.ResponseCode = route.RedirectAction_TEMPORARY_REDIRECT
	case 308:
		r.ResponseCode = route.RedirectAction_PERMANENT_REDIRECT
	}
	out.Action = &route.Route_Redirect{Redirect: r}
}

func applyDirectResponse(out *route.Route, in *networking.HTTPDirectResponse) {
	dr := &route.DirectResponseAction{Status: in.GetStatus()}
	switch b := in.GetBody().GetSpecifier().(type) {
	case *networking.HTTPBody_String_:
		dr.Body = &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: b.String_}}
	case *networking.HTTPBody_Bytes:
		dr.Body = &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: b.Bytes}}
	}
	out.Action = &route.Route_DirectResponse{DirectResponse: dr}
}

// routeOperation is the tracing operation name: "host:port/path" for a single cluster, else
// "<VirtualService name>:port/path".
func routeOperation(r *route.Route, vsName string, port uint32) string {
	p := "/*"
	m := r.GetMatch()
	switch ps := m.GetPathSpecifier().(type) {
	case *route.RouteMatch_Prefix:
		p = ps.Prefix + "*"
	case *route.RouteMatch_Path:
		p = ps.Path
	case *route.RouteMatch_SafeRegex:
		p = ps.SafeRegex.GetRegex()
	}
	if c := r.GetRoute().GetCluster(); c != "" {
		if cport, _, host, ok := ParseClusterName(c); ok {
			return host + ":" + strconv.Itoa(int(cport)) + p
		}
	}
	return vsName + ":" + strconv.Itoa(int(port)) + p
}

func configMetadata(path string) *core.Metadata {
	return &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
		"istio": {Fields: map[string]*structpb.Value{"config": structpb.NewStringValue(path)}},
	}}
}

func mirrorPercent(pct *networking.Percent, legacy *wrapperspb.UInt32Value) *core.RuntimeFractionalPercent {
	switch {
	case pct != nil:
		if pct.GetValue() > 0 {
			return &core.RuntimeFractionalPercent{DefaultValue: millionths(pct.GetValue())}
		}
		return nil // an explicit 0% mirrors nothing
	case legacy != nil:
		if legacy.GetValue() > 0 {
			return &core.RuntimeFractionalPercent{DefaultValue: hundredths(legacy.GetValue())}
		}
		return nil
	}
	return &core.RuntimeFractionalPercent{DefaultValue: hundredths(100)}
}

func mirrorPolicy(cluster string, pct *core.RuntimeFractionalPercent) *route.RouteAction_RequestMirrorPolicy {
	return &route.RouteAction_RequestMirrorPolicy{Cluster: cluster, RuntimeFraction: pct, TraceSampled: wrapperspb.Bool(false)}
}

// millionths is Istio's translation of a percentage (0.0001 precision).
func millionths(v float64) *typev3.FractionalPercent {
	return &typev3.FractionalPercent{Numerator: uint32(v * 10000), Denominator: typev3.FractionalPercent_MILLION}
}

func hundredths(v uint32) *typev3.FractionalPercent {
	return &typev3.FractionalPercent{Numerator: v, Denominator: typev3.FractionalPercent_HUNDRED}
}

func translateFault(in *networking.HTTPFaultInjection) *fault.HTTPFault {
	out := &fault.HTTPFault{}
	if d := in.GetDelay(); d != nil {
		out.Delay = &faultcommon.FaultDelay{
			FaultDelaySecifier: &faultcommon.FaultDelay_FixedDelay{FixedDelay: d.GetFixedDelay()},
		}
		if d.GetPercentage() != nil {
			out.Delay.Percentage = millionths(d.GetPercentage().GetValue())
		} else {
			out.Delay.Percentage = hundredths(uint32(d.GetPercent())) //nolint:staticcheck // the deprecated field still works
		}
	}
	if a := in.GetAbort(); a != nil {
		out.Abort = &fault.FaultAbort{}
		if a.GetPercentage() != nil {
			out.Abort.Percentage = millionths(a.GetPercentage().GetValue())
		}
		switch t := a.GetErrorType().(type) {
		case *networking.HTTPFaultInjection_Abort_HttpStatus:
			out.Abort.ErrorType = &fault.FaultAbort_HttpStatus{HttpStatus: uint32(t.HttpStatus)}
		case *networking.HTTPFaultInjection_Abort_GrpcStatus:
			code, _ := config.GRPCStatusCode(t.GrpcStatus)
			out.Abort.ErrorType = &fault.FaultAbort_GrpcStatus{GrpcStatus: code}
		}
	}
	return out
}

func translateCors(in *networking.CorsPolicy) *cors.CorsPolicy {
	out := &cors.CorsPolicy{
		ForwardNotMatchingPreflights: wrapperspb.Bool(in.GetUnmatchedPreflights() != networking.CorsPolicy_IGNORE),
		FilterEnabled:                &core.RuntimeFractionalPercent{DefaultValue: hundredths(100)},
		AllowCredentials:             in.GetAllowCredentials(),
		AllowHeaders:                 strings.Join(in.GetAllowHeaders(), ","),
		AllowMethods:                 strings.Join(in.GetAllowMethods(), ","),
		ExposeHeaders:                strings.Join(in.GetExposeHeaders(), ","),
	}
	if len(in.GetAllowOrigins()) > 0 {
		for _, o := range in.GetAllowOrigins() {
			out.AllowOriginStringMatch = append(out.AllowOriginStringMatch, stringMatcher(o))
		}
	} else {
		for _, o := range in.GetAllowOrigin() { //nolint:staticcheck // the deprecated field still works
			out.AllowOriginStringMatch = append(out.AllowOriginStringMatch, &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: o}})
		}
	}
	if in.GetMaxAge() != nil {
		out.MaxAge = strconv.FormatInt(in.GetMaxAge().GetSeconds(), 10)
	}
	return out
}

// ParseClusterName splits "outbound|<port>|<subset>|<host>".
func ParseClusterName(name string) (port uint32, subset, host string, ok bool) {
	parts := strings.SplitN(name, "|", 4)
	if len(parts) != 4 || parts[0] != "outbound" {
		return 0, "", "", false
	}
	p, err := strconv.ParseUint(parts[1], 10, 32)
	if err != nil || parts[3] == "" {
		return 0, "", "", false
	}
	return uint32(p), parts[2], parts[3], true
}

// defaultHTTPRoute is Istio's route for a service without a VirtualService: everything to
// the service's cluster, no timeout, the default retry policy, and the DestinationRule's hash
// key when it asks for consistent hashing.
func defaultHTTPRoute(mesh *meshconfig.MeshConfig, cluster, host string, port uint32, hash *networking.LoadBalancerSettings_ConsistentHashLB, grpc bool) *route.Route {
	action := &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: cluster}}
	rc := routeCtx{grpc: grpc}
	rc.setTimeout(action, nil)
	action.RetryPolicy = retryPolicy(mesh.GetDefaultHttpRetryPolicy(), false)
	if hp := hashPolicy(hash); hp != nil {
		action.HashPolicy = []*route.RouteAction_HashPolicy{hp}
	}
	return &route.Route{
		Name:      "default",
		Match:     &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action:    &route.Route_Route{Route: action},
		Decorator: &route.Decorator{Operation: host + ":" + strconv.Itoa(int(port)) + "/*"},
	}
}
