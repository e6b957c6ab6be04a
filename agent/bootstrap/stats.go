package bootstrap

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	meshconfig "istio.io/api/mesh/v1alpha1"
)

// Pod annotations that shape the proxy's stats, Istio's names.
const (
	AnnotationExtraStatTags          = "sidecar.istio.io/extraStatTags"
	AnnotationStatsInclusionPrefixes = "sidecar.istio.io/statsInclusionPrefixes"
	AnnotationStatsInclusionSuffixes = "sidecar.istio.io/statsInclusionSuffixes"
	AnnotationStatsInclusionRegexps  = "sidecar.istio.io/statsInclusionRegexps"
)

// StatsTag is one entry of the bootstrap's stats_config.stats_tags.
type StatsTag struct {
	TagName string `json:"tag_name"`
	Regex   string `json:"regex"`
}

// envoyDefaultTags are Envoy's own tag rules that Istio's bootstrap keeps when it turns
// use_all_default_tags off (so Envoy's dotted names still get their labels).
// response_code also accepts the filter-encoded form, as Istio's template does.
var envoyDefaultTags = []StatsTag{
	{TagName: "cluster_name", Regex: `^cluster\.((.+?(\..+?\.svc\.cluster\.local)?)\.)`},
	{TagName: "tcp_prefix", Regex: `^tcp\.((.*?)\.)\w+?$`},
	{TagName: "response_code", Regex: `(response_code=\.=(.*?);\.;)|_rq(_(\d{3}))$`},
	{TagName: "response_code_class", Regex: `_rq(_(\dxx))$`},
	{TagName: "http_conn_manager_listener_prefix", Regex: `^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`},
	{TagName: "http_conn_manager_prefix", Regex: `^http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`},
	{TagName: "listener_address", Regex: `^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`},
	{TagName: "mongo_prefix", Regex: `^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$`},
}

// StandardTags are the tag names of Istio's standard metric labels (Istio's
// DefaultStatTags for telemetry v2). response_code is covered by the Envoy default rule
// above, which also extracts it from a filter-encoded name.
var StandardTags = []string{
	"reporter",
	"source_namespace",
	"source_workload",
	"source_workload_namespace",
	"source_principal",
	"source_app",
	"source_version",
	"source_cluster",
	"destination_namespace",
	"destination_workload",
	"destination_workload_namespace",
	"destination_principal",
	"destination_app",
	"destination_version",
	"destination_service",
	"destination_service_name",
	"destination_service_namespace",
	"destination_port",
	"destination_cluster",
	"request_protocol",
	"request_operation",
	"request_host",
	"response_flags",
	"grpc_response_status",
	"connection_security_policy",
	"permissive_response_code",
	"permissive_response_policyid",
	"source_canonical_service",
	"destination_canonical_service",
	"source_canonical_revision",
	"destination_canonical_revision",
}

// FilterTags are the tags the mesh's own filters encode in their metric names, extracted
// by default as Istio extracts those of its built-in filters. Envoy cannot extract a tag
// it has no rule for (a rule's tag_name is fixed, so there is no catch-all for
// name=.=value;.;), and a tag without one stays in the metric's name on the Prometheus
// page (metric___istio_requests_total___wasmesh_telemetry_overflow_total), so every tag
// a filter writes must be here: a filter that adds one adds it here too, and the e2e
// tests fail on any pod page whose names still hold a tag.
var FilterTags = []string{
	"descriptor", // filters/quota: wasmesh_quota_requests_total, wasmesh_quota_fail_open_total
	"decision",   // filters/quota: wasmesh_quota_requests_total
	"reason",     // filters/quota: wasmesh_quota_fail_open_total
	"metric",     // filters/telemetry: wasmesh_telemetry_overflow_total
}

// tagNamePattern is what a tag name may look like: it becomes a Prometheus label name
// and part of a regex, so anything else is refused rather than escaped.
var tagNamePattern = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// TagRule returns the stats_tags rule that extracts tag from a name encoded as
// tag=.=value;.; (the convention of the telemetry filter): the first group is cut from
// the name, the second is the label value.
func TagRule(tag string) StatsTag {
	return StatsTag{TagName: tag, Regex: `(` + tag + `=\.=(.*?);\.;)`}
}

// StatsTags returns the stats_tags of a pod's bootstrap: Envoy's default rules, Istio's
// standard labels, then one rule per extra tag from ProxyConfig extraStatTags and the
// sidecar.istio.io/extraStatTags annotation (comma-separated), without duplicates. A tag
// name that cannot be a label is an error naming where it came from.
func StatsTags(annotations map[string]string, pc *meshconfig.ProxyConfig) ([]StatsTag, error) {
	out := append([]StatsTag(nil), envoyDefaultTags...)
	seen := map[string]bool{}
	for _, t := range out {
		seen[t.TagName] = true
	}
	add := func(source, tag string) error {
		tag = strings.TrimSpace(tag)
		if tag == "" || seen[tag] {
			return nil
		}
		if !tagNamePattern.MatchString(tag) {
			return fmt.Errorf("%s: %q is not a valid tag name (want [a-zA-Z_][a-zA-Z0-9_]*)", source, tag)
		}
		seen[tag] = true
		out = append(out, TagRule(tag))
		return nil
	}
	for _, tag := range slices.Concat(StandardTags, FilterTags) {
		if err := add("standard tags", tag); err != nil {
			return nil, err
		}
	}
	for _, tag := range pc.GetExtraStatTags() {
		if err := add("ProxyConfig extraStatTags", tag); err != nil {
			return nil, err
		}
	}
	for _, tag := range strings.Split(annotations[AnnotationExtraStatTags], ",") {
		if err := add("annotation "+AnnotationExtraStatTags, tag); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Inclusion is the stats_matcher inclusion list of the bootstrap.
type Inclusion struct {
	Prefixes []string
	Suffixes []string
	Regexps  []string
}

// Patterns renders the list as Envoy StringMatcher objects.
func (in Inclusion) Patterns() []map[string]any {
	var out []map[string]any
	for _, p := range in.Prefixes {
		out = append(out, map[string]any{"prefix": p})
	}
	for _, s := range in.Suffixes {
		out = append(out, map[string]any{"suffix": s})
	}
	for _, r := range in.Regexps {
		out = append(out, map[string]any{"safe_regex": map[string]any{"regex": r}})
	}
	return out
}

// The stats the agent itself relies on are always included, as Istio does: readiness
// reads cluster_manager / listener_manager / server, draining reads downstream_cx_active,
// and the Wasm filters' metrics live under wasmcustom (matched by "wasm") with the
// reporter= tag first.
var (
	requiredPrefixes = []string{"reporter=", "cluster_manager", "listener_manager", "server", "cluster.xds-grpc", "wasm"}
	requiredSuffixes = []string{"rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied", "downstream_cx_active", "component", "istio"}
	requiredRegexps  = []string{`vhost\..*\.route\..*`}
)

// StatsInclusion returns the stats inclusion list: for each of prefixes, suffixes and
// regexps, the pod annotation when set, else ProxyConfig proxyStatsMatcher (Istio does not
// merge the two), plus the required entries. "{pod_ip}" in a pattern expands to each
// instance IP. An annotation regex that RE2 cannot compile is an error naming it.
func StatsInclusion(annotations map[string]string, pc *meshconfig.ProxyConfig, instanceIPs []string) (Inclusion, error) {
	m := pc.GetProxyStatsMatcher()
	pick := func(key string, fromConfig, required []string) []string {
		var vals []string
		if a := strings.TrimSpace(annotations[key]); a != "" {
			for _, v := range strings.Split(a, ",") {
				if v = strings.TrimSpace(v); v != "" {
					vals = append(vals, v)
				}
			}
		} else {
			vals = append(vals, fromConfig...)
		}
		vals = append(vals, required...)
		return dedupe(expandPodIP(vals, instanceIPs))
	}
	in := Inclusion{
		Prefixes: pick(AnnotationStatsInclusionPrefixes, m.GetInclusionPrefixes(), requiredPrefixes),
		Suffixes: pick(AnnotationStatsInclusionSuffixes, m.GetInclusionSuffixes(), requiredSuffixes),
		Regexps:  pick(AnnotationStatsInclusionRegexps, m.GetInclusionRegexps(), requiredRegexps),
	}
	for _, r := range in.Regexps {
		if _, err := regexp.Compile(r); err != nil {
			return Inclusion{}, fmt.Errorf("stats inclusion regexp %q (annotation %s or ProxyConfig proxyStatsMatcher): %w",
				r, AnnotationStatsInclusionRegexps, err)
		}
	}
	return in, nil
}

func expandPodIP(patterns, ips []string) []string {
	out := make([]string, 0, len(patterns))
	for _, p := range patterns {
		if !strings.Contains(p, "{pod_ip}") {
			out = append(out, p)
			continue
		}
		for _, ip := range ips {
			out = append(out, strings.ReplaceAll(p, "{pod_ip}", ip))
		}
	}
	return out
}

func dedupe(in []string) []string {
	seen := make(map[string]bool, len(in))
	out := in[:0]
	for _, v := range in {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
