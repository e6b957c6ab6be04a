package config

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	telemetry "istio.io/api/telemetry/v1alpha1"
)

// Telemetry is validated field by field, as EnvoyFilter is.

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
