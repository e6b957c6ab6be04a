package discovery_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	wasmhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// ecdsStream is a raw SotW ADS stream subscribed to listeners and to extension configs by
// name, as Envoy subscribes to the filters its listeners discover. Responses of one
// connection come in push order (LDS before ECDS), so once an ECDS update has arrived, any LDS
// update of the same push has too.
type ecdsStream struct {
	t      *testing.T
	stream discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	mu     sync.Mutex
	got    map[string]*core.TypedExtensionConfig
	lds    int // LDS responses received
	ldsRaw []*listener.Listener
}

func (e *env) ecds(n *core.Node, names ...string) *ecdsStream {
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel)
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(e.cc).StreamAggregatedResources(ctx)
	require.NoError(e.t, err)
	s := &ecdsStream{t: e.t, stream: st, got: map[string]*core.TypedExtensionConfig{}}
	require.NoError(e.t, st.Send(&discoverypb.DiscoveryRequest{Node: n, TypeUrl: xds.ListenerType}))
	require.NoError(e.t, st.Send(&discoverypb.DiscoveryRequest{TypeUrl: xds.ExtensionType, ResourceNames: names}))
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			s.mu.Lock()
			switch resp.GetTypeUrl() {
			case xds.ListenerType:
				s.lds++
				s.ldsRaw = nil
				for _, a := range resp.GetResources() {
					l := &listener.Listener{}
					if a.UnmarshalTo(l) == nil {
						s.ldsRaw = append(s.ldsRaw, l)
					}
				}
			case xds.ExtensionType:
				for _, a := range resp.GetResources() {
					tec := &core.TypedExtensionConfig{}
					if a.UnmarshalTo(tec) == nil {
						s.got[tec.GetName()] = tec
					}
				}
			}
			s.mu.Unlock()
			ack := &discoverypb.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
			if resp.GetTypeUrl() == xds.ExtensionType {
				ack.ResourceNames = names
			}
			_ = st.Send(ack)
		}
	}()
	return s
}

// module returns the module file an extension config loads ("" when there is none).
func (s *ecdsStream) module(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	tec := s.got[name]
	if tec == nil {
		return ""
	}
	w := &wasmhttp.Wasm{}
	require.NoError(s.t, tec.GetTypedConfig().UnmarshalTo(w))
	return w.GetConfig().GetVmConfig().GetCode().GetLocal().GetFilename()
}

func (s *ecdsStream) ldsResponses() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lds
}

// httpFilters lists the HTTP filters of the named listener's first connection manager.
func (s *ecdsStream) httpFilters(name string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.ldsRaw {
		if l.GetName() != name {
			continue
		}
		h := &hcm.HttpConnectionManager{}
		require.NoError(s.t, l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(h))
		var out []string
		for _, f := range h.GetHttpFilters() {
			out = append(out, f.GetName())
		}
		return out
	}
	return nil
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func quotaPlugin(url, sha string) string {
	return `
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: quota, namespace: demo}
spec:
  url: ` + url + `
  sha256: ` + sha + `
  phase: AUTHZ
  pluginConfig: {name: demo}
`
}

func TestWasmPluginModuleFetchedVerifiedAndServedOverECDS(t *testing.T) {
	v1, v2 := []byte("\x00asm\x01\x00\x00\x00 v1"), []byte("\x00asm\x01\x00\x00\x00 v2")
	modules := map[string][]byte{"/v1.wasm": v1, "/v2.wasm": v2, "/bad.wasm": []byte("tampered")}
	var mu sync.Mutex
	requests := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests[r.URL.Path]++
		mu.Unlock()
		_, _ = w.Write(modules[r.URL.Path])
	}))
	t.Cleanup(srv.Close)
	cache := t.TempDir()
	e := start(t, map[string]string{"services.yaml": services, "quota.yaml": quotaPlugin(srv.URL+"/v1.wasm", sum(v1))},
		func(o *discovery.Options) { o.WasmCacheDir = cache })

	s := e.ecds(node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1"), "demo.quota")
	want1 := filepath.Join(cache, sum(v1)+".wasm")
	require.Eventually(t, func() bool { return s.module("demo.quota") == want1 }, 10*time.Second, 5*time.Millisecond)
	// The plugin's filter discovers its configuration: the listener names it, by phase.
	require.Eventually(t, func() bool { return len(s.httpFilters("127.20.0.1_9081")) > 0 }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, []string{"demo.quota", "envoy.filters.http.fault", "envoy.filters.http.cors", "envoy.filters.http.router"},
		s.httpFilters("127.20.0.1_9081"))
	lds := s.ldsResponses()

	// A new module version reaches the proxy as an extension config update, without a
	// listener update.
	e.write("quota.yaml", quotaPlugin(srv.URL+"/v2.wasm", sum(v2)))
	want2 := filepath.Join(cache, sum(v2)+".wasm")
	require.Eventually(t, func() bool { return s.module("demo.quota") == want2 }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, lds, s.ldsResponses(), "no listener was rebuilt")

	// A module that does not match its digest is reported and not applied: the proxy keeps
	// the last good version. (A digest already in the cache would need no fetch: the cache is
	// content-addressed.)
	e.write("quota.yaml", quotaPlugin(srv.URL+"/bad.wasm", sum([]byte("\x00asm\x01\x00\x00\x00 v3"))))
	var st struct {
		Extensions struct {
			WasmModules []struct {
				URL, State, Error string
			} `json:"wasmModules"`
		} `json:"extensions"`
	}
	require.Eventually(t, func() bool {
		require.NoError(t, json.Unmarshal([]byte(httpGet(t, "http://"+e.d.HTTPAddr()+"/debug/configz")), &st))
		for _, m := range st.Extensions.WasmModules {
			if m.URL == srv.URL+"/bad.wasm" && m.State == "failed" {
				assert.Contains(t, m.Error, "sha256 mismatch")
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, want2, s.module("demo.quota"))
	body := httpGet(t, "http://"+e.d.HTTPAddr()+"/metrics")
	assert.Contains(t, body, `wasm_remote_fetch_count{result="checksum_mismatched"}`)
	assert.Contains(t, body, `wasm_remote_fetch_count{result="success"} 2`)
	mu.Lock()
	assert.Equal(t, 1, requests["/v1.wasm"], "fetched once")
	mu.Unlock()
}

func TestEnvoyFilterPatchNotAppliedIsReported(t *testing.T) {
	bad := `
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: bad, namespace: demo}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match: {context: SIDECAR_OUTBOUND}
    patch: {operation: INSERT_FIRST, value: {name: good, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer, max_request_bytes: 1024}}}
  - applyTo: HTTP_FILTER
    match: {context: SIDECAR_OUTBOUND}
    patch: {operation: ADD, value: {name: after-router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer, max_request_bytes: 1024}}}
`
	e := start(t, map[string]string{"services.yaml": services, "bad.yaml": bad}, func(o *discovery.Options) { o.WasmCacheDir = t.TempDir() })
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	wait(t, fe, has(adsc.ListenerType, "127.20.0.1_9081"))
	var l listener.Listener
	require.True(t, fe.Resource(adsc.ListenerType, "127.20.0.1_9081", &l))
	h := &hcm.HttpConnectionManager{}
	require.NoError(t, l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(h))
	var names []string
	for _, f := range h.GetHttpFilters() {
		names = append(names, f.GetName())
	}
	assert.Equal(t, []string{"good", "envoy.filters.http.fault", "envoy.filters.http.cors", "envoy.filters.http.router"}, names,
		"the listener is sent without the patch that would make it invalid")

	var st struct {
		Extensions struct {
			NotApplied []struct {
				Config, Resource, Error string
				Patch                   int
			} `json:"notApplied"`
		} `json:"extensions"`
	}
	require.NoError(t, json.Unmarshal([]byte(httpGet(t, "http://"+e.d.HTTPAddr()+"/debug/configz")), &st))
	require.NotEmpty(t, st.Extensions.NotApplied)
	p := st.Extensions.NotApplied[0]
	assert.Equal(t, "EnvoyFilter demo/bad", p.Config)
	assert.Equal(t, 1, p.Patch)
	assert.Contains(t, p.Error, "must be the last HTTP filter")
	assert.Contains(t, httpGet(t, "http://"+e.d.HTTPAddr()+"/metrics"),
		`wasmesh_config_not_applied{kind="EnvoyFilter",name="bad",namespace="demo",patch="1"}`)
	for _, r := range fe.Responses() {
		assert.False(t, r.Nacked, "the proxy accepted everything it was sent")
	}
}

// The same over Delta xDS: the plugin's extension config arrives by name, and a new module
// version is an update of that one resource.
func TestWasmPluginOverDeltaECDS(t *testing.T) {
	v1, v2 := []byte("\x00asm\x01\x00\x00\x00 d1"), []byte("\x00asm\x01\x00\x00\x00 d2")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(map[string][]byte{"/v1.wasm": v1, "/v2.wasm": v2}[r.URL.Path])
	}))
	t.Cleanup(srv.Close)
	cache := t.TempDir()
	e := start(t, map[string]string{"services.yaml": services, "quota.yaml": quotaPlugin(srv.URL+"/v1.wasm", sum(v1))},
		func(o *discovery.Options) { o.WasmCacheDir = cache })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(e.cc).DeltaAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&discoverypb.DeltaDiscoveryRequest{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1"),
		TypeUrl: xds.ExtensionType, ResourceNamesSubscribe: []string{"demo.quota"}}))
	var mu sync.Mutex
	module := ""
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			for _, r := range resp.GetResources() {
				tec := &core.TypedExtensionConfig{}
				w := &wasmhttp.Wasm{}
				if r.GetResource().UnmarshalTo(tec) == nil && tec.GetTypedConfig().UnmarshalTo(w) == nil {
					mu.Lock()
					module = w.GetConfig().GetVmConfig().GetCode().GetLocal().GetFilename()
					mu.Unlock()
				}
			}
			_ = st.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
		}
	}()
	got := func() string { mu.Lock(); defer mu.Unlock(); return module }
	require.Eventually(t, func() bool { return got() == filepath.Join(cache, sum(v1)+".wasm") }, 10*time.Second, 5*time.Millisecond)
	e.write("quota.yaml", quotaPlugin(srv.URL+"/v2.wasm", sum(v2)))
	require.Eventually(t, func() bool { return got() == filepath.Join(cache, sum(v2)+".wasm") }, 10*time.Second, 5*time.Millisecond)
}
