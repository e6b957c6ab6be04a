// Package telemetryapi turns the metrics section of Istio Telemetry resources into
// configuration for wasmesh's telemetry filter: for each proxy, the Telemetry of the root
// namespace, of the proxy's namespace and the one selecting the workload are merged, most
// specific last (Istio's order), into metric overrides per direction (CLIENT outbound, SERVER
// inbound), which are appended to the "metrics" list of the filter's plugin configuration, so
// they apply after (and win over) the filter's own settings.
//
// Istio's stats filter is built into its proxy; wasmesh's is a Wasm module attached by a
// WasmPlugin or an EnvoyFilter, found by its module's file name (telemetry.wasm). The
// Telemetry-derived overrides are merged into that filter's configuration wherever it is:
// the ECDS resource of a WasmPlugin, or the inline Wasm config an EnvoyFilter inserts.
package telemetryapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	meshconfig "istio.io/api/mesh/v1alpha1"
	telemetry "istio.io/api/telemetry/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// Metric is one entry of the telemetry filter's "metrics" list (statsplan.MetricConfig in filters/telemetry/statsplan).
type Metric struct {
	Name         string            `json:"name,omitempty"`
	Dimensions   map[string]string `json:"dimensions,omitempty"`
	TagsToRemove []string          `json:"tags_to_remove,omitempty"`
	Drop         bool              `json:"drop,omitempty"`
	// source is the Telemetry that set the entry last, for problem reports.
	source config.Key
}

// Overlay is the Telemetry configuration of one proxy's telemetry filter.
type Overlay struct {
	// Sources are the Telemetry resources in effect, least specific first.
	Sources []config.Key
	client  []Metric
	server  []Metric
	keys    [2]string
}

// The metrics Istio's Telemetry API names and the names the telemetry filter reports them
// under. The filter reports HTTP metrics only: the TCP and gRPC message metrics have no
// counterpart, so overrides of them change nothing (as for a workload without such traffic).
var istioMetrics = map[telemetry.MetricSelector_IstioMetric]string{
	telemetry.MetricSelector_REQUEST_COUNT:          "requests_total",
	telemetry.MetricSelector_REQUEST_DURATION:       "request_duration_milliseconds",
	telemetry.MetricSelector_REQUEST_SIZE:           "request_bytes",
	telemetry.MetricSelector_RESPONSE_SIZE:          "response_bytes",
	telemetry.MetricSelector_TCP_OPENED_CONNECTIONS: "",
	telemetry.MetricSelector_TCP_CLOSED_CONNECTIONS: "",
	telemetry.MetricSelector_TCP_SENT_BYTES:         "",
	telemetry.MetricSelector_TCP_RECEIVED_BYTES:     "",
	telemetry.MetricSelector_GRPC_REQUEST_MESSAGES:  "",
	telemetry.MetricSelector_GRPC_RESPONSE_MESSAGES: "",
}

// standardMetrics are the metrics the filter always knows.
var standardMetrics = []string{"requests_total", "request_duration_milliseconds", "request_bytes", "response_bytes"}

// standardTags are the labels the filter reports by default (statsplan.StandardLabelNames in filters/telemetry/statsplan).
var standardTags = []string{
	"reporter", "source_workload", "source_workload_namespace", "source_principal", "source_app", "source_version",
	"source_canonical_service", "source_canonical_revision", "source_cluster", "destination_workload",
	"destination_workload_namespace", "destination_principal", "destination_app", "destination_version",
	"destination_service", "destination_service_name", "destination_service_namespace", "destination_canonical_service",
	"destination_canonical_revision", "destination_cluster", "request_protocol", "response_code", "grpc_response_status",
	"response_flags", "connection_security_policy",
}

// Select returns the Telemetry resources that apply to a proxy, least specific first: the
// root namespace's namespace-wide one, the proxy namespace's, and the first of the proxy
// namespace's with a selector matching its labels. Where a level has several, the first by
// name is used (configs carry no creation time, Istio's first criterion).
func Select(ix *config.Index, rootNS, ns string, labels map[string]string) []*config.Config {
	var out []*config.Config
	wide := func(n string) *config.Config {
		for _, c := range ix.Namespace(config.Telemetry, n) {
			if len(c.Spec.(*telemetry.Telemetry).GetSelector().GetMatchLabels()) == 0 {
				return c
			}
		}
		return nil
	}
	if c := wide(rootNS); c != nil {
		out = append(out, c)
	}
	if ns != rootNS {
		if c := wide(ns); c != nil {
			out = append(out, c)
		}
	}
	for _, c := range ix.Namespace(config.Telemetry, ns) {
		sel := c.Spec.(*telemetry.Telemetry).GetSelector().GetMatchLabels()
		if len(sel) > 0 && config.SelectorMatches(sel, labels) {
			out = append(out, c)
			break
		}
	}
	return out
}

// isFilterProvider reports whether a Telemetry provider name means the telemetry filter:
// a Prometheus provider of the mesh config, or Istio's predefined "prometheus".
func isFilterProvider(mesh *meshconfig.MeshConfig, name string) bool {
	for _, p := range mesh.GetExtensionProviders() {
		if strings.EqualFold(p.GetName(), name) {
			_, ok := p.GetProvider().(*meshconfig.MeshConfig_ExtensionProvider_Prometheus)
			return ok
		}
	}
	return strings.EqualFold(name, "prometheus")
}

type metricState struct {
	disabled *bool
	tags     map[string]*telemetry.MetricsOverrides_TagOverride
	source   config.Key
}

// Build merges the selected Telemetry resources (Select's order) into the overlay, following
// Istio's merge: a Metrics entry without providers inherits its predecessor's (the mesh's
// default providers first); overrides apply in order, later fields winning, per mode and
// metric. When no provider in scope is the telemetry filter, every metric is dropped, as
// Istio then configures no stats filter. Nil when no Telemetry applies.
func Build(mesh *meshconfig.MeshConfig, selected []*config.Config) *Overlay {
	if len(selected) == 0 {
		return nil
	}
	o := &Overlay{}
	defaults := mesh.GetDefaultProviders().GetMetrics()
	if len(defaults) == 0 {
		defaults = []string{"prometheus"}
	}
	type entry struct {
		m   *telemetry.Metrics
		src config.Key
	}
	var entries []entry
	for _, c := range selected {
		o.Sources = append(o.Sources, c.Key())
		for _, m := range c.Spec.(*telemetry.Telemetry).GetMetrics() {
			entries = append(entries, entry{m, c.Key()})
		}
	}
	names := func(m *telemetry.Metrics) []string {
		var out []string
		for _, p := range m.GetProviders() {
			out = append(out, p.GetName())
		}
		return out
	}
	inScope := defaults
	for _, e := range entries {
		if n := names(e.m); len(n) > 0 {
			inScope = n
		}
	}
	enabled := slices.ContainsFunc(inScope, func(n string) bool { return isFilterProvider(mesh, n) })

	// mode (0 client, 1 server) → metric name (Istio enum name or custom) → state
	state := [2]map[string]*metricState{{}, {}}
	parent := defaults
	for _, e := range entries {
		provs := names(e.m)
		if len(provs) == 0 {
			provs = parent
		}
		parent = provs
		if !slices.ContainsFunc(provs, func(n string) bool { return isFilterProvider(mesh, n) && slices.Contains(inScope, n) }) {
			continue
		}
		for _, ov := range e.m.GetOverrides() {
			for _, mode := range modes(ov.GetMatch().GetMode()) {
				for _, metric := range matches(ov.GetMatch()) {
					st := state[mode][metric]
					if st == nil {
						st = &metricState{tags: map[string]*telemetry.MetricsOverrides_TagOverride{}}
						state[mode][metric] = st
					}
					if ov.GetDisabled() != nil {
						v := ov.GetDisabled().GetValue()
						st.disabled = &v
					}
					for k, v := range ov.GetTagOverrides() {
						st.tags[k] = v
					}
					st.source = e.src
				}
			}
		}
	}
	for mode := range 2 {
		var out []Metric
		if !enabled {
			out = []Metric{{Drop: true, source: o.Sources[len(o.Sources)-1]}}
		} else {
			out = render(state[mode])
		}
		if mode == 0 {
			o.client = out
		} else {
			o.server = out
		}
		b, _ := json.Marshal(out)
		o.keys[mode] = string(b)
	}
	return o
}

func modes(m telemetry.WorkloadMode) []int {
	switch m {
	case telemetry.WorkloadMode_CLIENT:
		return []int{0}
	case telemetry.WorkloadMode_SERVER:
		return []int{1}
	}
	return []int{0, 1}
}

// matches normalizes a selector to metric keys: Istio enum names, or a custom metric's name
// prefixed with "custom:".
func matches(s *telemetry.MetricSelector) []string {
	switch m := s.GetMetricMatch().(type) {
	case *telemetry.MetricSelector_CustomMetric:
		return []string{"custom:" + m.CustomMetric}
	case *telemetry.MetricSelector_Metric:
		if m.Metric != telemetry.MetricSelector_ALL_METRICS {
			return []string{m.Metric.String()}
		}
	}
	var all []string
	for k := range istioMetrics {
		all = append(all, k.String())
	}
	sort.Strings(all)
	return all
}

func render(state map[string]*metricState) []Metric {
	var out []Metric
	for key, st := range state {
		name, ok := strings.CutPrefix(key, "custom:")
		if !ok {
			name = istioMetrics[telemetry.MetricSelector_IstioMetric(telemetry.MetricSelector_IstioMetric_value[key])]
			if name == "" {
				continue // a metric the filter does not report
			}
		}
		m := Metric{Name: name, Drop: st.disabled != nil && *st.disabled, source: st.source}
		for tag, to := range st.tags {
			if to.GetOperation() == telemetry.MetricsOverrides_TagOverride_REMOVE {
				m.TagsToRemove = append(m.TagsToRemove, tag)
				continue
			}
			if m.Dimensions == nil {
				m.Dimensions = map[string]string{}
			}
			m.Dimensions[tag] = to.GetValue()
		}
		sort.Strings(m.TagsToRemove)
		if !m.Drop && len(m.Dimensions) == 0 && len(m.TagsToRemove) == 0 {
			continue // disabled: false alone changes nothing
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Split reports whether the configuration differs between the directions, so the filter
// needs a configuration per direction.
func (o *Overlay) Split() bool { return o != nil && o.keys[0] != o.keys[1] }

// Key identifies the overlay of a direction; "" when there is none.
func (o *Overlay) Key(inbound bool) string {
	if o == nil {
		return ""
	}
	if inbound {
		return o.keys[1]
	}
	return o.keys[0]
}

// Problem is an override that could not be applied to a filter configuration.
type Problem struct {
	Source config.Key
	Err    error
}

// Apply appends the overlay's metric entries for a direction to a telemetry filter
// configuration (JSON; "" is the empty configuration) and returns the result. An override
// of a custom metric the configuration does not define, or of a tag nothing reports, would
// make the filter refuse its configuration: the first is left out and reported, the second
// left out (removing an absent tag changes nothing, as in Istio).
func (o *Overlay) Apply(cfg string, inbound bool) (string, []Problem, error) {
	if o == nil {
		return cfg, nil, nil
	}
	entries := o.client
	if inbound {
		entries = o.server
	}
	doc := map[string]any{}
	if strings.TrimSpace(cfg) != "" {
		dec := json.NewDecoder(strings.NewReader(cfg))
		dec.UseNumber()
		if err := dec.Decode(&doc); err != nil {
			return "", nil, fmt.Errorf("telemetry filter configuration is not a JSON object: %w", err)
		}
	}
	existing, _ := doc["metrics"].([]any)
	known := map[string]bool{}
	for _, m := range standardMetrics {
		known[m] = true
	}
	defs, _ := doc["definitions"].([]any)
	for _, d := range defs {
		if dm, ok := d.(map[string]any); ok {
			if n, ok := dm["name"].(string); ok {
				known[n] = true
			}
		}
	}
	tags := map[string]bool{}
	for _, t := range standardTags {
		tags[t] = true
	}
	addDims := func(m map[string]any) {
		if dims, ok := m["dimensions"].(map[string]any); ok {
			for t := range dims {
				tags[t] = true
			}
		}
	}
	for _, e := range existing {
		if em, ok := e.(map[string]any); ok {
			addDims(em)
		}
	}
	for _, e := range entries {
		for t := range e.Dimensions {
			tags[t] = true
		}
	}
	var problems []Problem
	for _, e := range entries {
		if e.Name != "" && !known[e.Name] {
			problems = append(problems, Problem{Source: e.source,
				Err: fmt.Errorf("custom metric %q is not defined in the telemetry filter's configuration (definitions)", e.Name)})
			continue
		}
		e.TagsToRemove = slices.DeleteFunc(slices.Clone(e.TagsToRemove), func(t string) bool { return !tags[t] })
		if !e.Drop && len(e.Dimensions) == 0 && len(e.TagsToRemove) == 0 {
			continue
		}
		existing = append(existing, e)
	}
	if len(existing) > 0 {
		doc["metrics"] = existing
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // expressions use < > &
	if err := enc.Encode(doc); err != nil {
		return "", nil, err
	}
	return strings.TrimSuffix(b.String(), "\n"), problems, nil
}
