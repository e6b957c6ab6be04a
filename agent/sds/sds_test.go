package sds

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
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
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/agent/internal/testca"
	"github.com/wasmesh/wasmesh/agent/workloadcert"
)

type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

type rig struct {
	srv    *Server
	client secretv3.SecretDiscoveryServiceClient
	ca     *testca.CA
	log    *syncLog
	ctx    context.Context
}

// start serves SDS on a real Unix socket at Istio's relative path under a short temporary
// directory (socket paths are limited to 107 bytes) and connects a gRPC client to it.
func start(t *testing.T) *rig {
	dir, err := os.MkdirTemp("", "sds")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, DefaultSocketPath)
	log := &syncLog{}
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

	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	tctx, tcancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(tcancel)
	return &rig{srv: srv, client: secretv3.NewSecretDiscoveryServiceClient(conn), ca: testca.Start(t, time.Hour), log: log, ctx: tctx}
}

func (r *rig) bundle(t *testing.T, sa string) *workloadcert.Bundle {
	chain, key := r.ca.Issue(t, "spiffe://cluster.local/ns/default/sa/"+sa, time.Hour)
	b, err := workloadcert.NewBundle(chain, key, r.ca.RootPEM)
	require.NoError(t, err)
	return b
}

func recv[T any](t *testing.T, f func() (T, error)) T {
	t.Helper()
	got := make(chan T, 1)
	errs := make(chan error, 1)
	go func() {
		v, err := f()
		if err != nil {
			errs <- err
			return
		}
		got <- v
	}()
	select {
	case v := <-got:
		return v
	case err := <-errs:
		t.Fatalf("stream: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no response within 10 s")
	}
	var zero T
	return zero
}

func secretsOf(t *testing.T, resources [][]byte) map[string]*tlsv3.Secret {
	out := map[string]*tlsv3.Secret{}
	for _, raw := range resources {
		s := &tlsv3.Secret{}
		require.NoError(t, proto.Unmarshal(raw, s))
		require.NoError(t, s.ValidateAll(), "a valid Envoy secret")
		out[s.GetName()] = s
	}
	return out
}

var node = &corev3.Node{Id: "sidecar~127.0.0.1~a.default~default.svc.cluster.local"}

// A proxy asking before the first certificate waits for it; a rotation reaches it on
// the same stream; its NACK is logged and counted. One stream per secret, as Envoy opens.
func TestStateOfTheWorldStreamGetsTheRotatedSecret(t *testing.T) {
	r := start(t)
	streams := map[string]secretv3.SecretDiscoveryService_StreamSecretsClient{}
	for _, name := range []string{WorkloadSecret, RootSecret} {
		s, err := r.client.StreamSecrets(r.ctx)
		require.NoError(t, err)
		require.NoError(t, s.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resource.SecretType, ResourceNames: []string{name}}))
		streams[name] = s
	}
	require.Eventually(t, func() bool { return bytes.Count([]byte(r.log.String()), []byte("proxy asks for secrets")) == 2 },
		10*time.Second, 5*time.Millisecond)

	first := r.bundle(t, "a")
	require.NoError(t, r.srv.Update(first))
	versions := map[string]*discoveryv3.DiscoveryResponse{}
	for name, s := range streams {
		resp := recv(t, s.Recv)
		got := secretsOf(t, rawOf(resp.GetResources()))
		require.Len(t, got, 1, "only the secret asked for, %s", name)
		versions[name] = resp
	}
	tlsCert := secretOfAny(t, versions[WorkloadSecret]).GetTlsCertificate()
	assert.Equal(t, first.CertChain, tlsCert.GetCertificateChain().GetInlineBytes())
	assert.Equal(t, first.Key, tlsCert.GetPrivateKey().GetInlineBytes())
	assert.Equal(t, r.ca.RootPEM, secretOfAny(t, versions[RootSecret]).GetValidationContext().GetTrustedCa().GetInlineBytes())

	// ACK both, then rotate.
	for name, s := range streams {
		resp := versions[name]
		require.NoError(t, s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.SecretType, ResourceNames: []string{name},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}))
	}
	second := r.bundle(t, "a")
	require.NoError(t, r.srv.Update(second))
	resp := recv(t, streams[WorkloadSecret].Recv)
	assert.Equal(t, second.CertChain, secretOfAny(t, resp).GetTlsCertificate().GetCertificateChain().GetInlineBytes())
	assert.NotEqual(t, versions[WorkloadSecret].GetVersionInfo(), resp.GetVersionInfo())

	// The proxy rejects it.
	require.NoError(t, streams[WorkloadSecret].Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.SecretType,
		ResourceNames: []string{WorkloadSecret}, VersionInfo: versions[WorkloadSecret].GetVersionInfo(), ResponseNonce: resp.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "Failed to load certificate chain"}}))
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.srv.nacks) == 1 }, 10*time.Second, 5*time.Millisecond)
	assert.Contains(t, r.log.String(), "Failed to load certificate chain")
	assert.Contains(t, r.log.String(), "the proxy rejected a secret (NACK)")
}

func TestDeltaStreamGetsTheRotatedSecret(t *testing.T) {
	r := start(t)
	first := r.bundle(t, "a")
	require.NoError(t, r.srv.Update(first))
	s, err := r.client.DeltaSecrets(r.ctx)
	require.NoError(t, err)
	require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.SecretType,
		ResourceNamesSubscribe: []string{WorkloadSecret, RootSecret}}))
	resp := recv(t, s.Recv)
	got := map[string]*tlsv3.Secret{}
	for _, res := range resp.GetResources() {
		for n, sec := range secretsOf(t, [][]byte{res.GetResource().GetValue()}) {
			got[n] = sec
			assert.Equal(t, n, res.GetName())
		}
	}
	require.Len(t, got, 2)
	assert.Equal(t, first.Key, got[WorkloadSecret].GetTlsCertificate().GetPrivateKey().GetInlineBytes())
	require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.SecretType, ResponseNonce: resp.GetNonce()}))

	second := r.bundle(t, "a")
	require.NoError(t, r.srv.Update(second))
	resp = recv(t, s.Recv)
	names := map[string]bool{}
	for _, res := range resp.GetResources() {
		names[res.GetName()] = true
		if res.GetName() == WorkloadSecret {
			sec := secretsOf(t, [][]byte{res.GetResource().GetValue()})[WorkloadSecret]
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

func rawOf(res []*anypb.Any) [][]byte {
	out := make([][]byte, len(res))
	for i, a := range res {
		out[i] = a.GetValue()
	}
	return out
}

func secretOfAny(t *testing.T, resp *discoveryv3.DiscoveryResponse) *tlsv3.Secret {
	t.Helper()
	require.Len(t, resp.GetResources(), 1)
	for _, s := range secretsOf(t, rawOf(resp.GetResources())) {
		return s
	}
	return nil
}
