package harness

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

// asFixture is the filter in wasm/testdata/assemblyscript, built by `make fixtures` with
// AssemblyScript and @solo-io/proxy-runtime: a guest of another SDK, ABI 0.2.0, importing
// wasi_unstable and asking for plugin_root_id while it starts.
func asFixture(tb testing.TB) []byte {
	return wasmbuild.Prebuilt(tb, "WASMESH_AS_FIXTURE", "fixtures")
}

func TestAssemblyScriptGuestBesideGo(t *testing.T) {
	as := asFixture(t)
	ctx := context.Background()
	h := newHarness(t, Options{Wasm: as, Plugin: host.PluginConfig{
		Name: "as", RootID: "as_filter", Configuration: []byte("from-config"), Instances: 2}})
	assert.Equal(t, host.ABIVersion("0.2.0"), h.Plugin().Module().ABIVersion())

	// The Go kitchen guest runs on the same runtime at the same time.
	goH := newHarness(t, Options{Runtime: h.Runtime(), Plugin: host.PluginConfig{Name: "kitchen"}})

	for i := 0; i < 3; i++ {
		rep, err := h.Do(ctx, Request{Path: "/items", Worker: i % 2, PinWorker: true,
			Response: Response{Status: 200}})
		require.NoError(t, err)
		require.Empty(t, rep.Failures)
		require.NotNil(t, rep.Upstream)
		assert.Equal(t, "from-config", rep.Upstream.Header("x-as-filter"))
		assert.Equal(t, "as_filter", rep.Client.Header("x-as-root-id"))
		assert.Equal(t, 200, rep.Status)

		goRep, err := goH.Do(ctx, Request{Path: "/", Headers: [][2]string{{"x-op", "add-header"}}})
		require.NoError(t, err)
		assert.Equal(t, 200, goRep.Status)
	}

	rep, err := h.Do(ctx, Request{Path: "/as-deny"})
	require.NoError(t, err)
	assert.Nil(t, rep.Upstream, "a denied request never reaches the upstream")
	assert.Equal(t, 403, rep.Status)
	assert.Equal(t, "denied by assemblyscript", string(rep.Client.Body))

	m, ok := h.Metric("as_filter_requests")
	require.True(t, ok, "metric defined by the AssemblyScript guest")
	assert.Equal(t, int64(4), m.Value)
	assert.Empty(t, h.Stats().Failures)

	var infos int
	for _, l := range h.Logs() {
		if l.Level == host.LogInfo && l.Message == "as_filter: request /items" {
			infos++
		}
	}
	assert.Equal(t, 3, infos)
}

// proxy-runtime exits the VM (proc_exit 255) when the root id it is started with has no
// registered root context: the plugin must fail to start with an error, not panic.
func TestAssemblyScriptGuestWrongRootID(t *testing.T) {
	as := asFixture(t)
	rt := newHarness(t, Options{Wasm: as, Plugin: host.PluginConfig{Name: "as", RootID: "as_filter"}}).Runtime()
	_, err := New(context.Background(), Options{Wasm: as, Runtime: rt,
		Plugin: host.PluginConfig{Name: "as", RootID: "nope"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "proc_exit(255)")
}
