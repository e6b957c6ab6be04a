// Package rbac is Envoy's role based access control for meshproxy: the engine that
// evaluates an envoy.config.rbac.v3.RBAC (policies of permissions and principals, ALLOW,
// DENY or LOG) against a request or a connection, the HTTP filter
// (envoy.filters.http.rbac) and the network filter (envoy.filters.network.rbac) built on
// it, with Envoy's responses, response code details and statistics.
package rbac

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"sort"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/route"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

// Input is what the engine evaluates: a connection, and for the HTTP filter its request.
type Input struct {
	// Request is nil for a connection (the network filter): header and url_path rules
	// never match there, as in Envoy, whose network filter has no request headers.
	Request *http.Request
	// DirectRemote is the downstream peer's address; Remote the original client's (the
	// last x-forwarded-for address when the request has one, else DirectRemote).
	DirectRemote netip.Addr
	Remote       netip.Addr
	// Local is the address the connection was accepted on (its original destination).
	Local netip.AddrPort
	// TLS is the downstream connection's TLS, nil for plaintext.
	TLS *streaminfo.TLS

	path    string // the request's path without its query, computed once
	hasPath bool
}

// urlPath is the request's path without its query string, as Envoy's url_path matchers see
// it (meshproxy normalises no path).
func (in *Input) urlPath() string {
	if !in.hasPath {
		in.path, _, _ = strings.Cut(in.Request.URL.RequestURI(), "?")
		in.hasPath = true
	}
	return in.path
}

// Decision is an engine's answer.
type Decision struct {
	Allowed bool
	// Matched reports whether a policy matched; PolicyID names the first that did (policies
	// are tried in name order, as Envoy's engine keeps them in a sorted map).
	Matched  bool
	PolicyID string
}

// Engine is a compiled RBAC.
type Engine struct {
	action   rbacv3.RBAC_Action
	policies []policy
}

type policy struct {
	name        string
	permissions []matcher
	principals  []matcher
}

type matcher interface{ match(in *Input) bool }

// Compile builds the engine of r; it refuses what Envoy would reject and what meshproxy
// cannot evaluate (CEL conditions, metadata and filter state), naming the policy and field.
func Compile(r *rbacv3.RBAC) (*Engine, error) {
	if err := r.ValidateAll(); err != nil {
		return nil, err
	}
	e := &Engine{action: r.GetAction()}
	if r.GetAuditLoggingOptions() != nil {
		return nil, errors.New("audit_logging_options is not supported")
	}
	names := make([]string, 0, len(r.GetPolicies()))
	for n := range r.GetPolicies() {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := r.GetPolicies()[n]
		if p.GetCondition() != nil || p.GetCheckedCondition() != nil {
			return nil, fmt.Errorf("policies[%s]: CEL conditions are not supported", n)
		}
		cp := policy{name: n}
		for i, perm := range p.GetPermissions() {
			m, err := compilePermission(perm)
			if err != nil {
				return nil, fmt.Errorf("policies[%s].permissions[%d]: %w", n, i, err)
			}
			cp.permissions = append(cp.permissions, m)
		}
		for i, pr := range p.GetPrincipals() {
			m, err := compilePrincipal(pr)
			if err != nil {
				return nil, fmt.Errorf("policies[%s].principals[%d]: %w", n, i, err)
			}
			cp.principals = append(cp.principals, m)
		}
		e.policies = append(e.policies, cp)
	}
	return e, nil
}

// Action is the engine's action.
func (e *Engine) Action() rbacv3.RBAC_Action { return e.action }

// Evaluate decides in: a policy matches when one of its permissions and one of its
// principals match. ALLOW allows what a policy matches, DENY denies it, LOG allows
// everything and reports the match.
func (e *Engine) Evaluate(in *Input) Decision {
	var d Decision
	for i := range e.policies {
		if p := &e.policies[i]; anyMatch(p.permissions, in) && anyMatch(p.principals, in) {
			d.Matched, d.PolicyID = true, p.name
			break
		}
	}
	switch e.action {
	case rbacv3.RBAC_ALLOW:
		d.Allowed = d.Matched
	case rbacv3.RBAC_DENY:
		d.Allowed = !d.Matched
	default: // LOG
		d.Allowed = true
	}
	return d
}

func anyMatch(ms []matcher, in *Input) bool {
	for _, m := range ms {
		if m.match(in) {
			return true
		}
	}
	return false
}

func allMatch(ms []matcher, in *Input) bool {
	for _, m := range ms {
		if !m.match(in) {
			return false
		}
	}
	return true
}

type matchFunc func(in *Input) bool

func (f matchFunc) match(in *Input) bool { return f(in) }

var matchAny = matchFunc(func(*Input) bool { return true })

func compilePermission(p *rbacv3.Permission) (matcher, error) {
	switch r := p.GetRule().(type) {
	case *rbacv3.Permission_Any:
		return matchAny, nil
	case *rbacv3.Permission_AndRules:
		ms, err := compilePermissions(r.AndRules.GetRules())
		return matchFunc(func(in *Input) bool { return allMatch(ms, in) }), err
	case *rbacv3.Permission_OrRules:
		ms, err := compilePermissions(r.OrRules.GetRules())
		return matchFunc(func(in *Input) bool { return anyMatch(ms, in) }), err
	case *rbacv3.Permission_NotRule:
		m, err := compilePermission(r.NotRule)
		if err != nil {
			return nil, fmt.Errorf("not_rule: %w", err)
		}
		return matchFunc(func(in *Input) bool { return !m.match(in) }), nil
	case *rbacv3.Permission_Header:
		return compileHeader(r.Header)
	case *rbacv3.Permission_UrlPath:
		return compilePath(r.UrlPath)
	case *rbacv3.Permission_DestinationIp:
		pfx, err := prefixOf(r.DestinationIp)
		if err != nil {
			return nil, fmt.Errorf("destination_ip: %w", err)
		}
		return matchFunc(func(in *Input) bool { return pfx.Contains(in.Local.Addr().Unmap()) }), nil
	case *rbacv3.Permission_DestinationPort:
		port := r.DestinationPort
		return matchFunc(func(in *Input) bool { return uint32(in.Local.Port()) == port }), nil
	case *rbacv3.Permission_DestinationPortRange:
		lo, hi := r.DestinationPortRange.GetStart(), r.DestinationPortRange.GetEnd()
		return matchFunc(func(in *Input) bool { p := int32(in.Local.Port()); return p >= lo && p < hi }), nil
	case *rbacv3.Permission_RequestedServerName:
		sm, err := route.CompileStringMatcher(r.RequestedServerName)
		if err != nil {
			return nil, fmt.Errorf("requested_server_name: %w", err)
		}
		// Without TLS (or without SNI) the server name is empty, and is matched as such.
		return matchFunc(func(in *Input) bool {
			sni := ""
			if in.TLS != nil {
				sni = in.TLS.SNI
			}
			return sm.Match(sni)
		}), nil
	}
	return nil, fmt.Errorf("permission %T is not supported", p.GetRule())
}

func compilePermissions(ps []*rbacv3.Permission) ([]matcher, error) {
	out := make([]matcher, 0, len(ps))
	for i, p := range ps {
		m, err := compilePermission(p)
		if err != nil {
			return nil, fmt.Errorf("rules[%d]: %w", i, err)
		}
		out = append(out, m)
	}
	return out, nil
}

func compilePrincipal(p *rbacv3.Principal) (matcher, error) {
	switch id := p.GetIdentifier().(type) {
	case *rbacv3.Principal_Any:
		return matchAny, nil
	case *rbacv3.Principal_AndIds:
		ms, err := compilePrincipals(id.AndIds.GetIds())
		return matchFunc(func(in *Input) bool { return allMatch(ms, in) }), err
	case *rbacv3.Principal_OrIds:
		ms, err := compilePrincipals(id.OrIds.GetIds())
		return matchFunc(func(in *Input) bool { return anyMatch(ms, in) }), err
	case *rbacv3.Principal_NotId:
		m, err := compilePrincipal(id.NotId)
		if err != nil {
			return nil, fmt.Errorf("not_id: %w", err)
		}
		return matchFunc(func(in *Input) bool { return !m.match(in) }), nil
	case *rbacv3.Principal_Authenticated_:
		return compileAuthenticated(id.Authenticated)
	case *rbacv3.Principal_DirectRemoteIp:
		return ipMatcher("direct_remote_ip", id.DirectRemoteIp, func(in *Input) netip.Addr { return in.DirectRemote })
	case *rbacv3.Principal_SourceIp: //nolint:staticcheck // deprecated in Envoy, still accepted
		return ipMatcher("source_ip", id.SourceIp, func(in *Input) netip.Addr { return in.DirectRemote })
	case *rbacv3.Principal_RemoteIp:
		return ipMatcher("remote_ip", id.RemoteIp, func(in *Input) netip.Addr { return in.Remote })
	case *rbacv3.Principal_Header:
		return compileHeader(id.Header)
	case *rbacv3.Principal_UrlPath:
		return compilePath(id.UrlPath)
	}
	return nil, fmt.Errorf("principal %T is not supported", p.GetIdentifier())
}

func compilePrincipals(ps []*rbacv3.Principal) ([]matcher, error) {
	out := make([]matcher, 0, len(ps))
	for i, p := range ps {
		m, err := compilePrincipal(p)
		if err != nil {
			return nil, fmt.Errorf("ids[%d]: %w", i, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// compileAuthenticated matches a connection with TLS; with a principal_name, the peer
// certificate's URI SANs, then its DNS SANs, then its subject (empty without a peer
// certificate), as Envoy's AuthenticatedMatcher does.
func compileAuthenticated(a *rbacv3.Principal_Authenticated) (matcher, error) {
	if a.GetPrincipalName() == nil {
		return matchFunc(func(in *Input) bool { return in.TLS != nil }), nil
	}
	sm, err := route.CompileStringMatcher(a.GetPrincipalName())
	if err != nil {
		return nil, fmt.Errorf("authenticated.principal_name: %w", err)
	}
	return matchFunc(func(in *Input) bool {
		t := in.TLS
		if t == nil {
			return false
		}
		for _, s := range t.PeerURISANs {
			if sm.Match(s) {
				return true
			}
		}
		for _, s := range t.PeerDNSSANs {
			if sm.Match(s) {
				return true
			}
		}
		return sm.Match(t.PeerSubject)
	}), nil
}

func ipMatcher(field string, c *corev3.CidrRange, addr func(*Input) netip.Addr) (matcher, error) {
	pfx, err := prefixOf(c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return matchFunc(func(in *Input) bool { return pfx.Contains(addr(in).Unmap()) }), nil
}

func prefixOf(c *corev3.CidrRange) (netip.Prefix, error) {
	a, err := netip.ParseAddr(c.GetAddressPrefix())
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("address_prefix %q is not an IP address", c.GetAddressPrefix())
	}
	a = a.Unmap()
	bits := int(c.GetPrefixLen().GetValue())
	if bits > a.BitLen() {
		return netip.Prefix{}, fmt.Errorf("prefix_len %d is longer than %s's %d bits", bits, a, a.BitLen())
	}
	return netip.PrefixFrom(a, bits).Masked(), nil
}

// compileHeader matches a request header (pseudo headers :method, :authority, :path too)
// with the route matcher's semantics; a connection has no headers.
func compileHeader(h *routev3.HeaderMatcher) (matcher, error) {
	hm, err := route.CompileHeaderMatchers([]*routev3.HeaderMatcher{h})
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	return matchFunc(func(in *Input) bool { return in.Request != nil && hm.Match(in.Request) }), nil
}

// compilePath matches the request's path without its query string, as Envoy's PathMatcher
// (meshproxy normalises no path).
func compilePath(p *matcherv3.PathMatcher) (matcher, error) {
	sm, err := route.CompileStringMatcher(p.GetPath())
	if err != nil {
		return nil, fmt.Errorf("url_path: %w", err)
	}
	return matchFunc(func(in *Input) bool {
		if in.Request == nil {
			return false
		}
		return sm.Match(in.urlPath())
	}), nil
}
