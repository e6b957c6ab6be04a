package xds

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rbactcp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	matcherpb "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	extensions "istio.io/api/extensions/v1alpha1"
	security "istio.io/api/security/v1beta1"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/wasmplugin"
)

// AuthorizationPolicy is translated as Istio's pilot/pkg/security/authz (builder and
// model) translates it for a sidecar's inbound: the policies of the proxy's namespace that
// select it, and the root namespace's that select it in any namespace, become one RBAC
// filter per action in Istio's order, AUDIT (action LOG), DENY, ALLOW; ALLOW only when an
// ALLOW policy applies. Each rule is an RBAC policy named ns[<ns>]-policy[<name>]-rule[<i>]
// (Istio's name); a policy without rules (`spec: {}`) is one that never matches, so an
// ALLOW filter with only such policies denies everything. Policies annotated
// istio.io/dry-run go into the filter's shadow rules. On TCP chains (the network filter,
// stat prefix "tcp.") a rule that needs HTTP (hosts, methods, paths, request headers) is
// dropped from ALLOW, and in DENY and AUDIT its HTTP-only parts are left out, so it
// matches more: Istio's rule, which never lets an HTTP-only condition open a TCP port.

// Filter names of the RBAC filters.
const (
	RBACHTTPFilter    = wellknown.HTTPRoleBasedAccessControl
	RBACNetworkFilter = wellknown.RoleBasedAccessControl
)

// dryRunAnnotation moves a policy to the shadow rules (Istio's annotation.IoIstioDryRun).
const dryRunAnnotation = "istio.io/dry-run"

// authzActions is Istio's filter order.
var authzActions = []struct {
	api  security.AuthorizationPolicy_Action
	rbac rbacpb.RBAC_Action
}{
	{security.AuthorizationPolicy_AUDIT, rbacpb.RBAC_LOG},
	{security.AuthorizationPolicy_DENY, rbacpb.RBAC_DENY},
	{security.AuthorizationPolicy_ALLOW, rbacpb.RBAC_ALLOW},
}

// builtRBAC is the enforced and the dry-run rules of one action (either may be nil).
type builtRBAC struct {
	action          rbacpb.RBAC_Action
	rules, shadow   *rbacpb.RBAC
	shadowStatsName string
}

// authzPolicies are the AuthorizationPolicies that apply to the view's proxy.
func authzPolicies(v *View) []*config.Config {
	return v.Snapshot.Configs.ForWorkload(config.AuthorizationPolicy, v.Proxy.Namespace, rootNamespace(v.Snapshot), v.Proxy.Labels)
}

func buildAuthz(v *View, forTCP bool) []builtRBAC {
	policies := authzPolicies(v)
	if len(policies) == 0 {
		return nil
	}
	tds := meshTrustDomains(v)
	var out []builtRBAC
	for _, a := range authzActions {
		b := builtRBAC{action: a.rbac}
		for _, c := range policies {
			ap := c.Spec.(*security.AuthorizationPolicy)
			if ap.GetAction() != a.api {
				continue
			}
			target := &b.rules
			if dry, _ := strconv.ParseBool(c.Annotations[dryRunAnnotation]); dry {
				target = &b.shadow
			}
			if *target == nil {
				*target = &rbacpb.RBAC{Action: a.rbac, Policies: map[string]*rbacpb.Policy{}}
			}
			addAuthzPolicy(*target, c.Namespace, c.Name, ap, tds, forTCP)
		}
		if b.rules == nil && b.shadow == nil {
			continue
		}
		if b.shadow != nil {
			switch a.rbac {
			case rbacpb.RBAC_ALLOW:
				b.shadowStatsName = "istio_dry_run_allow_"
			case rbacpb.RBAC_DENY:
				b.shadowStatsName = "istio_dry_run_deny_"
			}
		}
		out = append(out, b)
	}
	return out
}

func authzPolicyName(ns, name string, rule int) string {
	return fmt.Sprintf("ns[%s]-policy[%s]-rule[%d]", ns, name, rule)
}

// matchNever is Istio's policy for an AuthorizationPolicy without rules.
var matchNever = &rbacpb.Policy{
	Permissions: []*rbacpb.Permission{{Rule: &rbacpb.Permission_NotRule{NotRule: &rbacpb.Permission{Rule: &rbacpb.Permission_Any{Any: true}}}}},
	Principals:  []*rbacpb.Principal{{Identifier: &rbacpb.Principal_NotId{NotId: &rbacpb.Principal{Identifier: &rbacpb.Principal_Any{Any: true}}}}},
}

func addAuthzPolicy(r *rbacpb.RBAC, ns, name string, ap *security.AuthorizationPolicy, tds trustDomains, forTCP bool) {
	if len(ap.GetRules()) == 0 {
		r.Policies[authzPolicyName(ns, name, 0)] = matchNever
		return
	}
	for i, rule := range ap.GetRules() {
		if p, ok := authzRulePolicy(rule, ns, tds, forTCP, r.GetAction()); ok {
			r.Policies[authzPolicyName(ns, name, i)] = p
		}
	}
}

// authzRulePolicy is one rule's RBAC policy: a principal per source, a permission per
// operation, each the AND of its fields (an OR of a field's values and a NOT of the OR of
// its notValues) and of the when conditions. ok is false when an ALLOW rule needs HTTP on
// a TCP chain.
func authzRulePolicy(rule *security.Rule, ns string, tds trustDomains, forTCP bool, action rbacpb.RBAC_Action) (*rbacpb.Policy, bool) {
	g := &authzGen{ns: ns, forTCP: forTCP, strict: action == rbacpb.RBAC_ALLOW}
	var whenPrincipals []*rbacpb.Principal
	var whenPermissions []*rbacpb.Permission
	for _, c := range rule.GetWhen() {
		k := c.GetKey()
		values, notValues := tds.migrate(k, c.GetValues()), tds.migrate(k, c.GetNotValues())
		if pg := g.principalGenFor(k); pg != nil {
			whenPrincipals = append(whenPrincipals, g.principals(k, pg, values, notValues)...)
		} else {
			whenPermissions = append(whenPermissions, g.permissions(k, permissionGenFor(k), values, notValues)...)
		}
	}
	p := &rbacpb.Policy{}
	for _, from := range rule.GetFrom() {
		s := from.GetSource()
		var and []*rbacpb.Principal
		and = append(and, g.principals("source.principal", principalOf, tds.principals(s.GetPrincipals()), tds.principals(s.GetNotPrincipals()))...)
		and = append(and, g.principals("source.serviceAccount", g.serviceAccountOf, s.GetServiceAccounts(), s.GetNotServiceAccounts())...)
		and = append(and, g.principals("source.trustDomain", trustDomainOf, tds.expand(s.GetTrustDomains()), tds.expand(s.GetNotTrustDomains()))...)
		and = append(and, g.principals("source.namespace", namespaceOf, s.GetNamespaces(), s.GetNotNamespaces())...)
		and = append(and, g.principals("remote.ip", remoteIPOf, s.GetRemoteIpBlocks(), s.GetNotRemoteIpBlocks())...)
		and = append(and, g.principals("source.ip", sourceIPOf, s.GetIpBlocks(), s.GetNotIpBlocks())...)
		p.Principals = append(p.Principals, principalAnd(append(and, whenPrincipals...)))
	}
	if len(rule.GetFrom()) == 0 {
		p.Principals = []*rbacpb.Principal{principalAnd(whenPrincipals)}
	}
	for _, to := range rule.GetTo() {
		o := to.GetOperation()
		var and []*rbacpb.Permission
		and = append(and, g.permissions("hosts", hostOf, o.GetHosts(), o.GetNotHosts())...)
		and = append(and, g.permissions("methods", methodOf, o.GetMethods(), o.GetNotMethods())...)
		and = append(and, g.permissions("paths", pathOf, o.GetPaths(), o.GetNotPaths())...)
		and = append(and, g.permissions("ports", portOf, o.GetPorts(), o.GetNotPorts())...)
		p.Permissions = append(p.Permissions, permissionAnd(append(and, whenPermissions...)))
	}
	if len(rule.GetTo()) == 0 {
		p.Permissions = []*rbacpb.Permission{permissionAnd(whenPermissions)}
	}
	return p, !g.dropped
}

// authzGen generates one rule. strict (ALLOW): an HTTP-only field on a TCP chain drops
// the rule; otherwise the field is left out.
type authzGen struct {
	ns             string
	forTCP, strict bool
	dropped        bool
}

// A generator turns one value into a matcher; httpOnly values need a request.
type (
	principalGen  func(key, v string) *rbacpb.Principal
	permissionGen func(key, v string) *rbacpb.Permission
)

func (g *authzGen) httpOnly(key string) bool {
	if !g.forTCP {
		return false
	}
	switch {
	case key == "hosts", key == "methods", key == "paths", strings.HasPrefix(key, "request.headers["):
		if g.strict {
			g.dropped = true
		}
		return true
	}
	return false
}

func (g *authzGen) principals(key string, gen principalGen, values, notValues []string) []*rbacpb.Principal {
	if len(values)+len(notValues) == 0 || g.httpOnly(key) {
		return nil
	}
	var out []*rbacpb.Principal
	if len(values) > 0 {
		out = append(out, principalOr(mapValues(values, func(v string) *rbacpb.Principal { return gen(key, v) })))
	}
	if len(notValues) > 0 {
		or := principalOr(mapValues(notValues, func(v string) *rbacpb.Principal { return gen(key, v) }))
		out = append(out, &rbacpb.Principal{Identifier: &rbacpb.Principal_NotId{NotId: or}})
	}
	return out
}

func (g *authzGen) permissions(key string, gen permissionGen, values, notValues []string) []*rbacpb.Permission {
	if len(values)+len(notValues) == 0 || g.httpOnly(key) {
		return nil
	}
	var out []*rbacpb.Permission
	if len(values) > 0 {
		out = append(out, permissionOr(mapValues(values, func(v string) *rbacpb.Permission { return gen(key, v) })))
	}
	if len(notValues) > 0 {
		or := permissionOr(mapValues(notValues, func(v string) *rbacpb.Permission { return gen(key, v) }))
		out = append(out, &rbacpb.Permission{Rule: &rbacpb.Permission_NotRule{NotRule: or}})
	}
	return out
}

func mapValues[T any](vs []string, f func(string) T) []T {
	out := make([]T, len(vs))
	for i, v := range vs {
		out[i] = f(v)
	}
	return out
}

func principalAnd(ids []*rbacpb.Principal) *rbacpb.Principal {
	if len(ids) == 0 {
		ids = []*rbacpb.Principal{{Identifier: &rbacpb.Principal_Any{Any: true}}}
	}
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_AndIds{AndIds: &rbacpb.Principal_Set{Ids: ids}}}
}

func principalOr(ids []*rbacpb.Principal) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_OrIds{OrIds: &rbacpb.Principal_Set{Ids: ids}}}
}

func permissionAnd(rules []*rbacpb.Permission) *rbacpb.Permission {
	if len(rules) == 0 {
		rules = []*rbacpb.Permission{{Rule: &rbacpb.Permission_Any{Any: true}}}
	}
	return &rbacpb.Permission{Rule: &rbacpb.Permission_AndRules{AndRules: &rbacpb.Permission_Set{Rules: rules}}}
}

func permissionOr(rules []*rbacpb.Permission) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_OrRules{OrRules: &rbacpb.Permission_Set{Rules: rules}}}
}

// principalGenFor is the generator of a when key that identifies the source (nil for the
// keys that describe the destination: destination.ip, destination.port, connection.sni).
func (g *authzGen) principalGenFor(key string) principalGen {
	switch {
	case key == "source.ip":
		return sourceIPOf
	case key == "remote.ip":
		return remoteIPOf
	case key == "source.namespace":
		return namespaceOf
	case key == "source.principal":
		return principalOf
	case key == "source.trustDomain":
		return trustDomainOf
	case key == "source.serviceAccount":
		return g.serviceAccountOf
	case strings.HasPrefix(key, "request.headers["):
		return headerOf
	}
	return nil
}

func permissionGenFor(key string) permissionGen {
	switch key {
	case "destination.ip":
		return func(_, v string) *rbacpb.Permission {
			return &rbacpb.Permission{Rule: &rbacpb.Permission_DestinationIp{DestinationIp: cidr(v)}}
		}
	case "destination.port":
		return portOf
	default: // connection.sni (validation admits no other key)
		return func(_, v string) *rbacpb.Permission {
			return &rbacpb.Permission{Rule: &rbacpb.Permission_RequestedServerName{RequestedServerName: stringMatch(v, "")}}
		}
	}
}

func authenticated(m *matcherpb.StringMatcher) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_Authenticated_{Authenticated: &rbacpb.Principal_Authenticated{PrincipalName: m}}}
}

func principalOf(_, v string) *rbacpb.Principal { return authenticated(stringMatch(v, "spiffe://")) }

func namespaceOf(_, v string) *rbacpb.Principal {
	parts := strings.Split(v, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return authenticated(regexMatch(".*/ns/" + strings.Join(parts, ".*") + "/.*"))
}

func (g *authzGen) serviceAccountOf(_, v string) *rbacpb.Principal {
	ns, sa, ok := strings.Cut(v, "/")
	if !ok {
		ns, sa = g.ns, v
	}
	return authenticated(regexMatch("spiffe://.+/ns/" + regexp.QuoteMeta(ns) + "/(.+/|)sa/" + regexp.QuoteMeta(sa) + "(/.+)?"))
}

func trustDomainOf(_, v string) *rbacpb.Principal {
	switch {
	case v == "*":
		return authenticated(&matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_Prefix{Prefix: "spiffe://"}})
	case !strings.Contains(v, "*"):
		return authenticated(&matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_Prefix{Prefix: "spiffe://" + v + "/"}})
	}
	before, after, _ := strings.Cut(v, "*")
	return authenticated(regexMatch("spiffe://" + regexp.QuoteMeta(before) + "[^/]*" + regexp.QuoteMeta(after) + "/.*"))
}

func sourceIPOf(_, v string) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_DirectRemoteIp{DirectRemoteIp: cidr(v)}}
}

func remoteIPOf(_, v string) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_RemoteIp{RemoteIp: cidr(v)}}
}

func headerOf(key, v string) *rbacpb.Principal {
	name := strings.TrimSuffix(strings.TrimPrefix(key, "request.headers["), "]")
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_Header{Header: headerMatch(name, v, false)}}
}

func hostOf(_, v string) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_Header{Header: headerMatch(":authority", v, true)}}
}

func methodOf(_, v string) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_Header{Header: headerMatch(":method", v, false)}}
}

func pathOf(_, v string) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_UrlPath{UrlPath: &matcherpb.PathMatcher{
		Rule: &matcherpb.PathMatcher_Path{Path: stringMatch(v, "")}}}}
}

func portOf(_, v string) *rbacpb.Permission {
	n, _ := strconv.ParseUint(v, 10, 16) // validated: 1-65535
	return &rbacpb.Permission{Rule: &rbacpb.Permission_DestinationPort{DestinationPort: uint32(n)}}
}

func regexMatch(re string) *matcherpb.StringMatcher {
	return &matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_SafeRegex{SafeRegex: &matcherpb.RegexMatcher{Regex: re}}}
}

// stringMatch is Istio's value syntax: "*" any non-empty value, "*x" a suffix, "x*" a
// prefix, else exact; prefix (spiffe:// for principals) is added to what is matched.
func stringMatch(v, prefix string) *matcherpb.StringMatcher {
	switch {
	case v == "*":
		return regexMatch(".+")
	case strings.HasPrefix(v, "*"):
		if prefix == "" {
			return &matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_Suffix{Suffix: v[1:]}}
		}
		return regexMatch(regexp.QuoteMeta(prefix) + ".*" + regexp.QuoteMeta(v[1:]))
	case strings.HasSuffix(v, "*"):
		return &matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_Prefix{Prefix: prefix + v[:len(v)-1]}}
	}
	return &matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_Exact{Exact: prefix + v}}
}

// headerMatch is Istio's header matcher: "*" means present; hosts match ignoring case.
func headerMatch(name, v string, ignoreCase bool) *routepb.HeaderMatcher {
	h := &routepb.HeaderMatcher{Name: name}
	if v == "*" {
		h.HeaderMatchSpecifier = &routepb.HeaderMatcher_PresentMatch{PresentMatch: true}
		return h
	}
	m := stringMatch(v, "")
	m.IgnoreCase = ignoreCase
	h.HeaderMatchSpecifier = &routepb.HeaderMatcher_StringMatch{StringMatch: m}
	return h
}

// authzHTTPFilters places the inbound RBAC filters: after the WasmPlugins of the AUTHN
// and AUTHZ phases, before those of the STATS phase (the telemetry filter) and the rest,
// so denied requests are still counted, as Istio orders them.
func authzHTTPFilters(v *View, inbound bool, port uint32, filters []*hcm.HttpFilter) []*hcm.HttpFilter {
	if !inbound || v.IsGRPC() {
		return filters
	}
	built := buildAuthz(v, false)
	if len(built) == 0 {
		return filters
	}
	at := 0
	for _, p := range extensionsOf(v).plugins {
		if p.Matches(true, port) && wasmplugin.Rank(p.Spec.GetPhase()) < wasmplugin.Rank(extensions.PluginPhase_STATS) {
			at++
		}
	}
	out := make([]*hcm.HttpFilter, 0, len(filters)+len(built))
	out = append(out, filters[:at]...)
	for _, b := range built {
		out = append(out, &hcm.HttpFilter{Name: RBACHTTPFilter, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&rbachttp.RBAC{
			Rules: b.rules, ShadowRules: b.shadow, ShadowRulesStatPrefix: b.shadowStatsName})}})
	}
	return append(out, filters[at:]...)
}

// authzNetworkFilters are the RBAC network filters of an inbound TCP chain, in front of
// its tcp_proxy.
func authzNetworkFilters(v *View) []*listener.Filter {
	var out []*listener.Filter
	for _, b := range buildAuthz(v, true) {
		out = append(out, &listener.Filter{Name: RBACNetworkFilter, ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&rbactcp.RBAC{
			Rules: b.rules, ShadowRules: b.shadow, ShadowRulesStatPrefix: b.shadowStatsName, StatPrefix: "tcp."})}})
	}
	return out
}

// trustDomains are the mesh's trust domain and its aliases (MeshConfig trustDomain,
// trustDomainAliases), Istio's trustdomain.Bundle: a principal written for one of them
// (or for the default cluster.local) matches the same identity in each, so policies
// survive a trust domain migration.
type trustDomains []string

func meshTrustDomains(v *View) trustDomains {
	td := v.Snapshot.Mesh.GetTrustDomain()
	if td == "" {
		td = "cluster.local"
	}
	return append(trustDomains{td}, v.Snapshot.Mesh.GetTrustDomainAliases()...)
}

// migrate applies principals or expand to a when condition's values by its key.
func (b trustDomains) migrate(key string, values []string) []string {
	switch key {
	case "source.principal":
		return b.principals(values)
	case "source.trustDomain":
		return b.expand(values)
	}
	return values
}

// principals is ReplaceTrustDomainAliases: "<td>/ns/<ns>/sa/<sa>" with td one of the
// bundle's (or cluster.local) becomes one principal per trust domain of the bundle.
func (b trustDomains) principals(ps []string) []string {
	var out []string
	for _, p := range ps {
		parts := strings.Split(p, "/")
		if len(parts) != 5 || parts[0] == "*" || !(b.has(parts[0]) || parts[0] == "cluster.local") {
			out = appendNew(out, p)
			continue
		}
		for _, td := range b {
			np := td + "/" + strings.Join(parts[1:], "/")
			if strings.HasPrefix(parts[0], "*") && strings.HasSuffix(td, parts[0][1:]) {
				np = p
			}
			out = appendNew(out, np)
		}
	}
	return out
}

// expand is ExpandTrustDomainAliases: a trust domain of the bundle stands for all of them.
func (b trustDomains) expand(values []string) []string {
	var out []string
	for _, v := range values {
		if slices.Contains(b, v) {
			for _, td := range b {
				out = appendNew(out, td)
			}
		} else {
			out = appendNew(out, v)
		}
	}
	return out
}

// has is Istio's loose trust domain match: equal, "*", or a prefix or suffix pattern
// either way.
func (b trustDomains) has(td string) bool {
	for _, s := range b {
		if td == s || s == "*" || wildMatch(td, s) || wildMatch(s, td) {
			return true
		}
	}
	return false
}

func wildMatch(a, pattern string) bool {
	if p, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(a, p)
	}
	if p, ok := strings.CutPrefix(pattern, "*"); ok {
		return strings.HasSuffix(a, p)
	}
	return false
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
