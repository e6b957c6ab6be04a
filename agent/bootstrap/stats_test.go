package bootstrap

import (
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
)

// extractTags applies stats_tags to a stat name as Envoy does: every rule is searched in
// the full name, its first capture group is cut from the name and its second (or first)
// is the value. (testenv/proxy/stats implements the whole of it, but nothing imports
// testenv.) Rules RE2 cannot compile (Istio's look-aheads) are skipped: they are anchored
// at ^listener, which no filter's metric name starts with.
func extractTags(t *testing.T, rules []StatsTag, name string) (string, map[string]string) {
	t.Helper()
	type span struct{ from, to int }
	var cut []span
	tags := map[string]string{}
	for _, r := range rules {
		re, err := regexp.Compile(r.Regex)
		if err != nil {
			require.True(t, strings.HasPrefix(r.Regex, "^listener"), "rule %s: %v", r.TagName, err)
			continue
		}
		m := re.FindStringSubmatchIndex(name)
		if m == nil || m[2] < 0 {
			continue
		}
		_, seen := tags[r.TagName]
		require.False(t, seen, "two rules extract %s", r.TagName)
		tags[r.TagName] = name[m[2]:m[3]]
		if len(m) >= 6 && m[4] >= 0 {
			tags[r.TagName] = name[m[4]:m[5]]
		}
		cut = append(cut, span{m[2], m[3]})
	}
	sort.Slice(cut, func(i, j int) bool { return cut[i].from < cut[j].from })
	var b strings.Builder
	at := 0
	for _, s := range cut {
		if s.from > at {
			b.WriteString(name[at:s.from])
		}
		at = max(at, s.to)
	}
	b.WriteString(name[at:])
	return b.String(), tags
}

// encode writes a name the way the filters do: tag=.=value;.; per tag, then the name,
// under Envoy's namespace for Wasm metrics.
func encode(name string, kv ...string) string {
	var b strings.Builder
	b.WriteString("wasmcustom.")
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteString(kv[i] + "=.=" + kv[i+1] + ";.;")
	}
	return b.String() + name
}

// TestFilterMetricNamesComeOutClean renders a pod's bootstrap and applies its stats_tags
// to every name the mesh's filters define (as their doc comments give them: filters/quota
// main.go, filters/telemetry tagname.go and registry.go): each comes out with its bare
// name and all of its tags as labels. A tag without a rule would stay in the name and
// reach Prometheus as metric___istio_requests_total___wasmesh_telemetry_overflow_total.
func TestFilterMetricNamesComeOutClean(t *testing.T) {
	out, err := renderCase(t, filepath.Join("testdata", "default"))
	require.NoError(t, err)
	b := &bootstrapv3.Bootstrap{}
	require.NoError(t, protojson.Unmarshal(out, b))
	var rules []StatsTag
	for _, st := range b.GetStatsConfig().GetStatsTags() {
		rules = append(rules, StatsTag{TagName: st.GetTagName(), Regex: st.GetRegex()})
	}

	// The telemetry filter's standard labels, in the order it writes them (labels.go).
	var standard []string
	for _, tag := range []string{"reporter", "source_workload", "source_workload_namespace", "source_principal",
		"source_app", "source_version", "source_canonical_service", "source_canonical_revision", "source_cluster",
		"destination_workload", "destination_workload_namespace", "destination_principal", "destination_app",
		"destination_version", "destination_service", "destination_service_name", "destination_service_namespace",
		"destination_canonical_service", "destination_canonical_revision", "destination_cluster", "request_protocol",
		"response_code", "grpc_response_status", "response_flags", "connection_security_policy"} {
		standard = append(standard, tag, "v_"+tag)
	}
	cases := []struct {
		name string
		kv   []string
	}{
		{"istio_requests_total", standard},
		{"istio_request_duration_milliseconds", standard},
		{"wasmesh_telemetry_overflow_total", []string{"metric", "istio_requests_total"}},
		{"wasmesh_telemetry_overflow_total", []string{"metric", "istio_custom_bytes"}},
		{"wasmesh_quota_requests_total", []string{"descriptor", "per_user", "decision", "shadow_denied"}},
		{"wasmesh_quota_fail_open_total", []string{"descriptor", "per_user", "reason", "cas_exhausted"}},
		{"wasmesh_quota_fail_open_total", []string{"descriptor", "per_user", "reason", "store_error"}},
	}
	for _, c := range cases {
		encoded := encode(c.name, c.kv...)
		name, tags := extractTags(t, rules, encoded)
		assert.Equal(t, "wasmcustom."+c.name, name, "the name left of %s", encoded)
		want := map[string]string{}
		for i := 0; i+1 < len(c.kv); i += 2 {
			want[c.kv[i]] = c.kv[i+1]
		}
		assert.Equal(t, want, tags, "the labels of %s", encoded)
	}
}
