package sds

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
	"github.com/wasmesh/wasmesh/agent/internal/sdstest"
	"github.com/wasmesh/wasmesh/agent/internal/testca"
	"github.com/wasmesh/wasmesh/agent/workloadcert"
)

type rig struct {
	srv    *Server
	client secretv3.SecretDiscoveryServiceClient
	ca     *testca.CA
	log    *proxytest.Output
	ctx    context.Context
}

// start serves SDS on a real Unix socket at Istio's relative path under a short temporary
// directory (socket paths are limited to 107 bytes) and connects a gRPC client to it.
func start(t *testing.T) *rig {
	dir, err := os.MkdirTemp("", "sds")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, DefaultSocketPath)
	log := &proxytest.Output{}
	srv, err := New(slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})), prometheus.NewRegistry())
	require.NoError(t, err)
	l, err := Listen(path)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "only the owner may read the key")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	tctx, tcancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(tcancel)
	return &rig{srv: srv, client: sdstest.Dial(t, path), ca: testca.Start(t, time.Hour), log: log, ctx: tctx}
}

func (r *rig) bundle(t *testing.T, sa string) *workloadcert.Bundle {
	chain, key := r.ca.Issue(t, "spiffe://cluster.local/ns/default/sa/"+sa, time.Hour)
	b, err := workloadcert.NewBundle(chain, key, r.ca.RootPEM)
	require.NoError(t, err)
	return b
}

var node = &corev3.Node{Id: "sidecar~127.0.0.1~a.default~default.svc.cluster.local"}

// A proxy asking before the first certificate waits for it; a rotation reaches it on
// the same stream; its NACK is logged and counted. One stream per secret, as Envoy opens.
func TestStateOfTheWorldStreamGetsTheRotatedSecret(t *testing.T) {
	r := start(t)
	cert := sdstest.Watch(r.ctx, t, r.client, WorkloadSecret)
	root := sdstest.Watch(r.ctx, t, r.client, RootSecret)
	require.Eventually(t, func() bool { return strings.Count(r.log.String(), "proxy asks for secrets") == 2 },
		10*time.Second, 5*time.Millisecond)

	first := r.bundle(t, "a")
	require.NoError(t, r.srv.Update(first))
	got, firstResp := cert.Next()
	assert.Equal(t, first.CertChain, got.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
	assert.Equal(t, first.Key, got.GetTlsCertificate().GetPrivateKey().GetInlineBytes())
	gotRoot, _ := root.Next()
	assert.Equal(t, r.ca.RootPEM, gotRoot.GetValidationContext().GetTrustedCa().GetInlineBytes())
	cert.ACK()
	root.ACK()

	second := r.bundle(t, "a")
	require.NoError(t, r.srv.Update(second))
	got, resp := cert.Next()
	assert.Equal(t, second.CertChain, got.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
	assert.NotEqual(t, firstResp.GetVersionInfo(), resp.GetVersionInfo())

	cert.NACK(firstResp, "Failed to load certificate chain")
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.srv.nacks) == 1 }, 10*time.Second, 5*time.Millisecond)
	assert.Contains(t, r.log.String(), "Failed to load certificate chain")
	assert.Contains(t, r.log.String(), "the proxy rejected a secret (NACK)")
}

func TestDeltaStreamGetsTheRotatedSecret(t *testing.T) {
	r := start(t)
	s, err := r.client.DeltaSecrets(r.ctx)
	require.NoError(t, err)
	require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.SecretType,
		ResourceNamesSubscribe: []string{WorkloadSecret, RootSecret}}))
	// Asked before the first certificate: answered when it comes.
	require.Eventually(t, func() bool { return strings.Contains(r.log.String(), "proxy asks for secrets") }, 10*time.Second, 5*time.Millisecond)
	first := r.bundle(t, "a")
	require.NoError(t, r.srv.Update(first))
	resp := sdstest.Recv(t, s.Recv)
	got := map[string]*tlsv3.Secret{}
	for _, res := range resp.GetResources() {
		for n, sec := range sdstest.Secrets(t, res.GetResource()) {
			got[n] = sec
			assert.Equal(t, n, res.GetName())
		}
	}
	require.Len(t, got, 2)
	assert.Equal(t, first.Key, got[WorkloadSecret].GetTlsCertificate().GetPrivateKey().GetInlineBytes())
	require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.SecretType, ResponseNonce: resp.GetNonce()}))

	second := r.bundle(t, "a")
	require.NoError(t, r.srv.Update(second))
	resp = sdstest.Recv(t, s.Recv)
	names := map[string]bool{}
	for _, res := range resp.GetResources() {
		names[res.GetName()] = true
		if res.GetName() == WorkloadSecret {
			sec := sdstest.Secrets(t, res.GetResource())[WorkloadSecret]
			assert.Equal(t, second.CertChain, sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
		}
	}
	assert.True(t, names[WorkloadSecret], "the rotated certificate is pushed")
	assert.Positive(t, testutil.ToFloat64(r.srv.pushes))
}

func TestSocketPathErrors(t *testing.T) {
	_, err := Listen("/" + string(bytes.Repeat([]byte("x"), 120)))
	assert.ErrorContains(t, err, "longer than a Unix socket path can be")
	f := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(f, nil, 0o600))
	_, err = Listen(filepath.Join(f, "socket"))
	assert.ErrorContains(t, err, "SDS socket directory")

	// A socket left by an agent that crashed is replaced.
	dir, err := os.MkdirTemp("", "sds")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	stale := filepath.Join(dir, "socket")
	require.NoError(t, os.WriteFile(stale, nil, 0o600))
	l, err := Listen(stale)
	require.NoError(t, err)
	l.Close()
}

// A stream that goes away before the first certificate leaves nothing waiting behind.
func TestStreamClosedBeforeTheFirstCertificate(t *testing.T) {
	r := start(t)
	ctx, cancel := context.WithCancel(r.ctx)
	sdstest.Watch(ctx, t, r.client, WorkloadSecret)
	parked := func() int {
		r.srv.cache.mu.Lock()
		defer r.srv.cache.mu.Unlock()
		return len(r.srv.cache.parked)
	}
	require.Eventually(t, func() bool { return parked() == 1 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.Eventually(t, func() bool { return parked() == 0 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, r.srv.Update(r.bundle(t, "a")))

	// A new stream gets the certificate at once.
	got, _ := sdstest.Watch(r.ctx, t, r.client, WorkloadSecret).Next()
	assert.NotEmpty(t, got.GetTlsCertificate().GetPrivateKey().GetInlineBytes())
}
