package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/wasmesh/wasmesh/controlplane/envoytypes"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// The extension kinds (EnvoyFilter, WasmPlugin, Telemetry) are validated field by field: each
// field is either translated by the envoyfilter, wasmplugin or telemetryapi packages or
// rejected here with its path. Fields that only select gateways or waypoints (targetRefs,
// gateway matches) are rejected, because wasmesh serves sidecars only.

const errTargetRefs = "not supported: targetRefs select gateways and waypoints, which wasmesh does not run; use a workload selector"

// validateEnvoyFilterSpec checks an EnvoyFilter, including that every patch value decodes
// into the Envoy type its applyTo names.
func validateEnvoyFilterSpec(m proto.Message) *FieldError {
	ef := m.(*networking.EnvoyFilter)
	if len(ef.GetTargetRefs()) > 0 {
		return fieldErr("targetRefs", errTargetRefs)
	}
	if ws := ef.GetWorkloadSelector(); ws != nil {
		if fe := validateLabels("workloadSelector.labels", ws.GetLabels()); fe != nil {
			return fe
		}
	}
	for i, cp := range ef.GetConfigPatches() {
		if fe := validateEnvoyFilterPatch(fmt.Sprintf("configPatches[%d]", i), cp); fe != nil {
			return fe
		}
	}
	return nil
}

// Operations per applyTo, as Istio applies them. INSERT_* on kinds whose order does not
// matter are applied as ADD (Istio converts them), so they are accepted there.
var envoyFilterOps = map[networking.EnvoyFilter_ApplyTo]map[networking.EnvoyFilter_Patch_Operation]bool{
	networking.EnvoyFilter_LISTENER:            opSet("MERGE", "MERGE_AND_REPLACE_LIST", "ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST"),
	networking.EnvoyFilter_FILTER_CHAIN:        opSet("MERGE", "MERGE_AND_REPLACE_LIST", "ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST"),
	networking.EnvoyFilter_NETWORK_FILTER:      opSet("MERGE", "MERGE_AND_REPLACE_LIST", "ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST", "REPLACE"),
	networking.EnvoyFilter_LISTENER_FILTER:     opSet("ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST", "REPLACE"),
	networking.EnvoyFilter_HTTP_FILTER:         opSet("MERGE", "MERGE_AND_REPLACE_LIST", "ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST", "REPLACE"),
	networking.EnvoyFilter_ROUTE_CONFIGURATION: opSet("MERGE", "MERGE_AND_REPLACE_LIST"),
	networking.EnvoyFilter_VIRTUAL_HOST:        opSet("MERGE", "MERGE_AND_REPLACE_LIST", "ADD", "REMOVE", "REPLACE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST"),
	networking.EnvoyFilter_HTTP_ROUTE:          opSet("MERGE", "MERGE_AND_REPLACE_LIST", "ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST"),
	networking.EnvoyFilter_CLUSTER:             opSet("MERGE", "MERGE_AND_REPLACE_LIST", "ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST"),
	networking.EnvoyFilter_EXTENSION_CONFIG:    opSet("ADD"),
}

func opSet(names ...string) map[networking.EnvoyFilter_Patch_Operation]bool {
	out := map[networking.EnvoyFilter_Patch_Operation]bool{}
	for _, n := range names {
		out[networking.EnvoyFilter_Patch_Operation(networking.EnvoyFilter_Patch_Operation_value[n])] = true
	}
	return out
}

func isListenerClass(a networking.EnvoyFilter_ApplyTo) bool {
	switch a {
	case networking.EnvoyFilter_LISTENER, networking.EnvoyFilter_FILTER_CHAIN, networking.EnvoyFilter_NETWORK_FILTER,
		networking.EnvoyFilter_HTTP_FILTER, networking.EnvoyFilter_LISTENER_FILTER:
		return true
	}
	return false
}

func isRouteClass(a networking.EnvoyFilter_ApplyTo) bool {
	switch a {
	case networking.EnvoyFilter_ROUTE_CONFIGURATION, networking.EnvoyFilter_VIRTUAL_HOST, networking.EnvoyFilter_HTTP_ROUTE:
		return true
	}
	return false
}

func validateEnvoyFilterPatch(f string, cp *networking.EnvoyFilter_EnvoyConfigObjectPatch) *FieldError {
	if cp == nil {
		return fieldErr(f, "empty patch")
	}
	applyTo := cp.GetApplyTo()
	if applyTo == networking.EnvoyFilter_INVALID {
		return fieldErr(f+".applyTo", "applyTo is required")
	}
	if applyTo == networking.EnvoyFilter_BOOTSTRAP {
		return fieldErr(f+".applyTo", "BOOTSTRAP is not supported: the agent writes the bootstrap, discovery does not serve it")
	}
	p := cp.GetPatch()
	if p == nil {
		return fieldErr(f+".patch", "a patch is required")
	}
	op := p.GetOperation()
	if op == networking.EnvoyFilter_Patch_INVALID {
		return fieldErr(f+".patch.operation", "an operation is required")
	}
	if !envoyFilterOps[applyTo][op] {
		var ok []string
		for o := range envoyFilterOps[applyTo] {
			ok = append(ok, o.String())
		}
		slices.Sort(ok)
		return fieldErr(f+".patch.operation", "%s does not apply to %s (use %s)", op, applyTo, strings.Join(ok, ", "))
	}
	if p.GetFilterClass() != networking.EnvoyFilter_Patch_UNSPECIFIED &&
		(applyTo != networking.EnvoyFilter_HTTP_FILTER || op != networking.EnvoyFilter_Patch_ADD) {
		return fieldErr(f+".patch.filterClass", "filterClass places HTTP filters added with ADD; it does not apply to %s %s", applyTo, op)
	}
	if fe := validateEnvoyFilterMatch(f+".match", applyTo, cp.GetMatch()); fe != nil {
		return fe
	}
	if op == networking.EnvoyFilter_Patch_REMOVE {
		if len(p.GetValue().GetFields()) > 0 {
			return fieldErr(f+".patch.value", "REMOVE takes no value")
		}
		return nil
	}
	if p.GetValue() == nil {
		return fieldErr(f+".patch.value", "a value is required for %s", op)
	}
	v, err := envoytypes.Decode(applyTo, p.GetValue())
	if err != nil {
		return &FieldError{Field: f + ".patch.value", Err: err}
	}
	switch op {
	case networking.EnvoyFilter_Patch_MERGE, networking.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST:
		// A merge value is a fragment; the merged resource is validated when it is generated.
	default:
		// Anything else inserts the value as it is: it must be a valid object on its own.
		if err := envoytypes.Validate(v); err != nil {
			return &FieldError{Field: f + ".patch.value", Err: err}
		}
	}
	if applyTo == networking.EnvoyFilter_EXTENSION_CONFIG {
		if v.(interface{ GetName() string }).GetName() == "" {
			return fieldErr(f+".patch.value.name", "an extension config needs the name its filters discover it by")
		}
	}
	return nil
}

func validateEnvoyFilterMatch(f string, applyTo networking.EnvoyFilter_ApplyTo, m *networking.EnvoyFilter_EnvoyConfigObjectMatch) *FieldError {
	if m == nil {
		return nil
	}
	if m.GetWaypoint() != nil {
		return fieldErr(f+".waypoint", "not supported: wasmesh runs no waypoint proxies")
	}
	if v := m.GetProxy().GetProxyVersion(); v != "" {
		if _, err := regexp.Compile(v); err != nil {
			return fieldErr(f+".proxy.proxyVersion", "invalid regular expression: %v", err)
		}
	}
	if applyTo == networking.EnvoyFilter_EXTENSION_CONFIG && m.GetObjectTypes() != nil {
		return fieldErr(f, "an EXTENSION_CONFIG patch adds a resource by name; it takes no listener, route or cluster match")
	}
	if l := m.GetListener(); l != nil {
		if !isListenerClass(applyTo) {
			return fieldErr(f+".listener", "a listener match does not select %s objects", applyTo)
		}
		if l.GetPortName() != "" {
			return fieldErr(f+".listener.portName", "not supported (Istio does not implement it either): use portNumber")
		}
		if l.GetListenerFilter() != "" && applyTo != networking.EnvoyFilter_LISTENER_FILTER {
			return fieldErr(f+".listener.listenerFilter", "selects listener filters: use it with applyTo LISTENER_FILTER")
		}
		if fc := l.GetFilterChain(); fc != nil {
			if flt := fc.GetFilter(); flt != nil {
				if applyTo == networking.EnvoyFilter_LISTENER || applyTo == networking.EnvoyFilter_FILTER_CHAIN || applyTo == networking.EnvoyFilter_LISTENER_FILTER {
					return fieldErr(f+".listener.filterChain.filter", "a filter match has no effect with applyTo %s", applyTo)
				}
				if flt.GetName() == "" {
					return fieldErr(f+".listener.filterChain.filter.name", "a filter match needs the filter's name")
				}
				if sub := flt.GetSubFilter(); sub != nil {
					if applyTo != networking.EnvoyFilter_HTTP_FILTER {
						return fieldErr(f+".listener.filterChain.filter.subFilter", "a subFilter match selects HTTP filters: use it with applyTo HTTP_FILTER")
					}
					if flt.GetName() != "envoy.filters.network.http_connection_manager" && flt.GetName() != "envoy.http_connection_manager" {
						return fieldErr(f+".listener.filterChain.filter.name", "a subFilter match needs the filter envoy.filters.network.http_connection_manager")
					}
					if sub.GetName() == "" {
						return fieldErr(f+".listener.filterChain.filter.subFilter.name", "a subFilter match needs the HTTP filter's name")
					}
				}
			}
		}
	}
	if rc := m.GetRouteConfiguration(); rc != nil {
		if !isRouteClass(applyTo) {
			return fieldErr(f+".routeConfiguration", "a route configuration match does not select %s objects", applyTo)
		}
		if m.GetContext() != networking.EnvoyFilter_GATEWAY {
			if rc.GetPortName() != "" {
				return fieldErr(f+".routeConfiguration.portName", "selects gateway servers: it applies with context GATEWAY only")
			}
			if rc.GetGateway() != "" {
				return fieldErr(f+".routeConfiguration.gateway", "selects gateway servers: it applies with context GATEWAY only")
			}
		}
		if rc.GetVhost().GetRoute() != nil && applyTo != networking.EnvoyFilter_HTTP_ROUTE {
			return fieldErr(f+".routeConfiguration.vhost.route", "a route match selects routes: use it with applyTo HTTP_ROUTE")
		}
		if rc.GetVhost() != nil && applyTo == networking.EnvoyFilter_ROUTE_CONFIGURATION {
			return fieldErr(f+".routeConfiguration.vhost", "a virtual host match has no effect with applyTo ROUTE_CONFIGURATION")
		}
	}
	if c := m.GetCluster(); c != nil && applyTo != networking.EnvoyFilter_CLUSTER {
		return fieldErr(f+".cluster", "a cluster match does not select %s objects", applyTo)
	}
	return nil
}
