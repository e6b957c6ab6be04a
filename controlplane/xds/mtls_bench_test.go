package xds_test

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// BenchmarkMTLSGeneration: what a proxy's whole config (CDS, EDS, LDS, RDS) costs to generate
// from a fresh snapshot, with the MTLS option off and on, in a mesh of 200 services in 10
// namespaces, each with 5 endpoints of sidecar workloads and a namespace PeerAuthentication;
// the proxy serves 4 ports. Compare the two sub-benchmarks' ns/op as a ratio.
func BenchmarkMTLSGeneration(b *testing.B) {
	var y strings.Builder
	for ns := range 10 {
		fmt.Fprintf(&y, "---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: default, namespace: ns%d}\nspec: {mtls: {mode: %s}}\n",
			ns, []string{"STRICT", "PERMISSIVE"}[ns%2])
		for s := range 20 {
			fmt.Fprintf(&y, "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: s%d, namespace: ns%d}\n"+
				"spec: {hosts: [s%d.ns%d.svc.cluster.local], location: MESH_INTERNAL, resolution: STATIC, ports: [{number: 80, name: http}, {number: 9000, name: tcp}], endpoints: [", s, ns, s, ns)
			for e := range 5 {
				fmt.Fprintf(&y, "{address: 10.%d.%d.%d, labels: {app: s%d, security.istio.io/tlsMode: istio}, serviceAccount: s%d},", ns, s, e+1, s, s)
			}
			y.WriteString("]}\n")
		}
	}
	y.WriteString("---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: self, namespace: ns0}\n" +
		"spec: {hosts: [self.ns0.svc.cluster.local], location: MESH_INTERNAL, resolution: STATIC, workloadSelector: {labels: {app: self}}, " +
		"ports: [{number: 8080, name: http-a}, {number: 8081, name: http-b}, {number: 9090, name: tcp-c}, {number: 9091, name: tcp-d}]}\n")
	var cs []*config.Config
	for _, d := range config.ParseFile("bench.yaml", []byte(y.String())) {
		if d.Err != nil {
			b.Fatal(d.Err)
		}
		cs = append(cs, d.Config)
	}
	reg := registry.NewServiceEntries(slog.New(slog.NewTextHandler(io.Discard, nil)), metrics.New(prometheus.NewRegistry()))
	reg.SetConfigs(cs)
	md, err := structpb.NewStruct(map[string]any{"NAME": "self-1", "NAMESPACE": "ns0", "LABELS": map[string]any{"app": "self"}, "INSTANCE_IPS": "10.99.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	p, err := model.ParseNode(&core.Node{Id: "sidecar~10.99.0.1~self-1.ns0~ns0.svc.cluster.local", Metadata: md})
	if err != nil {
		b.Fatal(err)
	}
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("mtls=%t", on), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s := push.Build("bench", mesh.Default(), config.NewIndex(cs), registry.NewAggregate(reg))
				s.Options.MTLS = on
				dump := xds.Dump(xds.NewView(xds.NewSnapshot(s), p))
				if len(dump[xds.ClusterType].Items) < 400 {
					b.Fatalf("%d clusters", len(dump[xds.ClusterType].Items))
				}
			}
		})
	}
}
