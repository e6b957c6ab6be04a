package sds

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/wasmesh/wasmesh/controlplane/ca"
)

// unixClusters has one static cluster, "sds-grpc", a Unix socket.
type unixClusters struct{ path string }

func (u unixClusters) IsStatic(name string) bool { return name == "sds-grpc" }
func (u unixClusters) Dial(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", u.path)
}

// sdsServer is go-control-plane's SDS server over a linear cache, recording requests.
type sdsServer struct {
	cache *cachev3.LinearCache
	mu    sync.Mutex
	reqs  []*discoveryv3.DiscoveryRequest
}

func startServer(t *testing.T) (*sdsServer, string) {
	t.Helper()
	s := &sdsServer{cache: cachev3.NewLinearCache(resourcev3.SecretType)}
	path := filepath.Join(t.TempDir(), "sds.sock")
	lis, err := net.Listen("unix", path)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	g := grpc.NewServer()
	secretv3.RegisterSecretDiscoveryServiceServer(g, serverv3.NewServer(ctx, s.cache, serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			s.mu.Lock()
			s.reqs = append(s.reqs, r)
			s.mu.Unlock()
			return nil
		}}))
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); cancel() })
	return s, path
}

func (s *sdsServer) last() *discoveryv3.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) == 0 {
		return nil
	}
	return s.reqs[len(s.reqs)-1]
}

func source(timeout time.Duration) *corev3.ConfigSource {
	return &corev3.ConfigSource{InitialFetchTimeout: durationpb.New(timeout),
		ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
			ApiType: corev3.ApiConfigSource_GRPC, GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "sds-grpc"}}}}}}}
}

func certSecret(t *testing.T, name string) *tlsv3.Secret {
	t.Helper()
	a, err := ca.NewSelfSigned(time.Now())
	require.NoError(t, err)
	c, err := a.IssueServing([]string{"x.example"}, time.Hour, time.Now())
	require.NoError(t, err)
	key, err := ca.PEMKey(c.PrivateKey)
	require.NoError(t, err)
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: ca.PEMCert(c.Certificate[0])}},
		PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: key}},
	}}}
}

// TestStreamSecretsAckNack: the client asks for its secret by name, ACKs a good one with
// its version, NACKs a broken one (naming the reason, never the key) keeping the previous
// version and value, and takes the next good one.
func TestStreamSecretsAckNack(t *testing.T) {
	srv, path := startServer(t)
	// The secret exists before the proxy asks, as the agent's SDS server answers only once
	// it has the certificate: go-control-plane's linear cache answers a name it does not
	// hold with an empty response, which Envoy rejects ("Missing SDS resources") and which
	// ends the initial fetch without a value.
	good := certSecret(t, "default")
	require.NoError(t, srv.cache.UpdateResource("default", good))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := NewManager(ctx, slog.New(slog.DiscardHandler), &corev3.Node{Id: "n"}, unixClusters{path})
	p, err := m.Provider(&tlsv3.SdsSecretConfig{Name: "default", SdsConfig: source(0)})
	require.NoError(t, err)
	same, err := m.Provider(&tlsv3.SdsSecretConfig{Name: "default", SdsConfig: source(0)})
	require.NoError(t, err)
	assert.Same(t, p, same, "one subscription per name and source")

	require.Eventually(t, p.Done, 5*time.Second, 10*time.Millisecond)
	require.NotNil(t, p.Current().Cert)
	v1 := p.Current().Version
	require.Eventually(t, func() bool { r := srv.last(); return r != nil && r.GetVersionInfo() == v1 && r.GetErrorDetail() == nil },
		5*time.Second, 10*time.Millisecond, "ACK of %s", v1)
	first := srv.last()
	assert.Equal(t, []string{"default"}, first.GetResourceNames())

	bad := certSecret(t, "default")
	bad.GetTlsCertificate().PrivateKey = &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}}
	require.NoError(t, srv.cache.UpdateResource("default", bad))
	require.Eventually(t, func() bool { r := srv.last(); return r.GetErrorDetail() != nil }, 5*time.Second, 10*time.Millisecond)
	nack := srv.last()
	assert.Equal(t, v1, nack.GetVersionInfo(), "a NACK names the last accepted version")
	assert.Contains(t, nack.GetErrorDetail().GetMessage(), "failed to load certificate chain and private key")
	assert.NotContains(t, nack.GetErrorDetail().GetMessage(), "AAAA")
	assert.Equal(t, v1, p.Current().Version, "the previous secret stays")

	require.NoError(t, srv.cache.UpdateResource("default", certSecret(t, "default")))
	require.Eventually(t, func() bool { return p.Current().Version != v1 }, 5*time.Second, 10*time.Millisecond)
}

// TestInitialFetchTimeout: a secret that never arrives ends its provider's
// initialization after initial_fetch_timeout (what stops warming), with no value.
func TestInitialFetchTimeout(t *testing.T) {
	_, path := startServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := NewManager(ctx, slog.New(slog.DiscardHandler), &corev3.Node{Id: "n"}, unixClusters{path})
	p, err := m.Provider(&tlsv3.SdsSecretConfig{Name: "never", SdsConfig: source(200 * time.Millisecond)})
	require.NoError(t, err)
	done := make(chan struct{})
	p.OnDone(func() { close(done) })
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("initial fetch timeout did not end the wait")
	}
	assert.Nil(t, p.Current())
}

// TestFirstUpdateRejected: a broken first secret is NACKed and ends the wait with no
// value, as Envoy's SdsApi readies its init target on a rejected update.
func TestFirstUpdateRejected(t *testing.T) {
	srv, path := startServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := NewManager(ctx, slog.New(slog.DiscardHandler), &corev3.Node{Id: "n"}, unixClusters{path})
	bad := certSecret(t, "default")
	bad.GetTlsCertificate().CertificateChain = &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "not PEM"}}
	require.NoError(t, srv.cache.UpdateResource("default", bad))
	p, err := m.Provider(&tlsv3.SdsSecretConfig{Name: "default", SdsConfig: source(0)})
	require.NoError(t, err)
	require.Eventually(t, p.Done, 5*time.Second, 10*time.Millisecond)
	assert.Nil(t, p.Current())
	assert.NotNil(t, srv.last().GetErrorDetail())
}

// TestProviderErrors: what Envoy refuses is refused with the reason.
func TestProviderErrors(t *testing.T) {
	m := NewManager(context.Background(), slog.New(slog.DiscardHandler), nil, unixClusters{})
	_, err := m.Provider(&tlsv3.SdsSecretConfig{Name: "x"})
	assert.ErrorContains(t, err, "static secret x is not defined")
	src := source(0)
	src.GetApiConfigSource().GetGrpcServices()[0].GetEnvoyGrpc().ClusterName = "dynamic"
	_, err = m.Provider(&tlsv3.SdsSecretConfig{Name: "x", SdsConfig: src})
	assert.ErrorContains(t, err, `envoy_grpc cluster "dynamic" is not a static cluster`)
	src = source(0)
	src.GetApiConfigSource().ApiType = corev3.ApiConfigSource_REST
	_, err = m.Provider(&tlsv3.SdsSecretConfig{Name: "x", SdsConfig: src})
	assert.ErrorContains(t, err, "api_type REST is not supported")
	require.NoError(t, m.AddStatic(certSecret(t, "static")))
	assert.ErrorContains(t, m.AddStatic(certSecret(t, "static")), "duplicate")
	p, err := m.Provider(&tlsv3.SdsSecretConfig{Name: "static"})
	require.NoError(t, err)
	assert.True(t, p.Done())
}
