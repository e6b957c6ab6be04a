package config

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	extensions "istio.io/api/extensions/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	telemetry "istio.io/api/telemetry/v1alpha1"
	typev1beta1 "istio.io/api/type/v1beta1"

	"github.com/wasmesh/wasmesh/controlplane/envoytypes"
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

var sha256Hex = regexp.MustCompile(`^[a-f0-9]{64}$`)

// cIdentifier is what Istio accepts as a VM environment variable name.
var cIdentifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validateWasmPluginSpec checks a WasmPlugin. Modules come from file:// (read by the proxy) or
// http(s):// with a sha256 (fetched and verified by discovery); OCI images need a registry
// client wasmesh does not have and are rejected.
func validateWasmPluginSpec(m proto.Message) *FieldError {
	wp := m.(*extensions.WasmPlugin)
	if wp.GetTargetRef() != nil {
		return fieldErr("targetRef", errTargetRefs)
	}
	if len(wp.GetTargetRefs()) > 0 {
		return fieldErr("targetRefs", errTargetRefs)
	}
	if s := wp.GetSelector(); s != nil {
		if fe := validateLabels("selector.matchLabels", s.GetMatchLabels()); fe != nil {
			return fe
		}
	}
	if wp.GetUrl() == "" {
		return fieldErr("url", "a module URL is required")
	}
	u, err := url.Parse(wp.GetUrl())
	if err != nil {
		return fieldErr("url", "%v", err)
	}
	if s := wp.GetSha256(); s != "" && !sha256Hex.MatchString(s) {
		return fieldErr("sha256", "%q is not 64 lowercase hex digits", s)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" || u.Path == "" {
			return fieldErr("url", "%q: a file URL is file:///absolute/path.wasm", wp.GetUrl())
		}
	case "http", "https":
		if u.Host == "" {
			return fieldErr("url", "%q has no host", wp.GetUrl())
		}
		if wp.GetSha256() == "" {
			return fieldErr("sha256", "required for %s modules: discovery fetches the module once and caches and verifies it by its digest", u.Scheme)
		}
	case "oci", "":
		return fieldErr("url", "%q: OCI images are not supported (no registry client); use file:// or http(s):// with sha256", wp.GetUrl())
	default:
		return fieldErr("url", "%q: scheme %q is not one of file, http, https", wp.GetUrl(), u.Scheme)
	}
	if wp.GetImagePullSecret() != "" {
		return fieldErr("imagePullSecret", "not supported: it authenticates OCI registry pulls, and wasmesh fetches modules over plain http(s)")
	}
	if wp.GetVerificationKey() != "" {
		return fieldErr("verificationKey", "not supported (Istio does not implement it either); use sha256")
	}
	if len(wp.GetPluginName()) > 256 {
		return fieldErr("pluginName", "longer than 256 characters")
	}
	if wp.GetType() == extensions.PluginType_NETWORK {
		return fieldErr("type", "NETWORK plugins are not supported: wasmesh's proxies run HTTP Wasm filters")
	}
	for i, e := range wp.GetVmConfig().GetEnv() {
		f := fmt.Sprintf("vmConfig.env[%d]", i)
		if !cIdentifier.MatchString(e.GetName()) {
			return fieldErr(f+".name", "%q is not a C identifier", e.GetName())
		}
		if e.GetValueFrom() == extensions.EnvValueSource_HOST && e.GetValue() != "" {
			return fieldErr(f+".value", "a HOST variable takes its value from the proxy's environment; value must be empty")
		}
	}
	for i, ts := range wp.GetMatch() {
		for j, p := range ts.GetPorts() {
			if fe := validatePortNumber(fmt.Sprintf("match[%d].ports[%d].number", i, j), p.GetNumber(), false); fe != nil {
				return fe
			}
		}
		if ts.GetMode() > typev1beta1.WorkloadMode_CLIENT_AND_SERVER {
			return fieldErr(fmt.Sprintf("match[%d].mode", i), "unknown mode %v", ts.GetMode())
		}
	}
	return nil
}

// Tag names in metric names must stay parseable by the proxy's stats_tags rules.
var tagName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validateTelemetrySpec checks a Telemetry. wasmesh's metrics come from the telemetry Wasm
// filter, so only the metrics section is translated; tracing and access logging are rejected.
func validateTelemetrySpec(m proto.Message) *FieldError {
	t := m.(*telemetry.Telemetry)
	if t.GetTargetRef() != nil {
		return fieldErr("targetRef", errTargetRefs)
	}
	if len(t.GetTargetRefs()) > 0 {
		return fieldErr("targetRefs", errTargetRefs)
	}
	if s := t.GetSelector(); s != nil {
		if fe := validateLabels("selector.matchLabels", s.GetMatchLabels()); fe != nil {
			return fe
		}
	}
	if len(t.GetTracing()) > 0 {
		return fieldErr("tracing", "not supported: wasmesh configures metrics only")
	}
	if len(t.GetAccessLogging()) > 0 {
		return fieldErr("accessLogging", "not supported: wasmesh configures metrics only")
	}
	for i, mt := range t.GetMetrics() {
		f := fmt.Sprintf("metrics[%d]", i)
		for j, p := range mt.GetProviders() {
			if p.GetName() == "" {
				return fieldErr(fmt.Sprintf("%s.providers[%d].name", f, j), "a provider name is required")
			}
		}
		if mt.GetReportingInterval() != nil {
			return fieldErr(f+".reportingInterval", "not supported: it sets the TCP metrics interval, and the telemetry filter reports HTTP metrics only")
		}
		for j, o := range mt.GetOverrides() {
			of := fmt.Sprintf("%s.overrides[%d]", f, j)
			if cm, ok := o.GetMatch().GetMetricMatch().(*telemetry.MetricSelector_CustomMetric); ok && !tagName.MatchString(cm.CustomMetric) {
				return fieldErr(of+".match.customMetric", "%q must be letters, digits and underscores", cm.CustomMetric)
			}
			if o.GetMatch().GetMode() > telemetry.WorkloadMode_SERVER {
				return fieldErr(of+".match.mode", "unknown mode %v", o.GetMatch().GetMode())
			}
			for _, name := range slices.Sorted(maps.Keys(o.GetTagOverrides())) {
				to := o.GetTagOverrides()[name]
				tf := fmt.Sprintf("%s.tagOverrides.%s", of, name)
				if !tagName.MatchString(name) {
					return fieldErr(tf, "tag name %q must be letters, digits and underscores", name)
				}
				switch to.GetOperation() {
				case telemetry.MetricsOverrides_TagOverride_UPSERT:
					if strings.TrimSpace(to.GetValue()) == "" {
						return fieldErr(tf+".value", "UPSERT needs a value expression")
					}
				case telemetry.MetricsOverrides_TagOverride_REMOVE:
					if to.GetValue() != "" {
						return fieldErr(tf+".value", "REMOVE takes no value")
					}
				default:
					return &FieldError{Field: tf + ".operation", Err: errors.New("unknown operation")}
				}
			}
		}
	}
	return nil
}
