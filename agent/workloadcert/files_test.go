package workloadcert

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
	"github.com/wasmesh/wasmesh/agent/internal/testca"
)

func writeCreds(t *testing.T, dir string, ca *testca.CA, id string) {
	chain, key := ca.Issue(t, id, time.Hour)
	for name, b := range map[string][]byte{CertChainFile: chain, KeyFile: key, RootCertFile: ca.RootPEM} {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p+".tmp", b, 0o600))
		require.NoError(t, os.Rename(p+".tmp", p))
	}
}

func TestMountedFilesServedAndFollowed(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	dir := t.TempDir()
	present, err := FilesPresent(dir)
	require.NoError(t, err)
	assert.False(t, present)
	writeCreds(t, dir, ca, "spiffe://cluster.local/ns/default/sa/a")
	present, err = FilesPresent(dir)
	require.NoError(t, err)
	assert.True(t, present)

	log := &proxytest.Output{}
	served := NewServed(prometheus.NewRegistry(), nil)
	f := &Files{Dir: dir, Interval: time.Hour, Served: served, Log: slog.New(slog.NewTextHandler(log, nil))}
	published := make(chan *Bundle, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx, func(b *Bundle) { published <- b }) }()
	defer func() { cancel(); <-done }()

	next := func() *Bundle {
		select {
		case b := <-published:
			return b
		case <-time.After(10 * time.Second):
			t.Fatal("nothing published")
			return nil
		}
	}
	first := next()
	assert.Equal(t, "spiffe://cluster.local/ns/default/sa/a", first.Leaf.URIs[0].String())
	assert.Equal(t, ca.RootPEM, first.Roots)

	// A key that does not match the certificate is not served.
	other, _ := ca.Issue(t, "spiffe://cluster.local/ns/default/sa/x", time.Hour)
	require.NoError(t, os.WriteFile(filepath.Join(dir, CertChainFile), other, 0o600))
	require.Eventually(t, func() bool { return containsAll(log.String(), "not usable", "private key does not match") },
		10*time.Second, 10*time.Millisecond)
	assert.Same(t, first, served.Current(), "the last good bundle stays")

	writeCreds(t, dir, ca, "spiffe://cluster.local/ns/default/sa/b")
	second := next()
	assert.Equal(t, "spiffe://cluster.local/ns/default/sa/b", second.Leaf.URIs[0].String())
	assert.Same(t, second, served.Current())
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

func TestBadFilesAreNamed(t *testing.T) {
	dir := t.TempDir()
	_, err := LoadFiles(dir)
	assert.ErrorContains(t, err, CertChainFile)
	ca := testca.Start(t, time.Hour)
	writeCreds(t, dir, ca, "spiffe://cluster.local/ns/default/sa/a")
	require.NoError(t, os.WriteFile(filepath.Join(dir, RootCertFile), []byte("junk"), 0o600))
	_, err = LoadFiles(dir)
	assert.ErrorContains(t, err, "root certificates: no PEM certificate")
	assert.ErrorContains(t, err, dir)
}

// Mounted certificates nobody renews are logged as they near their end and expire.
func TestMountedCertificateNearingItsEndIsLogged(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	dir := t.TempDir()
	writeCreds(t, dir, ca, "spiffe://cluster.local/ns/default/sa/a")
	var now atomic.Pointer[time.Time]
	start := time.Now()
	now.Store(&start)
	log := &proxytest.Output{}
	served := NewServed(nil, func() time.Time { return *now.Load() })
	f := &Files{Dir: dir, Interval: 10 * time.Millisecond, Served: served, Log: slog.New(slog.NewTextHandler(log, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx, func(*Bundle) {}) }()
	defer func() { cancel(); <-done }()

	require.Eventually(t, func() bool { return served.Current() != nil }, 10*time.Second, 5*time.Millisecond)
	assert.NotContains(t, log.String(), "expires soon")
	soon := served.Current().Leaf.NotAfter.Add(-5 * time.Minute)
	now.Store(&soon)
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "expires soon and nothing renews it") },
		10*time.Second, 5*time.Millisecond)
	late := served.Current().Leaf.NotAfter.Add(time.Minute)
	now.Store(&late)
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "has EXPIRED") }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, strings.Count(log.String(), "expires soon"), "logged when the state changes, not at every check")
}
