package proxyconfig

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testdata/config_dump.json and clusters.json are a meshproxy's admin pages (the ratings
// pod of `make run`'s bookinfo: a telemetry WasmPlugin over ECDS, mutual TLS, subsets),
// captured with curl.
func captured(t *testing.T) *Dump {
	t.Helper()
	b, err := os.ReadFile("testdata/config_dump.json")
	require.NoError(t, err)
	d, err := ParseDump(b)
	require.NoError(t, err)
	return d
}

// row says whether a line of a table holds the cells, in order, separated by padding.
func row(table string, cells ...string) bool {
	for i, c := range cells {
		cells[i] = regexp.QuoteMeta(c)
	}
	return regexp.MustCompile(`(?m)^\s*` + strings.Join(cells, `\s+`) + `\s*$`).MatchString(table)
}

func TestClusterTable(t *testing.T) {
	d := captured(t)
	cs, err := d.Clusters(ClusterFilter{})
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, WriteClusters(&b, cs))
	out := b.String()
	assert.True(t, row(out, "SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE"), out)
	assert.True(t, row(out, "reviews.default.svc.cluster.local", "9080", "v2", "outbound", "EDS", "reviews.default"), out)
	assert.True(t, row(out, "ratings.default.svc.cluster.local", "9080", "-", "outbound", "EDS"), out)
	assert.True(t, row(out, "8080", "-", "inbound", "STATIC"), out)
	assert.True(t, row(out, "PassthroughCluster", "-", "-", "-", "ORIGINAL_DST"), out)
	// istioctl's order: by FQDN, then subset, port, direction.
	assert.Less(t, strings.Index(out, "|v1|"), strings.Index(out, "|v2|")+1)
	assert.Less(t, strings.Index(out, "productpage.default"), strings.Index(out, "reviews.default"))

	cs, err = d.Clusters(ClusterFilter{FQDN: "reviews", Subset: "v1", Direction: "outbound", Port: 9080})
	require.NoError(t, err)
	require.Len(t, cs, 1)
	assert.Equal(t, "outbound|9080|v1|reviews.default.svc.cluster.local", cs[0].GetName())
	cs, err = d.Clusters(ClusterFilter{Port: 9081})
	require.NoError(t, err)
	assert.Empty(t, cs)
	assert.EqualError(t, ClusterFilter{Direction: "sideways"}.Validate(), `--direction "sideways": want inbound or outbound`)
}

func TestListenerAndRouteTables(t *testing.T) {
	d := captured(t)
	ls, err := d.Listeners(ListenerFilter{})
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, WriteListeners(&b, ls))
	out := b.String()
	assert.True(t, row(out, "ADDRESSES", "PORT", "MATCH", "DESTINATION"), out)
	assert.True(t, row(out, "127.172.0.3", "9080", "ALL", "Route: 9080"), out)
	assert.True(t, row(out, "127.72.0.3", "8080", "Trans: raw_buffer", "Cluster: inbound|8080||"), out)
	assert.True(t, row(out, "127.72.0.3", "15090", "ALL", "Inline Route: /stats/prometheus*"), out)
	// By port: the inbound 8080 listener's chains before the outbound 9080.
	assert.Less(t, strings.Index(out, " 8080 "), strings.Index(out, " 9080 "))
	only, err := d.Listeners(ListenerFilter{Port: 9080})
	require.NoError(t, err)
	require.Len(t, only, 1)
	only, err = d.Listeners(ListenerFilter{Address: "127.72.0.3", Type: "http"})
	require.NoError(t, err)
	var names []string
	for _, l := range only {
		names = append(names, l.GetName())
	}
	assert.Equal(t, []string{"127.72.0.3_8080", "readiness", "prometheus"}, names, "by port; the static 15021 and 15090 are HTTP too")
	only, err = d.Listeners(ListenerFilter{Address: "127.72.0.3", Type: "TCP"})
	require.NoError(t, err)
	assert.Empty(t, only)

	rs, err := d.Routes("")
	require.NoError(t, err)
	b.Reset()
	require.NoError(t, WriteRoutes(&b, rs))
	out = b.String()
	assert.True(t, row(out, "NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"), out)
	assert.True(t, row(out, "9080", "reviews.default.svc.cluster.local:9080", "reviews, reviews.default", "/*", "reviews.default"), out)
	assert.True(t, row(out, "inbound|8080||", "inbound|http|8080", "*", "/*"), out)
	assert.Less(t, strings.Index(out, "\n9080 "), strings.Index(out, "\ninbound|8080||"), "numeric names first")
}

func TestRouteDomains(t *testing.T) {
	assert.Equal(t, "reviews, reviews.default", routeDomains([]string{"reviews.default.svc.cluster.local",
		"reviews.default.svc.cluster.local:9080", "reviews", "reviews:9080", "reviews.default.svc", "reviews.default"}))
	assert.Equal(t, "a, b + 1 more...", routeDomains([]string{"a", "b", "c"}))
	assert.Equal(t, "*", routeDomains([]string{"*"}))
}

func TestEndpointTable(t *testing.T) {
	b, err := os.ReadFile("testdata/clusters.json")
	require.NoError(t, err)
	c, err := ParseClusters(b)
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, WriteEndpoints(&out, Endpoints(c, EndpointFilter{})))
	assert.True(t, row(out.String(), "ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"), out.String())
	assert.True(t, row(out.String(), "127.72.0.4:8080", "HEALTHY", "OK", "outbound|9080|v1|reviews.default.svc.cluster.local"), out.String())
	assert.True(t, row(out.String(), "127.72.0.2:8080", "HEALTHY", "OK", "outbound|9080|v2|reviews.default.svc.cluster.local"), out.String())
	only := Endpoints(c, EndpointFilter{Cluster: "outbound|9080|v2|reviews.default.svc.cluster.local"})
	require.Len(t, only, 1)
	assert.Equal(t, "127.72.0.2:8080", only[0].Address)
	only = Endpoints(c, EndpointFilter{Address: "127.72.0.4", Port: 8080, Status: "healthy"})
	require.Len(t, only, 2)
	assert.Equal(t, "outbound|9080|v1|reviews.default.svc.cluster.local", only[0].Cluster)
	assert.Empty(t, Endpoints(c, EndpointFilter{Address: "127.72.0.4", Status: "UNHEALTHY"}))
}

func TestSecretTable(t *testing.T) {
	d := captured(t)
	secrets, err := d.Secrets(time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, WriteSecrets(&b, secrets))
	out := b.String()
	assert.True(t, row(out, "RESOURCE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE"), out)
	assert.Regexp(t, `(?m)^default\s+Cert Chain\s+ACTIVE\s+true\s+[0-9a-f]{32}\s+2026-11-27T\S+Z\s+2026-11-26T\S+Z\s*$`, out)
	assert.Regexp(t, `(?m)^ROOTCA\s+CA\s+ACTIVE\s+true\s+`, out)

	// A day later the workload certificate has expired.
	secrets, err = d.Secrets(time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	for _, s := range secrets {
		assert.Equal(t, s.Name == "ROOTCA", s.Valid, s.Name)
	}
}

// The versions the proxy holds are what proxy-status compares with those acked.
func TestVersions(t *testing.T) {
	v := captured(t).Versions()
	for _, typ := range []string{"cds", "lds", "rds", "eds", "ecds"} {
		assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ/\d+$`, v[typ], typ)
	}
	assert.Equal(t, map[string]string{}, (&Dump{Raw: map[string]json.RawMessage{}}).Versions())

	// Of named resources, the version of the one updated last: a push that changed one
	// route configuration leaves the others at their older versions.
	d, err := ParseDump([]byte(`{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
	  "dynamic_route_configs": [
	    {"version_info": "v7", "last_updated": "2026-11-26T10:00:07Z", "route_config": {"@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration", "name": "a"}},
	    {"version_info": "v9", "last_updated": "2026-11-26T10:00:09Z", "route_config": {"@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration", "name": "b"}},
	    {"version_info": "v8", "last_updated": "2026-11-26T10:00:08Z", "route_config": {"@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration", "name": "c"}}]}]}`))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"rds": "v9"}, d.Versions())
}

// The names of the resources the proxy holds from xDS, what proxy-status compares with
// discovery's: dynamic ones only (not the bootstrap's static clusters and listeners).
func TestNames(t *testing.T) {
	n := captured(t).Names()
	assert.Contains(t, n["cds"], "outbound|9080|v1|reviews.default.svc.cluster.local")
	assert.NotContains(t, n["cds"], "xds-grpc")
	assert.Contains(t, n["eds"], "outbound|9080|v1|reviews.default.svc.cluster.local")
	assert.Contains(t, n["lds"], "127.72.0.3_8080")
	assert.Equal(t, []string{"9080"}, n["rds"])
	assert.Len(t, n["ecds"], 1)
	assert.Equal(t, map[string][]string{"cds": {}, "lds": {}, "rds": {}, "eds": {}, "ecds": {}}, (&Dump{Raw: map[string]json.RawMessage{}}).Names())
}

// A real Envoy's dump holds extensions and fields this build does not know: it still
// parses, the tables still list it, and -o json prints it as the proxy wrote it.
func TestUnknownExtensionsAndFields(t *testing.T) {
	b, err := os.ReadFile("testdata/config_dump.json")
	require.NoError(t, err)
	const unknown = "type.googleapis.com/vendor.filters.http.magic.v9.Magic"
	s := strings.ReplaceAll(string(b), "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors", unknown)
	s = strings.Replace(s, `"name": "inbound|8080||",`, `"name": "inbound|8080||", "a_field_of_envoy_2030": {"x": 1},`, 1)
	d, err := ParseDump([]byte(s))
	require.NoError(t, err)
	ls, err := d.Listeners(ListenerFilter{Port: 9080})
	require.NoError(t, err)
	require.Len(t, ls, 1)
	assert.Equal(t, "Route: 9080", destination(ls[0].GetFilterChains()[0].GetFilters()))
	cs, err := d.Clusters(ClusterFilter{Direction: "inbound"})
	require.NoError(t, err)
	require.Len(t, cs, 1)

	var out bytes.Buffer
	raw, err := d.RawResources("listeners", nil)
	require.NoError(t, WriteRaw(&out, "json", raw))
	require.NoError(t, err)
	assert.Contains(t, out.String(), unknown)
	out.Reset()
	raw, err = d.RawResources("clusters", ClusterFilter{Direction: "inbound"}.Keep)
	require.NoError(t, err)
	require.NoError(t, WriteRaw(&out, "yaml", raw))
	assert.Contains(t, out.String(), "a_field_of_envoy_2030:")

	_, err = ParseDump([]byte(`{"configs": "no"}`))
	assert.ErrorContains(t, err, "config_dump is not JSON")
	_, err = ParseDump([]byte(`{}`))
	assert.EqualError(t, err, `config_dump has no "configs" list`)
	_, err = (&Dump{Raw: map[string]json.RawMessage{}}).Clusters(ClusterFilter{})
	assert.EqualError(t, err, "the config dump has no clusters section")
}
