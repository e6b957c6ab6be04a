package discovery_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/envoytypes"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

const translateTraffic = `
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: backend-v1, namespace: demo}
spec: {address: 127.10.0.9, labels: {app: backend, version: v1}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: backend, namespace: demo}
spec:
  host: backend.demo.svc.cluster.local
  trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}}
  subsets: [{name: v1, labels: {version: v1}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: backend, namespace: demo}
spec:
  hosts: [backend.demo.svc.cluster.local]
  http:
  - match: [{uri: {prefix: /v1}}]
    route: [{destination: {host: backend.demo.svc.cluster.local, subset: v1}}]
    timeout: 3s
  - route: [{destination: {host: backend.demo.svc.cluster.local}}]
`

const translatePlugin = `
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: stats, namespace: demo}
spec:
  selector: {matchLabels: {app: frontend}}
  url: %s
  sha256: %s
`

// What Translate prints for a proxy is what a real discovery server sends that proxy over
// a real ADS stream, byte for byte, for CDS, EDS, LDS and RDS (the client follows EDS and
// RDS as Envoy does) and ECDS (asked by name on a plain ADS stream). The
// proxy's own workload (selected by a ServiceEntry) is among the endpoints both ways, and a
// WasmPlugin module fetched over HTTP is in the answer. Every resource passes Envoy's validation.
func TestTranslateEqualsWhatDiscoverySends(t *testing.T) {
	module := []byte("\x00asm\x01\x00\x00\x00")
	sum := sha256.Sum256(module)
	// A slow module server: the first snapshot is built before the module is had, so
	// Translate must wait for the push that follows the fetch.
	mods := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(300 * time.Millisecond)
		_, _ = w.Write(module)
	}))
	defer mods.Close()
	files := map[string]string{"services.yaml": services, "traffic.yaml": translateTraffic,
		"plugin.yaml": fmt.Sprintf(translatePlugin, mods.URL+"/stats.wasm", hex.EncodeToString(sum[:]))}
	cache := t.TempDir()
	e := start(t, files, func(o *discovery.Options) { o.MTLS = true; o.WasmCacheDir = cache })
	n := node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dump, err := discovery.Translate(ctx, discovery.Options{ConfigDir: e.dir, MTLS: true, WasmCacheDir: cache}, n,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	for typ, set := range dump {
		for _, r := range set.Items {
			require.NoError(t, envoytypes.Validate(r.Message), "%s %s", xds.ShortType(typ), r.Name)
		}
	}
	require.NotEmpty(t, dump[xds.ExtensionType].Items, "the WasmPlugin's extension config")
	assert.Contains(t, endpointAddrs(t, dump, frontendCluster), "127.10.0.1:8080", "the proxy's own workload")
	assert.Contains(t, endpointAddrs(t, dump, "outbound|9081|v1|backend.demo.svc.cluster.local"), "127.10.0.9:8081")

	c := e.connect(adsc.Config{Node: n, Delta: true})
	types := []string{xds.ClusterType, xds.EndpointType, xds.ListenerType, xds.RouteType}
	same := func(c *adsc.Client) bool {
		for _, typ := range types {
			if !slices.Equal(c.Names(typ), dump[typ].Names()) {
				return false
			}
			for _, r := range dump[typ].Items {
				if !bytes.Equal(c.Raw(typ, r.Name), r.Any.GetValue()) {
					return false
				}
			}
		}
		return true
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := c.Wait(wctx, same); err != nil {
		for _, typ := range types {
			assert.Equal(t, dump[typ].Names(), c.Names(typ), "%s names", xds.ShortType(typ))
			for _, r := range dump[typ].Items {
				assert.True(t, bytes.Equal(c.Raw(typ, r.Name), r.Any.GetValue()), "%s %s differs from what discovery sent", xds.ShortType(typ), r.Name)
			}
		}
		t.Fatalf("the ADS client never held what Translate gave: %v", err)
	}
	for _, typ := range types {
		assert.NotEmpty(t, dump[typ].Items, xds.ShortType(typ))
	}
	assertSameECDS(t, e, n, dump[xds.ExtensionType])
}

// assertSameECDS asks discovery for the extension configs over a plain SotW ADS stream (as
// the adsc client does not follow ECDS) and compares them with Translate's.
func assertSameECDS(t *testing.T, e *env, n *core.Node, want *xds.Resources) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := discoverypb.NewAggregatedDiscoveryServiceClient(e.cc).StreamAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&discoverypb.DiscoveryRequest{Node: n, TypeUrl: xds.ExtensionType, ResourceNames: want.Names()}))
	resp, err := stream.Recv()
	require.NoError(t, err)
	require.Equal(t, xds.ExtensionType, resp.GetTypeUrl())
	got := map[string][]byte{}
	for _, a := range resp.GetResources() {
		var ext core.TypedExtensionConfig
		require.NoError(t, a.UnmarshalTo(&ext))
		got[ext.GetName()] = a.GetValue()
	}
	require.Len(t, got, len(want.Items))
	for _, r := range want.Items {
		assert.True(t, bytes.Equal(got[r.Name], r.Any.GetValue()), "ecds %s differs from what discovery sent", r.Name)
	}
}

// endpointAddrs lists the addresses of a cluster's assignment in a translation.
func endpointAddrs(t *testing.T, dump map[string]*xds.Resources, cluster string) []string {
	t.Helper()
	r := dump[xds.EndpointType].Find(cluster)
	require.NotNil(t, r, "no assignment for %s", cluster)
	var out []string
	for _, l := range r.Message.(*endpoint.ClusterLoadAssignment).GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			a := e.GetEndpoint().GetAddress().GetSocketAddress()
			out = append(out, fmt.Sprintf("%s:%d", a.GetAddress(), a.GetPortValue()))
		}
	}
	return out
}

// goldenProxy is an entry of an xds golden case's proxies.yaml.
type goldenProxy struct {
	ID       string         `json:"id"`
	Metadata map[string]any `json:"metadata"`
	Dump     bool           `json:"dump"`
	Types    []string       `json:"types"`
	Locality string         `json:"locality"`
}

// Translate gives what the xds golden cases (package xds's testdata, built there straight
// from the configs, every listed proxy registered) say each proxy gets, through
// discovery's whole pipeline instead, the case's other proxies connected.
func TestTranslateGoldenCases(t *testing.T) {
	dirs, err := filepath.Glob("../xds/testdata/*")
	require.NoError(t, err)
	ran := 0
	for _, dir := range dirs {
		var proxies []goldenProxy
		data, err := os.ReadFile(filepath.Join(dir, "proxies.yaml"))
		require.NoError(t, err)
		require.NoError(t, yaml.UnmarshalStrict(data, &proxies))
		ran++
		t.Run(filepath.Base(dir), func(t *testing.T) { checkGoldenCase(t, dir, proxies) })
	}
	assert.GreaterOrEqual(t, ran, 20, "golden cases compared")
}

func checkGoldenCase(t *testing.T, dir string, proxies []goldenProxy) {
	cfgDir := t.TempDir()
	input, err := os.ReadFile(filepath.Join(dir, "input.yaml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(cfgDir, "input.yaml"), input, 0o644))
	opts := discovery.Options{ConfigDir: cfgDir, WasmCacheDir: t.TempDir()}
	if _, err := os.Stat(filepath.Join(dir, "mesh.yaml")); err == nil {
		opts.MeshConfigFile = filepath.Join(dir, "mesh.yaml")
	}
	if od, err := os.ReadFile(filepath.Join(dir, "options.yaml")); err == nil {
		var o struct {
			MTLS bool `json:"mtls"`
		}
		require.NoError(t, yaml.UnmarshalStrict(od, &o))
		opts.MTLS = o.MTLS
	}
	var golden []map[string]any
	out, err := os.ReadFile(filepath.Join(dir, "output.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(out, &golden))
	nodes := make([]*core.Node, len(proxies))
	for i, p := range proxies {
		md, err := structpb.NewStruct(p.Metadata)
		require.NoError(t, err)
		nodes[i] = &core.Node{Id: p.ID, Metadata: md}
		if p.Locality != "" {
			parts := append(strings.SplitN(p.Locality, "/", 3), "", "")
			nodes[i].Locality = &core.Locality{Region: parts[0], Zone: parts[1], SubZone: parts[2]}
		}
	}
	dumped := 0
	for i, p := range proxies {
		if !p.Dump {
			continue
		}
		want := golden[dumped]
		dumped++
		require.Equal(t, p.ID, want["proxy"])
		others := append(slices.Clone(nodes[:i]), nodes[i+1:]...)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		dump, err := discovery.Translate(ctx, opts, nodes[i], slog.New(slog.NewTextHandler(io.Discard, nil)), others...)
		cancel()
		require.NoError(t, err)
		for _, typ := range []string{xds.ClusterType, xds.EndpointType, xds.ListenerType, xds.RouteType, xds.ExtensionType} {
			short := xds.ShortType(typ)
			wantList, listed := want[short]
			if !listed {
				continue
			}
			var got []any
			for _, r := range dump[typ].Items {
				js, err := protojson.Marshal(r.Message)
				require.NoError(t, err)
				var v any
				require.NoError(t, json.Unmarshal(js, &v))
				got = append(got, v)
			}
			if wantList == nil {
				wantList = []any(nil)
			}
			assert.Equal(t, wantList, got, "%s %s", p.ID, short)
		}
	}
}
