package inject

import (
	"encoding/json"
	"fmt"
	"strconv"

	"istio.io/api/annotation"
)

// PrometheusEnv holds the application's own prometheus.io annotations for the agent, which
// scrapes the application and merges its page into 15020's (agent/sidecar appMetrics).
const PrometheusEnv = "ISTIO_PROMETHEUS_ANNOTATIONS"

// The ports the agent and proxy hold, which an application's metrics cannot be on.
var reservedPorts = map[int]string{15000: "proxy admin", 15001: "outbound capture", 15006: "inbound capture",
	15020: "agent status", 15021: "proxy readiness", 15090: "proxy Prometheus"}

// mergeMetrics points the pod's prometheus.io annotations at the agent's merged page
// (:<status port>/stats/prometheus) and hands the application's own to the agent, as
// Istio's metrics merging does: on unless the mesh config (enablePrometheusMerge) or the
// pod (prometheus.istio.io/merge-metrics) turns it off, or the pod says
// prometheus.io/scrape: "false". It returns the PrometheusEnv value ("" for none).
func (p *plan) mergeMetrics(annotations map[string]string) (string, error) {
	merge := true
	if v := p.mesh.GetEnablePrometheusMerge(); v != nil {
		merge = v.GetValue()
	}
	if v, ok := annotations[annotation.PrometheusMergeMetrics.Name]; ok {
		merge, _ = strconv.ParseBool(v) // checked
	}
	if !merge || p.statusPort == 0 || annotations["prometheus.io/scrape"] == "false" {
		return "", nil
	}
	target := strconv.Itoa(int(p.statusPort))
	if annotations["prometheus.io/port"] == target {
		return "", nil // already the agent's
	}
	app := map[string]string{}
	for _, k := range []string{"scrape", "port", "path"} {
		if v, ok := annotations["prometheus.io/"+k]; ok {
			app[k] = v
		}
	}
	if port, ok := app["port"]; ok {
		n, err := strconv.Atoi(port)
		switch {
		case err != nil || n < 1 || n > 65535:
			return "", annotationError("prometheus.io/port", port, fmt.Errorf("not a port"))
		case n == int(p.statusPort):
			return "", annotationError("prometheus.io/port", port, fmt.Errorf("the agent's status port serves the merged metrics"))
		case reservedPorts[n] != "":
			return "", annotationError("prometheus.io/port", port, fmt.Errorf("reserved for the sidecar (%s)", reservedPorts[n]))
		}
	}
	if s, ok := app["scrape"]; ok {
		if _, err := strconv.ParseBool(s); err != nil {
			return "", annotationError("prometheus.io/scrape", s, fmt.Errorf("want true or false"))
		}
	}
	annotations["prometheus.io/port"] = target
	annotations["prometheus.io/path"] = "/stats/prometheus"
	annotations["prometheus.io/scrape"] = "true"
	if len(app) == 0 {
		return "", nil
	}
	b, err := json.Marshal(app) // keys sorted
	if err != nil {
		return "", err
	}
	return string(b), nil
}
