package envoyfilter

import (
	"slices"
	"strconv"
	"strings"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// routeOrder is the order of route steps, Istio's: route configuration merges, then virtual
// host removals, merges and replacements, then route removals and merges, then route
// inserts, and last the virtual hosts patches add, which no other patch touches.
func (s *Set) routeOrder() []*Patch {
	var out []*Patch
	out = append(out, s.patches[networking.EnvoyFilter_ROUTE_CONFIGURATION]...)
	for _, p := range s.patches[networking.EnvoyFilter_VIRTUAL_HOST] {
		if p.Op != networking.EnvoyFilter_Patch_ADD {
			out = append(out, p)
		}
	}
	for _, p := range s.patches[networking.EnvoyFilter_HTTP_ROUTE] {
		if p.Op == networking.EnvoyFilter_Patch_REMOVE || p.isMerge() {
			out = append(out, p)
		}
	}
	for _, p := range s.patches[networking.EnvoyFilter_HTTP_ROUTE] {
		if p.Op != networking.EnvoyFilter_Patch_REMOVE && !p.isMerge() {
			out = append(out, p)
		}
	}
	for _, p := range s.patches[networking.EnvoyFilter_VIRTUAL_HOST] {
		if p.Op == networking.EnvoyFilter_Patch_ADD {
			out = append(out, p)
		}
	}
	return out
}

// HasRoutePatches reports whether PatchRouteConfiguration can change anything.
func (s *Set) HasRoutePatches() bool {
	return s.Has(networking.EnvoyFilter_ROUTE_CONFIGURATION, networking.EnvoyFilter_VIRTUAL_HOST, networking.EnvoyFilter_HTTP_ROUTE)
}

// PatchRouteConfiguration applies the route patches of ctx to rc, which it modifies (pass a
// copy), and returns it with the patches that were undone.
func (s *Set) PatchRouteConfiguration(rc *route.RouteConfiguration, ctx networking.EnvoyFilter_PatchContext) (*route.RouteConfiguration, []*PatchError) {
	st := &stepper{resource: "route configuration " + rc.GetName()}
	cur := proto.Message(rc)
	for _, p := range s.routeOrder() {
		if !contextMatches(p, ctx) {
			continue
		}
		cur = st.step(cur, p, func(m proto.Message) (bool, error) {
			return applyRoutePatch(p, m.(*route.RouteConfiguration), ctx)
		})
	}
	return cur.(*route.RouteConfiguration), st.errs
}

// routePort is the port a route configuration serves: "inbound|<port>||" inline in inbound
// listeners, "<port>" for outbound RDS.
func routePort(name string) uint32 {
	if rest, ok := strings.CutPrefix(name, "inbound|"); ok {
		name, _, _ = strings.Cut(rest, "|")
	}
	n, _ := strconv.ParseUint(name, 10, 32)
	return uint32(n)
}

func routeConfigurationMatch(rc *route.RouteConfiguration, p *Patch) bool {
	m := p.Match.GetRouteConfiguration()
	if m == nil {
		return true
	}
	if m.GetPortNumber() != 0 && m.GetPortNumber() != routePort(rc.GetName()) {
		return false
	}
	// portName and gateway select gateway servers; validation allows them only with the
	// GATEWAY context, which no sidecar route is in.
	return m.GetName() == "" || m.GetName() == rc.GetName()
}

func virtualHostMatch(vh *route.VirtualHost, p *Patch) bool {
	m := p.Match.GetRouteConfiguration().GetVhost()
	if m == nil {
		return true
	}
	if m.GetName() != "" && m.GetName() != vh.GetName() {
		return false
	}
	return m.GetDomainName() == "" || slices.Contains(vh.GetDomains(), m.GetDomainName())
}

func hasRouteMatch(p *Patch) bool {
	return p.Match.GetRouteConfiguration().GetVhost().GetRoute() != nil
}

func routeMatch(r *route.Route, p *Patch) bool {
	m := p.Match.GetRouteConfiguration().GetVhost().GetRoute()
	if m == nil {
		return true
	}
	if m.GetName() != "" && m.GetName() != r.GetName() {
		return false
	}
	switch m.GetAction() {
	case networking.EnvoyFilter_RouteConfigurationMatch_RouteMatch_ROUTE:
		return r.GetRoute() != nil
	case networking.EnvoyFilter_RouteConfigurationMatch_RouteMatch_REDIRECT:
		return r.GetRedirect() != nil
	case networking.EnvoyFilter_RouteConfigurationMatch_RouteMatch_DIRECT_RESPONSE:
		return r.GetDirectResponse() != nil
	}
	return true
}

func applyRoutePatch(p *Patch, rc *route.RouteConfiguration, _ networking.EnvoyFilter_PatchContext) (bool, error) {
	if !routeConfigurationMatch(rc, p) {
		return false, nil
	}
	replace := p.Op == networking.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST
	switch p.ApplyTo {
	case networking.EnvoyFilter_ROUTE_CONFIGURATION:
		return true, Merge(rc, p.Value, replace)
	case networking.EnvoyFilter_VIRTUAL_HOST:
		if p.Op == networking.EnvoyFilter_Patch_ADD {
			rc.VirtualHosts = append(rc.VirtualHosts, proto.Clone(p.Value).(*route.VirtualHost))
			return true, nil
		}
		applied := false
		keep := rc.VirtualHosts[:0]
		for _, vh := range rc.VirtualHosts {
			if !virtualHostMatch(vh, p) {
				keep = append(keep, vh)
				continue
			}
			applied = true
			switch {
			case p.Op == networking.EnvoyFilter_Patch_REMOVE:
				continue
			case p.Op == networking.EnvoyFilter_Patch_REPLACE:
				vh = proto.Clone(p.Value).(*route.VirtualHost)
			default:
				if err := Merge(vh, p.Value, replace); err != nil {
					return false, err
				}
			}
			keep = append(keep, vh)
		}
		rc.VirtualHosts = keep
		return applied, nil
	case networking.EnvoyFilter_HTTP_ROUTE:
		applied := false
		for _, vh := range rc.VirtualHosts {
			if !virtualHostMatch(vh, p) {
				continue
			}
			ok, err := applyHTTPRoutePatch(p, vh, replace)
			if err != nil {
				return false, err
			}
			applied = applied || ok
		}
		return applied, nil
	}
	return false, nil
}

func applyHTTPRoutePatch(p *Patch, vh *route.VirtualHost, replace bool) (bool, error) {
	value := func() *route.Route { return proto.Clone(p.Value).(*route.Route) }
	match := func(r *route.Route) bool { return routeMatch(r, p) }
	switch p.Op {
	case networking.EnvoyFilter_Patch_REMOVE:
		n := len(vh.Routes)
		vh.Routes = slices.DeleteFunc(vh.Routes, match)
		return len(vh.Routes) != n, nil
	case networking.EnvoyFilter_Patch_MERGE, networking.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST:
		applied := false
		for _, r := range vh.Routes {
			if match(r) {
				if err := Merge(r, p.Value, replace); err != nil {
					return false, err
				}
				applied = true
			}
		}
		return applied, nil
	case networking.EnvoyFilter_Patch_INSERT_FIRST:
		// With a route match, the route goes first only if the virtual host has a match.
		if hasRouteMatch(p) && !slices.ContainsFunc(vh.Routes, match) {
			return false, nil
		}
		vh.Routes = slices.Insert(vh.Routes, 0, value())
		return true, nil
	}
	var applied bool
	vh.Routes, applied = applyList(vh.Routes, p, hasRouteMatch(p), match, value)
	return applied, nil
}
