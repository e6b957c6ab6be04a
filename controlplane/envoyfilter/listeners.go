package envoyfilter

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/envoytypes"
)

// Names of Istio's virtual listeners: their filter chains, not the listener, carry the port.
const (
	virtualInbound  = "virtualInbound"
	virtualOutbound = "virtualOutbound"
	hcmName         = "envoy.filters.network.http_connection_manager"
)

// Ranks places HTTP filters the control plane generated, for ADD patches with a filterClass:
// 1 AUTHN, 2 AUTHZ and 3 STATS for the Wasm plugins of those phases, 4 for plugins without a
// phase, 5 for the router; 0 for filters it does not know.
type Ranks func(httpFilter string) int

// ListenerContext is the patch context of a listener: its traffic direction.
func ListenerContext(l *listener.Listener) networking.EnvoyFilter_PatchContext {
	if l.GetTrafficDirection() == core.TrafficDirection_INBOUND {
		return networking.EnvoyFilter_SIDECAR_INBOUND
	}
	return networking.EnvoyFilter_SIDECAR_OUTBOUND
}

// listenerOrder is the order of the steps on one listener, Istio's order of application:
// the listener itself, its listener filters, its filter chains, their network filters
// (inserts and removals before merges), the HTTP filters of connection managers (likewise),
// and last the filter chains that patches add, which no other patch touches.
func (s *Set) listenerOrder() []*Patch {
	var out []*Patch
	pick := func(kind networking.EnvoyFilter_ApplyTo, keep func(*Patch) bool) {
		for _, p := range s.patches[kind] {
			if keep(p) {
				out = append(out, p)
			}
		}
	}
	notAdd := func(p *Patch) bool { return p.Op != networking.EnvoyFilter_Patch_ADD }
	all := func(*Patch) bool { return true }
	merge := func(p *Patch) bool { return p.isMerge() }
	structural := func(p *Patch) bool { return !p.isMerge() }
	pick(networking.EnvoyFilter_LISTENER, notAdd)
	pick(networking.EnvoyFilter_LISTENER_FILTER, all)
	pick(networking.EnvoyFilter_FILTER_CHAIN, notAdd)
	pick(networking.EnvoyFilter_NETWORK_FILTER, structural)
	pick(networking.EnvoyFilter_NETWORK_FILTER, merge)
	pick(networking.EnvoyFilter_HTTP_FILTER, structural)
	pick(networking.EnvoyFilter_HTTP_FILTER, merge)
	pick(networking.EnvoyFilter_FILTER_CHAIN, func(p *Patch) bool { return p.Op == networking.EnvoyFilter_Patch_ADD })
	return out
}

// HasListenerPatches reports whether PatchListener can change anything.
func (s *Set) HasListenerPatches() bool {
	return s.Has(networking.EnvoyFilter_LISTENER, networking.EnvoyFilter_LISTENER_FILTER, networking.EnvoyFilter_FILTER_CHAIN,
		networking.EnvoyFilter_NETWORK_FILTER, networking.EnvoyFilter_HTTP_FILTER,
		networking.EnvoyFilter_ROUTE_CONFIGURATION, networking.EnvoyFilter_VIRTUAL_HOST, networking.EnvoyFilter_HTTP_ROUTE)
}

// PatchListener applies the set's patches to l, which it modifies (pass a copy): first the
// route patches to the route configurations inbound connection managers carry inline (Istio
// patches them while building the listener), then the listener-class patches. It returns the
// listener, or nil when a patch removed it, and the patches that were undone because the
// listener was invalid with them.
func (s *Set) PatchListener(l *listener.Listener, ranks Ranks) (*listener.Listener, []*PatchError) {
	ctx := ListenerContext(l)
	st := &stepper{resource: "listener " + l.GetName()}
	cur := proto.Message(l)
	if ctx == networking.EnvoyFilter_SIDECAR_INBOUND {
		for _, p := range s.routeOrder() {
			if !contextMatches(p, ctx) {
				continue
			}
			cur = st.step(cur, p, func(m proto.Message) (bool, error) {
				return eachHCM(m.(*listener.Listener), nil, func(_ *listener.FilterChain, h *hcm.HttpConnectionManager) (bool, error) {
					rc := h.GetRouteConfig()
					if rc == nil {
						return false, nil
					}
					return applyRoutePatch(p, rc, ctx)
				})
			})
		}
	}
	removed := false
	for _, p := range s.listenerOrder() {
		if removed {
			break
		}
		if !contextMatches(p, ctx) || !listenerMatch(cur.(*listener.Listener), p) {
			continue
		}
		if p.ApplyTo == networking.EnvoyFilter_LISTENER && p.Op == networking.EnvoyFilter_Patch_REMOVE {
			removed = true
			continue
		}
		cur = st.step(cur, p, func(m proto.Message) (bool, error) {
			return applyListenerPatch(p, m.(*listener.Listener), ranks, s.classes)
		})
	}
	if removed {
		return nil, st.errs
	}
	return cur.(*listener.Listener), st.errs
}

// Added returns copies of the resources of applyTo (LISTENER or CLUSTER) that the set's ADD
// patches add in ctx.
func (s *Set) Added(applyTo networking.EnvoyFilter_ApplyTo, ctx networking.EnvoyFilter_PatchContext) []*AddedResource {
	var out []*AddedResource
	for _, p := range s.patches[applyTo] {
		if p.Op == networking.EnvoyFilter_Patch_ADD && addsIn(p, ctx) {
			out = append(out, &AddedResource{Patch: p, Value: proto.Clone(p.Value)})
		}
	}
	return out
}

// AddedResource is an object an ADD patch contributes.
type AddedResource struct {
	Patch *Patch
	Value proto.Message
}

// stepper applies patches one at a time to a resource, validating after each, and undoes a
// step that leaves the resource invalid.
type stepper struct {
	resource string
	errs     []*PatchError
}

func (st *stepper) step(cur proto.Message, p *Patch, apply func(proto.Message) (bool, error)) proto.Message {
	next := proto.Clone(cur)
	applied, err := apply(next)
	if err == nil && !applied {
		return cur
	}
	if err == nil {
		err = envoytypes.Validate(next)
	}
	if err != nil {
		st.errs = append(st.errs, &PatchError{Patch: p, Resource: st.resource, Err: err})
		return cur
	}
	return next
}

func isVirtual(l *listener.Listener) bool {
	return l.GetName() == virtualInbound || l.GetName() == virtualOutbound
}

func listenerMatch(l *listener.Listener, p *Patch) bool {
	lm := p.Match.GetListener()
	if lm == nil {
		return true
	}
	if lm.GetName() != "" && lm.GetName() != l.GetName() {
		return false
	}
	// The virtual listeners carry the ports in their filter chains, matched there.
	if p.ApplyTo != networking.EnvoyFilter_LISTENER && isVirtual(l) {
		return true
	}
	return lm.GetPortNumber() == 0 || l.GetAddress().GetSocketAddress().GetPortValue() == lm.GetPortNumber()
}

func filterChainMatch(l *listener.Listener, fc *listener.FilterChain, p *Patch) bool {
	lm := p.Match.GetListener()
	if lm == nil {
		return true
	}
	if isVirtual(l) && lm.GetPortNumber() > 0 && fc.GetFilterChainMatch().GetDestinationPort().GetValue() != lm.GetPortNumber() {
		return false
	}
	m := lm.GetFilterChain()
	if m == nil {
		return true
	}
	fcm := fc.GetFilterChainMatch()
	switch {
	case m.GetName() != "" && m.GetName() != fc.GetName():
		return false
	case m.GetSni() != "" && !slices.Contains(fcm.GetServerNames(), m.GetSni()):
		return false
	case m.GetTransportProtocol() != "" && fcm.GetTransportProtocol() != m.GetTransportProtocol():
		return false
	case m.GetDestinationPort() > 0 && fcm.GetDestinationPort().GetValue() != m.GetDestinationPort():
		return false
	}
	if ap := m.GetApplicationProtocols(); ap != "" {
		for _, a := range strings.Split(ap, ",") {
			if !slices.Contains(fcm.GetApplicationProtocols(), a) {
				return false
			}
		}
	}
	return true
}

func filterMatch(f *listener.Filter, p *Patch) bool {
	m := p.Match.GetListener().GetFilterChain().GetFilter()
	return m == nil || m.GetName() == f.GetName()
}

func hasFilterMatch(p *Patch) bool { return p.Match.GetListener().GetFilterChain().GetFilter() != nil }

func subFilterMatch(f *hcm.HttpFilter, p *Patch) bool {
	m := p.Match.GetListener().GetFilterChain().GetFilter().GetSubFilter()
	return m == nil || m.GetName() == f.GetName()
}

func hasSubFilterMatch(p *Patch) bool {
	return p.Match.GetListener().GetFilterChain().GetFilter().GetSubFilter() != nil
}

// chains lists a listener's filter chains, the default one last.
func chains(l *listener.Listener) []*listener.FilterChain {
	out := slices.Clone(l.GetFilterChains())
	if l.GetDefaultFilterChain() != nil {
		out = append(out, l.GetDefaultFilterChain())
	}
	return out
}

func applyListenerPatch(p *Patch, l *listener.Listener, ranks Ranks, classes map[string]int) (bool, error) {
	switch p.ApplyTo {
	case networking.EnvoyFilter_LISTENER:
		if p.isMerge() {
			return true, Merge(l, p.Value, p.Op == networking.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST)
		}
	case networking.EnvoyFilter_LISTENER_FILTER:
		name := p.Match.GetListener().GetListenerFilter()
		var applied bool
		l.ListenerFilters, applied = applyList(l.ListenerFilters, p, name != "",
			func(f *listener.ListenerFilter) bool { return name == "" || f.GetName() == name },
			func() *listener.ListenerFilter { return proto.Clone(p.Value).(*listener.ListenerFilter) })
		return applied, nil
	case networking.EnvoyFilter_FILTER_CHAIN:
		return applyFilterChainPatch(p, l)
	case networking.EnvoyFilter_NETWORK_FILTER:
		return applyNetworkFilterPatch(p, l)
	case networking.EnvoyFilter_HTTP_FILTER:
		return eachHCM(l, p, func(_ *listener.FilterChain, h *hcm.HttpConnectionManager) (bool, error) {
			return applyHTTPFilterPatch(p, h, ranks, classes)
		})
	}
	return false, nil
}

func applyFilterChainPatch(p *Patch, l *listener.Listener) (bool, error) {
	if p.Op == networking.EnvoyFilter_Patch_ADD {
		l.FilterChains = append(l.FilterChains, proto.Clone(p.Value).(*listener.FilterChain))
		return true, nil
	}
	applied := false
	keep := l.FilterChains[:0]
	for _, fc := range l.FilterChains {
		if !filterChainMatch(l, fc, p) {
			keep = append(keep, fc)
			continue
		}
		applied = true
		if p.Op == networking.EnvoyFilter_Patch_REMOVE {
			continue
		}
		if err := Merge(fc, p.Value, p.Op == networking.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST); err != nil {
			return false, err
		}
		keep = append(keep, fc)
	}
	l.FilterChains = keep
	if fc := l.GetDefaultFilterChain(); fc != nil && filterChainMatch(l, fc, p) {
		applied = true
		if p.Op == networking.EnvoyFilter_Patch_REMOVE {
			l.DefaultFilterChain = nil
		} else if err := Merge(fc, p.Value, p.Op == networking.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST); err != nil {
			return false, err
		}
	}
	return applied, nil
}

func applyNetworkFilterPatch(p *Patch, l *listener.Listener) (bool, error) {
	applied := false
	for _, fc := range chains(l) {
		if !filterChainMatch(l, fc, p) {
			continue
		}
		if !p.isMerge() {
			var ok bool
			fc.Filters, ok = applyList(fc.Filters, p, hasFilterMatch(p),
				func(f *listener.Filter) bool { return filterMatch(f, p) },
				func() *listener.Filter { return proto.Clone(p.Value).(*listener.Filter) })
			applied = applied || ok
			continue
		}
		for _, f := range fc.Filters {
			if !filterMatch(f, p) {
				continue
			}
			if err := mergeNetworkFilter(f, p); err != nil {
				return false, err
			}
			applied = true
		}
	}
	return applied, nil
}

func mergeNetworkFilter(f *listener.Filter, p *Patch) error {
	v := p.Value.(*listener.Filter)
	if f.GetTypedConfig() == nil {
		return fmt.Errorf("network filter %s has no typed_config to merge into", f.GetName())
	}
	if v.GetName() != "" {
		f.Name = v.GetName()
	}
	if v.GetTypedConfig() != nil {
		merged, err := MergeAny(f.GetTypedConfig(), v.GetTypedConfig())
		if err != nil {
			return fmt.Errorf("network filter %s: %w", f.GetName(), err)
		}
		f.ConfigType = &listener.Filter_TypedConfig{TypedConfig: merged}
	}
	return nil
}

// eachHCM calls fn with every HTTP connection manager of the listener's chains the patch
// selects (all of them for a nil patch) and packs back the ones fn changed.
func eachHCM(l *listener.Listener, p *Patch, fn func(*listener.FilterChain, *hcm.HttpConnectionManager) (bool, error)) (bool, error) {
	applied := false
	for _, fc := range chains(l) {
		if p != nil && !filterChainMatch(l, fc, p) {
			continue
		}
		for _, f := range fc.GetFilters() {
			if f.GetName() != hcmName || f.GetTypedConfig() == nil || (p != nil && !filterMatch(f, p)) {
				continue
			}
			h := &hcm.HttpConnectionManager{}
			if err := f.GetTypedConfig().UnmarshalTo(h); err != nil {
				return false, fmt.Errorf("%s: %w", hcmName, err)
			}
			ok, err := fn(fc, h)
			if err != nil {
				return false, err
			}
			if !ok {
				continue
			}
			a, err := pack(h)
			if err != nil {
				return false, err
			}
			f.ConfigType = &listener.Filter_TypedConfig{TypedConfig: a}
			applied = true
		}
	}
	return applied, nil
}

func applyHTTPFilterPatch(p *Patch, h *hcm.HttpConnectionManager, ranks Ranks, classes map[string]int) (bool, error) {
	if p.isMerge() {
		applied := false
		for _, f := range h.HttpFilters {
			if !subFilterMatch(f, p) {
				continue
			}
			if err := mergeHTTPFilter(f, p); err != nil {
				return false, err
			}
			applied = true
		}
		return applied, nil
	}
	if p.Op == networking.EnvoyFilter_Patch_ADD && p.Class != networking.EnvoyFilter_Patch_UNSPECIFIED {
		h.HttpFilters = insertByClass(h.HttpFilters, proto.Clone(p.Value).(*hcm.HttpFilter), int(p.Class), ranks, classes)
		return true, nil
	}
	var applied bool
	h.HttpFilters, applied = applyList(h.HttpFilters, p, hasSubFilterMatch(p),
		func(f *hcm.HttpFilter) bool { return subFilterMatch(f, p) },
		func() *hcm.HttpFilter { return proto.Clone(p.Value).(*hcm.HttpFilter) })
	return applied, nil
}

// insertByClass puts f after the generated filters of its class and the filters added
// before it with the same class (Istio: "within a filter class, filters are inserted in the
// order of processing"), before those of later classes.
func insertByClass(list []*hcm.HttpFilter, f *hcm.HttpFilter, class int, ranks Ranks, classes map[string]int) []*hcm.HttpFilter {
	rank := func(hf *hcm.HttpFilter) int {
		if c := classes[hf.GetName()]; c > 0 {
			return c
		}
		if ranks == nil {
			return 0
		}
		return ranks(hf.GetName())
	}
	at := -1
	for i, hf := range list {
		if r := rank(hf); r > 0 && r <= class {
			at = i + 1
		}
	}
	if at < 0 {
		at = len(list)
		for i, hf := range list {
			if rank(hf) > class {
				at = i
				break
			}
		}
	}
	return slices.Insert(list, at, f)
}

func mergeHTTPFilter(f *hcm.HttpFilter, p *Patch) error {
	v := p.Value.(*hcm.HttpFilter)
	if v.GetName() != "" {
		f.Name = v.GetName()
	}
	if v.GetTypedConfig() != nil {
		if f.GetTypedConfig() == nil {
			return fmt.Errorf("HTTP filter %s has no typed_config to merge into (a filter configured through ECDS is patched with EXTENSION_CONFIG)", f.GetName())
		}
		merged, err := MergeAny(f.GetTypedConfig(), v.GetTypedConfig())
		if err != nil {
			return fmt.Errorf("HTTP filter %s: %w", f.GetName(), err)
		}
		f.ConfigType = &hcm.HttpFilter_TypedConfig{TypedConfig: merged}
	}
	if v.GetConfigDiscovery() != nil {
		return errors.New("config_discovery cannot be merged into a filter; replace the filter instead")
	}
	if v.GetIsOptional() {
		f.IsOptional = true
	}
	if v.GetDisabled() {
		f.Disabled = true
	}
	return nil
}

// applyList is Istio's list operations on named objects: ADD appends; INSERT_FIRST
// prepends; INSERT_BEFORE/INSERT_AFTER insert next to the first match (without a match
// condition: at the front/the end); REPLACE replaces the first match; REMOVE removes every
// match (REPLACE and REMOVE need a match condition).
func applyList[E any](list []E, p *Patch, hasMatch bool, match func(E) bool, value func() E) ([]E, bool) {
	first := slices.IndexFunc(list, match)
	switch p.Op {
	case networking.EnvoyFilter_Patch_ADD:
		return append(list, value()), true
	case networking.EnvoyFilter_Patch_INSERT_FIRST:
		return slices.Insert(list, 0, value()), true
	case networking.EnvoyFilter_Patch_INSERT_BEFORE:
		if !hasMatch {
			return slices.Insert(list, 0, value()), true
		}
		if first < 0 {
			return list, false
		}
		return slices.Insert(list, first, value()), true
	case networking.EnvoyFilter_Patch_INSERT_AFTER:
		if !hasMatch {
			return append(list, value()), true
		}
		if first < 0 {
			return list, false
		}
		return slices.Insert(list, first+1, value()), true
	case networking.EnvoyFilter_Patch_REPLACE:
		if !hasMatch || first < 0 {
			return list, false
		}
		list[first] = value()
		return list, true
	case networking.EnvoyFilter_Patch_REMOVE:
		if !hasMatch || first < 0 {
			return list, false
		}
		return slices.DeleteFunc(list, match), true
	}
	return list, false
}
