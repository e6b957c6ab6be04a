package stats

import (
	"strings"
	"testing"

	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTagExtraction(t *testing.T) {
	tags, err := NewTagExtractor(&metricsv3.StatsConfig{StatsTags: []*metricsv3.TagSpecifier{
		{TagName: "reporter", TagValue: &metricsv3.TagSpecifier_Regex{Regex: `(reporter=\.=(.*?);\.;)`}},
		{TagName: "source_workload", TagValue: &metricsv3.TagSpecifier_Regex{Regex: `(source_workload=\.=(.*?);\.;)`}},
	}})
	require.NoError(t, err)
	for _, tc := range []struct {
		name, extracted string
		tags            []Tag
	}{
		{"reporter=.=source;.;source_workload=.=web;.;istio_requests_total", "istio_requests_total",
			[]Tag{{"reporter", "source"}, {"source_workload", "web"}}},
		{"cluster.up.upstream_rq_200", "cluster.upstream_rq",
			[]Tag{{"envoy.response_code", "200"}, {"envoy.cluster_name", "up"}}},
		{"http.inbound.downstream_rq_2xx", "http.downstream_rq_xx", // as Envoy: only the class digit is removed
			[]Tag{{"envoy.response_code_class", "2"}, {"envoy.http_conn_manager_prefix", "inbound"}}},
		{"listener.127.0.0.1_8080.downstream_cx_active", "listener.downstream_cx_active",
			[]Tag{{"envoy.listener_address", "127.0.0.1_8080"}}},
	} {
		got, gotTags := tags.Extract(tc.name)
		assert.Equal(t, tc.extracted, got, tc.name)
		assert.ElementsMatch(t, tc.tags, gotTags, tc.name)
	}
}

func TestPrometheusAndMatcher(t *testing.T) {
	m, err := NewMatcher(&metricsv3.StatsMatcher{StatsMatcher: &metricsv3.StatsMatcher_InclusionList{
		InclusionList: &matcherv3.ListStringMatcher{Patterns: []*matcherv3.StringMatcher{
			{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "cluster."}},
			// Istio's prefix for Wasm stats: they live in the wasmcustom namespace.
			{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "wasm"}}}}}})
	require.NoError(t, err)
	s := NewStore(nil, m)
	s.Counter("cluster.up.upstream_rq_total").Add(3)
	s.Counter("server.excluded").Inc()
	s.Histogram("cluster.up.upstream_rq_time").Record(7)
	s.AddExternal(func() []ExternalStat {
		return []ExternalStat{{Name: "reporter=.=source;.;istio_requests_total", Kind: KindCounter, Value: 2},
			{Name: "descriptor=.=d;.;wasmesh_quota_requests_total", Kind: KindCounter, Value: 1}}
	})
	var b strings.Builder
	require.NoError(t, s.WritePrometheus(&b, Query{}))
	out := b.String()
	assert.Contains(t, out, "# TYPE envoy_cluster_upstream_rq_total counter\nenvoy_cluster_upstream_rq_total{envoy_cluster_name=\"up\"} 3\n")
	assert.Contains(t, out, `envoy_cluster_upstream_rq_time_bucket{envoy_cluster_name="up",le="5"} 0`)
	assert.Contains(t, out, `envoy_cluster_upstream_rq_time_bucket{envoy_cluster_name="up",le="10"} 1`)
	assert.Contains(t, out, `envoy_cluster_upstream_rq_time_count{envoy_cluster_name="up"} 1`)
	assert.Contains(t, out, "\nreporter___source___istio_requests_total 2", "without a stats tag the encoded name stays in the metric name, with no prefix")
	assert.Contains(t, out, "\ndescriptor___d___wasmesh_quota_requests_total 1", "any Wasm stat passes the wasm inclusion prefix")
	assert.NotContains(t, out, "server_excluded", "the inclusion list drops other stats")
}

// Istio's bootstrap has tag regexes with ECMAScript look-aheads (Envoy runs them on
// std::regex); they must compile and extract as in Envoy.
func TestTagRegexWithLookAhead(t *testing.T) {
	tags, err := NewTagExtractor(&metricsv3.StatsConfig{StatsTags: []*metricsv3.TagSpecifier{
		{TagName: "http_conn_manager_listener_prefix", TagValue: &metricsv3.TagSpecifier_Regex{
			Regex: `^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`}},
		{TagName: "ünï", TagValue: &metricsv3.TagSpecifier_Regex{Regex: `(?<=x)(ü=(.*?);)`}},
	}})
	require.NoError(t, err)
	got, gotTags := tags.Extract("listener.10.0.0.1_80.http.10.0.0.1_80.downstream_rq_total")
	assert.Equal(t, "listener.http.downstream_rq_total", got) // and envoy.listener_address
	assert.Contains(t, gotTags, Tag{"http_conn_manager_listener_prefix", "10.0.0.1_80"})

	// Offsets are bytes even where the name has multi-byte runes before the match.
	got, gotTags = tags.Extract("ñxü=vé;rest")
	assert.Equal(t, "ñxrest", got)
	assert.Contains(t, gotTags, Tag{"ünï", "vé"})

	_, err = NewTagExtractor(&metricsv3.StatsConfig{StatsTags: []*metricsv3.TagSpecifier{
		{TagName: "bad", TagValue: &metricsv3.TagSpecifier_Regex{Regex: `(?=(unclosed`}}}})
	assert.ErrorContains(t, err, "stats_tags[0] (bad)")
}
