package bootstrap

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

// FuzzBootstrapParse reads random bootstrap documents, as YAML and as JSON, through Parse and
// Load (Envoy's -c): no panic; a rejection says which step refused it (and Load the file); an
// accepted bootstrap passes Envoy's validation and takes the overrides.
func FuzzBootstrapParse(f *testing.F) {
	f.Add([]byte(`
node: {id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", cluster: a.ns}
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 15000}}}
dynamic_resources:
  ads_config: {api_type: GRPC, transport_api_version: V3, grpc_services: [{envoy_grpc: {cluster_name: xds-grpc}}]}
  cds_config: {ads: {}, resource_api_version: V3}
  lds_config: {ads: {}, resource_api_version: V3}
static_resources:
  clusters:
  - name: xds-grpc
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: xds-grpc
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 15010}}}}]}]
`), true)
	f.Add([]byte(`{"node":{"id":"n"},"static_resources":{"listeners":[{"name":"l","address":{"socket_address":{"address":"127.0.0.1","port_value":0}},`+
		`"filter_chains":[{"filters":[{"name":"hcm","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",`+
		`"stat_prefix":"s","route_config":{},"http_filters":[{"name":"r","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}]}}`), false)
	f.Add([]byte("static_resources: {clusters: [{name: c, connect_timeout: -1s}]}"), true)
	f.Add([]byte(`{"node": {"unknown_field": 1}}`), false)
	f.Add([]byte("node: [\n"), true)
	f.Fuzz(func(t *testing.T, data []byte, yamlInput bool) {
		b, err := Parse(data, yamlInput)
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "yaml: ") && !strings.HasPrefix(msg, "decode: ") && !strings.HasPrefix(msg, "invalid: ") {
				t.Fatalf("the error does not say which step refused the bootstrap: %q", msg)
			}
		} else {
			if verr := b.ValidateAll(); verr != nil {
				t.Fatalf("accepted a bootstrap Envoy's validation refuses: %v", verr)
			}
			Apply(b, Overrides{ServiceNode: "node-x", ServiceCluster: "cluster-x"})
			if b.Node.Id != "node-x" || b.Node.Cluster != "cluster-x" || b.Node.UserAgentName != UserAgentName {
				t.Fatalf("overrides not applied: %v", b.Node)
			}
		}
		ext := ".json"
		if yamlInput {
			ext = ".yaml"
		}
		path := filepath.Join(t.TempDir(), "envoy"+ext)
		if werr := os.WriteFile(path, data, 0o644); werr != nil {
			t.Fatal(werr)
		}
		_, lerr := Load(path, Overrides{})
		if (lerr == nil) != (err == nil) {
			t.Fatalf("Load and Parse disagree: %v / %v", lerr, err)
		}
		if lerr != nil && !strings.HasPrefix(lerr.Error(), "bootstrap "+path+": ") {
			t.Fatalf("Load's error does not name the file: %q", lerr)
		}
	})
}
