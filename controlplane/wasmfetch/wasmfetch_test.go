package wasmfetch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	extensions "istio.io/api/extensions/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

var wasmModule = []byte("\x00asm\x01\x00\x00\x00 a module")

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

type listStore []*config.Config

func (l listStore) List() []*config.Config { return l }

func plugin(name, url, sha string) *config.Config {
	return &config.Config{Meta: config.Meta{Kind: config.WasmPlugin, Namespace: "default", Name: name},
		Spec: &extensions.WasmPlugin{Url: url, Sha256: sha, PluginConfig: nil}}
}

// moduleServer serves module at /m.wasm, failing the first fail requests with 503.
type moduleServer struct {
	*httptest.Server
	requests atomic.Int32
	fail     atomic.Int32
}

func newModuleServer(t *testing.T, body []byte) *moduleServer {
	ms := &moduleServer{}
	ms.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms.requests.Add(1)
		if ms.fail.Add(-1) >= 0 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(body)
	}))
	t.Cleanup(ms.Close)
	return ms
}

// harness runs a fetcher and records the keys it reports as changed.
type harness struct {
	f       *Fetcher
	reg     *prometheus.Registry
	mu      sync.Mutex
	changed []config.Key
}

func start(t *testing.T, dir string) *harness {
	h := &harness{reg: prometheus.NewRegistry()}
	f, err := New(Options{Dir: dir, RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond},
		slog.New(slog.NewTextHandler(io.Discard, nil)), h.reg, func(keys []config.Key) {
			h.mu.Lock()
			h.changed = append(h.changed, keys...)
			h.mu.Unlock()
		})
	require.NoError(t, err)
	h.f = f
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

func (h *harness) changedKeys() []config.Key {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]config.Key(nil), h.changed...)
}

func urlOf(c *config.Config) string { return c.Spec.(*extensions.WasmPlugin).GetUrl() }

func TestFetchedOnceVerifiedAndCached(t *testing.T) {
	ms := newModuleServer(t, wasmModule)
	dir := t.TempDir()
	h := start(t, dir)
	p := plugin("quota", ms.URL+"/m.wasm", digest(wasmModule))
	other := &config.Config{Meta: config.Meta{Kind: config.Sidecar, Namespace: "default", Name: "s"}}
	after := &config.Config{Meta: config.Meta{Kind: config.WorkloadEntry, Namespace: "default", Name: "w"}}
	s := NewStore(listStore{other, p, after}, h.f)

	// Not fetched yet: the plugin is left out, everything else is listed.
	first := s.List()
	require.Equal(t, []*config.Config{other, after}, first)

	require.Eventually(t, func() bool { return len(h.changedKeys()) > 0 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, []config.Key{p.Key()}, h.changedKeys(), "the plugin is pushed again once its module is ready")
	list := s.List()
	require.Len(t, list, 3)
	assert.Same(t, after, list[2])
	want := filepath.Join(dir, digest(wasmModule)+".wasm")
	assert.Equal(t, "file://"+want, urlOf(list[1]))
	assert.Equal(t, "http://", urlOf(p)[:7], "the stored config is not modified")
	got, err := os.ReadFile(want)
	require.NoError(t, err)
	assert.Equal(t, wasmModule, got)
	assert.Equal(t, 1.0, testutil.ToFloat64(h.f.fetches.WithLabelValues("success")))
	assert.Same(t, list[1], s.List()[1], "listing again reuses the resolved config")

	// Another discovery with the same cache directory does not download again.
	h2 := start(t, dir)
	s2 := NewStore(listStore{p}, h2.f)
	s2.List()
	require.Eventually(t, func() bool { return len(s2.List()) == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, int32(1), ms.requests.Load())
	st := h2.f.Status()
	require.Len(t, st, 1)
	assert.Equal(t, StateReady, st[0].State)
	assert.Equal(t, []string{"WasmPlugin default/quota"}, st[0].UsedBy)
}

func TestMismatchIsReportedAndNotApplied(t *testing.T) {
	ms := newModuleServer(t, []byte("something else"))
	h := start(t, t.TempDir())
	p := plugin("quota", ms.URL+"/m.wasm", digest(wasmModule))
	s := NewStore(listStore{p}, h.f)
	s.List()
	require.Eventually(t, func() bool { return len(h.f.Status()) == 1 && h.f.Status()[0].State == StateFailed }, 5*time.Second, time.Millisecond)
	assert.Contains(t, h.f.Status()[0].Error, "sha256 mismatch")
	assert.Contains(t, h.f.Status()[0].Error, digest([]byte("something else")))
	assert.Empty(t, s.List(), "a plugin whose module does not verify is not applied")
	assert.GreaterOrEqual(t, testutil.ToFloat64(h.f.fetches.WithLabelValues("checksum_mismatched")), 1.0)
	assert.Equal(t, []config.Key{p.Key()}, h.changedKeys()[:1], "the failure is pushed (the plugin is not applied)")
}

func TestFailureRetriedAndLastGoodKept(t *testing.T) {
	ms := newModuleServer(t, wasmModule)
	h := start(t, t.TempDir())
	p := plugin("quota", ms.URL+"/m.wasm", digest(wasmModule))
	store := listStore{p}
	s := NewStore(store, h.f)
	s.List()
	require.Eventually(t, func() bool { return len(s.List()) == 1 }, 5*time.Second, time.Millisecond)
	good := s.List()[0]

	// A new version whose server fails twice: the old version stays until the new one is
	// fetched on a retry.
	v2 := []byte("\x00asm\x01\x00\x00\x00 version 2")
	ms2 := newModuleServer(t, v2)
	ms2.fail.Store(2)
	p2 := plugin("quota", ms2.URL+"/m.wasm", digest(v2))
	s.inner = listStore{p2}
	assert.Same(t, good, s.List()[0])
	require.Eventually(t, func() bool {
		l := s.List()
		return len(l) == 1 && l[0] != good
	}, 5*time.Second, time.Millisecond)
	assert.Equal(t, int32(3), ms2.requests.Load(), "two failures, then success")
	assert.GreaterOrEqual(t, testutil.ToFloat64(h.f.fetches.WithLabelValues("download_failure")), 2.0)

	// A deleted plugin is forgotten, with its module.
	s.inner = listStore{}
	assert.Empty(t, s.List())
	assert.Empty(t, h.f.Status())
}

func TestLocalModuleWithDigestIsVerified(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "quota.wasm")
	require.NoError(t, os.WriteFile(path, wasmModule, 0o644))
	h := start(t, t.TempDir())
	good := plugin("good", "file://"+path, digest(wasmModule))
	bad := plugin("bad", "file://"+path, digest([]byte("other")))
	plain := plugin("plain", "file:///not/checked.wasm", "")
	s := NewStore(listStore{bad, good, plain}, h.f)
	s.List()
	require.Eventually(t, func() bool { return len(s.List()) == 2 }, 5*time.Second, time.Millisecond)
	l := s.List()
	assert.Equal(t, "good", l[0].Name)
	assert.Equal(t, "file://"+path, urlOf(l[0]))
	assert.Same(t, plain, l[1], "a file:// module without sha256 is the proxy's to read")
	require.Eventually(t, func() bool {
		for _, st := range h.f.Status() {
			if st.State == StateFailed {
				return true
			}
		}
		return false
	}, 5*time.Second, time.Millisecond)
}

// With nothing to resolve, the inner list is returned itself: a push does not copy the
// configs of every kind to look at the plugins.
func TestNothingToResolveListsTheInnerList(t *testing.T) {
	h := start(t, t.TempDir())
	inner := listStore{
		{Meta: config.Meta{Kind: config.Sidecar, Namespace: "default", Name: "s"}},
		plugin("plain", "file:///not/checked.wasm", ""),
		{Meta: config.Meta{Kind: config.WorkloadEntry, Namespace: "default", Name: "w"}},
	}
	listed := NewStore(inner, h.f).List()
	assert.Same(t, &inner[0], &listed[0])
}

// Open reads file:// and http(s) modules and refuses the rest; Digest hashes at most its
// limit (the cache, discovery's fetches and the analyzer all read modules through both).
func TestOpenAndDigestAModule(t *testing.T) {
	ms := newModuleServer(t, wasmModule)
	path := filepath.Join(t.TempDir(), "m.wasm")
	require.NoError(t, os.WriteFile(path, wasmModule, 0o644))
	for _, raw := range []string{"file://" + path, ms.URL + "/m.wasm"} {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		body, err := Open(context.Background(), ms.Client(), u)
		require.NoError(t, err, raw)
		var copied bytes.Buffer
		sum, err := Digest(&copied, body, int64(len(wasmModule)))
		require.NoError(t, body.Close())
		require.NoError(t, err, "exactly the limit is allowed")
		assert.Equal(t, digest(wasmModule), sum, raw)
		assert.Equal(t, wasmModule, copied.Bytes(), "the copy is the module")
	}

	_, err := Digest(nil, bytes.NewReader(wasmModule), int64(len(wasmModule))-1)
	assert.EqualError(t, err, fmt.Sprintf("module larger than %d bytes", len(wasmModule)-1))

	ms.fail.Store(1)
	u, _ := url.Parse(ms.URL + "/m.wasm")
	_, err = Open(context.Background(), ms.Client(), u)
	assert.ErrorContains(t, err, "503 Service Unavailable")

	oci, _ := url.Parse("oci://registry/filter:1")
	_, err = Open(context.Background(), ms.Client(), oci)
	assert.ErrorContains(t, err, `scheme "oci" is not read here`)
}

// A download cut short is a failed download, reported as such, not a module whose digest
// differs.
func TestCutDownloadIsAFailureNotAMismatch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", "100")
		_, _ = w.Write(wasmModule[:10])
	}))
	t.Cleanup(srv.Close)
	h := start(t, t.TempDir())
	s := NewStore(listStore{plugin("quota", srv.URL+"/m.wasm", digest(wasmModule))}, h.f)
	s.List()
	require.Eventually(t, func() bool { return len(h.f.Status()) == 1 && h.f.Status()[0].State == StateFailed }, 5*time.Second, time.Millisecond)
	assert.Contains(t, h.f.Status()[0].Error, "unexpected EOF")
	assert.GreaterOrEqual(t, testutil.ToFloat64(h.f.fetches.WithLabelValues("download_failure")), 1.0)
	assert.Zero(t, testutil.ToFloat64(h.f.fetches.WithLabelValues("checksum_mismatched")))
}
