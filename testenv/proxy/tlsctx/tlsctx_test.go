package tlsctx

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmesh/wasmesh/controlplane/ca"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

type peer struct {
	chain, key []byte
	der        []byte
}

func inline(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}

func issue(t testing.TB, a *ca.Authority, sa string) peer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	id, _ := url.Parse("spiffe://cluster.local/ns/default/sa/" + sa)
	chain, err := a.SignWorkload(&k.PublicKey, id, time.Hour, time.Now())
	require.NoError(t, err)
	key, err := ca.PEMKey(k)
	require.NoError(t, err)
	c, err := tlsCertDER(chain)
	require.NoError(t, err)
	return peer{chain: chain, key: key, der: c}
}

func tlsCertDER(chain []byte) ([]byte, error) {
	blk, _ := pem.Decode(chain)
	if blk == nil {
		return nil, errors.New("no PEM block")
	}
	return blk.Bytes, nil
}

func commonCtx(p peer, roots []byte, alpn []string, vc *tlsv3.CertificateValidationContext) *tlsv3.CommonTlsContext {
	if vc == nil {
		vc = &tlsv3.CertificateValidationContext{}
	}
	vc.TrustedCa = inline(roots)
	return &tlsv3.CommonTlsContext{AlpnProtocols: alpn,
		TlsCertificates:       []*tlsv3.TlsCertificate{{CertificateChain: inline(p.chain), PrivateKey: inline(p.key)}},
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: vc}}
}

func rootsOf(a *ca.Authority) []byte {
	var out []byte
	for _, p := range a.ChainPEMs() {
		out = append(out, p...)
	}
	return out
}

// handshake runs both sides over a pipe and returns what each side reported.
func handshake(t testing.TB, srv *Server, cl *Client) (sErr, cErr error, sInfo, cInfo *streaminfo.TLS) {
	t.Helper()
	a, b := tcpPair(t)
	defer a.Close()
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var tc interface{ Close() error }
		tc, sInfo, sErr = srvHandshake(ctx, srv, a)
		if tc != nil {
			_ = tc.Close()
		}
		if sErr != nil {
			_ = a.Close()
		}
	}()
	tc, ci, err := cl.Handshake(ctx, b)
	cErr, cInfo = err, ci
	if err != nil {
		_ = b.Close()
	} else {
		// TLS 1.3: the server's verdict on the client certificate comes after the client's
		// handshake; read to see it.
		_ = tc.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, _ = tc.Read(make([]byte, 1))
		_ = tc.Close()
	}
	<-done
	return sErr, cErr, sInfo, cInfo
}

// tcpPair is a loopback TCP connection (buffered, unlike net.Pipe, so that a side may
// send its alert while the other is still writing).
func tcpPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer lis.Close()
	b, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	a, err := lis.Accept()
	require.NoError(t, err)
	return a, b
}

func srvHandshake(ctx context.Context, s *Server, c net.Conn) (interface{ Close() error }, *streaminfo.TLS, error) {
	tc, info, err := s.Handshake(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	return tc, info, nil
}

func count(st *stats.Store, name string) uint64 { return st.Counter(name).Value() }

func TestHandshakeParamsStatsAndInfo(t *testing.T) {
	a, err := ca.NewSelfSigned(time.Now())
	require.NoError(t, err)
	roots := rootsOf(a)
	sp, cp := issue(t, a, "server"), issue(t, a, "client")
	store := stats.NewStore(nil, nil)
	srv, err := NewServer(&tlsv3.DownstreamTlsContext{RequireClientCertificate: wrapperspb.Bool(true),
		CommonTlsContext: commonCtx(sp, roots, []string{"h2", "http/1.1"}, &tlsv3.CertificateValidationContext{
			MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{SanType: tlsv3.SubjectAltNameMatcher_URI,
				Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://cluster.local/"}}}}})},
		nil, store.Scope("listener.in.ssl"))
	require.NoError(t, err)
	cc := commonCtx(cp, roots, []string{"istio", "http/1.1"}, nil)
	cc.TlsParams = &tlsv3.TlsParameters{CipherSuites: []string{"[ECDHE-ECDSA-AES128-GCM-SHA256|ECDHE-ECDSA-CHACHA20-POLY1305]"}}
	cl, err := NewClient(&tlsv3.UpstreamTlsContext{Sni: "svc.example", CommonTlsContext: cc}, nil, store.Scope("cluster.out.ssl"))
	require.NoError(t, err)

	sErr, cErr, sInfo, cInfo := handshake(t, srv, cl)
	require.NoError(t, sErr)
	require.NoError(t, cErr)
	assert.Equal(t, "TLSv1.2", cInfo.Version, "Envoy's clients stop at TLS 1.2 unless told otherwise")
	assert.Equal(t, "ECDHE-ECDSA-AES128-GCM-SHA256", cInfo.Cipher)
	assert.Equal(t, "http/1.1", sInfo.ALPN)
	assert.Equal(t, "svc.example", sInfo.SNI)
	assert.Equal(t, []string{"spiffe://cluster.local/ns/default/sa/client"}, sInfo.PeerURISANs)
	assert.Equal(t, []string{"spiffe://cluster.local/ns/default/sa/server"}, sInfo.LocalURISANs)
	assert.Equal(t, "spiffe://cluster.local/ns/default/sa/client", sInfo.PeerPrincipal())
	assert.Equal(t, uint64(1), count(store, "listener.in.ssl.handshake"))
	assert.Equal(t, uint64(1), count(store, "listener.in.ssl.versions.TLSv1_2"))
	assert.Equal(t, uint64(1), count(store, "listener.in.ssl.ciphers.ECDHE-ECDSA-AES128-GCM-SHA256"))
	assert.Equal(t, uint64(1), count(store, "cluster.out.ssl.handshake"))

	// A server that shares no ALPN protocol with the client goes on without ALPN, as
	// BoringSSL does.
	cc2 := commonCtx(cp, roots, []string{"istio-peer-exchange", "istio"}, nil)
	cl2, err := NewClient(&tlsv3.UpstreamTlsContext{CommonTlsContext: cc2}, nil, store.Scope("cluster.other.ssl"))
	require.NoError(t, err)
	sErr, cErr, sInfo, _ = handshake(t, srv, cl2)
	require.NoError(t, sErr)
	require.NoError(t, cErr)
	assert.Equal(t, "", sInfo.ALPN)
}

func TestVerificationFailuresCounted(t *testing.T) {
	a, err := ca.NewSelfSigned(time.Now())
	require.NoError(t, err)
	roots := rootsOf(a)
	sp, cp := issue(t, a, "server"), issue(t, a, "client")
	store := stats.NewStore(nil, nil)
	cl, err := NewClient(&tlsv3.UpstreamTlsContext{CommonTlsContext: commonCtx(cp, roots, nil, nil)}, nil, store.Scope("cluster.c.ssl"))
	require.NoError(t, err)

	sum := sha256.Sum256(cp.der)
	other := sha256.Sum256(sp.der)
	for _, tc := range []struct {
		name, stat string
		vc         *tlsv3.CertificateValidationContext
	}{
		{"hash", "fail_verify_cert_hash", &tlsv3.CertificateValidationContext{VerifyCertificateHash: []string{hex.EncodeToString(other[:])}}},
		{"san", "fail_verify_san", &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{
			SanType: tlsv3.SubjectAltNameMatcher_URI, Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "spiffe://x"}}}}}},
		{"legacy-san", "fail_verify_san", &tlsv3.CertificateValidationContext{MatchSubjectAltNames: []*matcherv3.StringMatcher{ //nolint:staticcheck // the deprecated field
			{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "spiffe://cluster.local/ns/default/sa/server"}}}}},
	} {
		sc := store.Scope("listener." + tc.name + ".ssl")
		srv, err := NewServer(&tlsv3.DownstreamTlsContext{CommonTlsContext: commonCtx(sp, roots, nil, tc.vc)}, nil, sc)
		require.NoError(t, err)
		sErr, _, _, _ := handshake(t, srv, cl)
		assert.Error(t, sErr, tc.name)
		assert.Equal(t, uint64(1), count(store, "listener."+tc.name+".ssl."+tc.stat), tc.name)
		assert.Equal(t, uint64(1), count(store, "listener."+tc.name+".ssl.connection_error"), tc.name)
	}
	// The right hash (with colons, as Envoy accepts it) passes.
	colons := ""
	for i, b := range sum {
		if i > 0 {
			colons += ":"
		}
		colons += hex.EncodeToString([]byte{b})
	}
	srv, err := NewServer(&tlsv3.DownstreamTlsContext{CommonTlsContext: commonCtx(sp, roots, nil,
		&tlsv3.CertificateValidationContext{VerifyCertificateHash: []string{colons}, MatchSubjectAltNames: []*matcherv3.StringMatcher{ //nolint:staticcheck // the deprecated field
			{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: "/sa/client"}}}})}, nil, store.Scope("listener.ok.ssl"))
	require.NoError(t, err)
	sErr, cErr, _, _ := handshake(t, srv, cl)
	require.NoError(t, sErr)
	require.NoError(t, cErr)
}

func TestContextErrors(t *testing.T) {
	a, err := ca.NewSelfSigned(time.Now())
	require.NoError(t, err)
	sp := issue(t, a, "server")
	sc := stats.NewStore(nil, nil).Scope("x")
	_, err = NewServer(&tlsv3.DownstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{}}, nil, sc)
	assert.ErrorContains(t, err, "No TLS certificates found for server context")
	c := commonCtx(sp, rootsOf(a), nil, nil)
	c.TlsParams = &tlsv3.TlsParameters{CipherSuites: []string{"NOT-A-CIPHER"}}
	_, err = NewServer(&tlsv3.DownstreamTlsContext{CommonTlsContext: c}, nil, sc)
	assert.ErrorContains(t, err, "Failed to initialize cipher suites NOT-A-CIPHER")
	c.TlsParams = &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_3, TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_2}
	_, err = NewServer(&tlsv3.DownstreamTlsContext{CommonTlsContext: c}, nil, sc)
	assert.ErrorContains(t, err, "tls_minimum_protocol_version TLSv1_3 is above tls_maximum_protocol_version TLSv1_2")
	c = commonCtx(sp, rootsOf(a), nil, nil)
	c.GetTlsCertificates()[0].PrivateKey = inline([]byte("junk"))
	_, err = NewServer(&tlsv3.DownstreamTlsContext{CommonTlsContext: c}, nil, sc)
	assert.ErrorContains(t, err, "tls_certificates[0]: failed to load certificate chain and private key")
	c = commonCtx(sp, rootsOf(a), nil, &tlsv3.CertificateValidationContext{VerifyCertificateSpki: []string{"x"}})
	_, err = NewServer(&tlsv3.DownstreamTlsContext{CommonTlsContext: c}, nil, sc)
	assert.ErrorContains(t, err, "validation_context: verify_certificate_spki is not supported")
	c = commonCtx(sp, rootsOf(a), nil, nil)
	c.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
		DefaultValidationContext:         &tlsv3.CertificateValidationContext{TrustChainVerification: tlsv3.CertificateValidationContext_ACCEPT_UNTRUSTED},
		ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: "ROOTCA"}}}
	_, err = NewServer(&tlsv3.DownstreamTlsContext{CommonTlsContext: c}, nil, sc)
	assert.ErrorContains(t, err, "default_validation_context: trust_chain_verification ACCEPT_UNTRUSTED is not supported")
	c = commonCtx(sp, rootsOf(a), nil, nil)
	c.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{{Name: "default"}}
	_, err = NewServer(&tlsv3.DownstreamTlsContext{CommonTlsContext: c}, nil, sc)
	assert.ErrorContains(t, err, "tls_certificate_sds_secret_configs[0]: no secret manager")
}

// BenchmarkMutualHandshake: one mutual TLS handshake (ECDSA P-256, Envoy's client
// default TLS 1.2, chain and SAN verification on the server) between a Client and a
// Server over loopback TCP: the cost of each new mesh connection.
func BenchmarkMutualHandshake(b *testing.B) {
	a, err := ca.NewSelfSigned(time.Now())
	require.NoError(b, err)
	roots := rootsOf(a)
	sp, cp := issue(b, a, "server"), issue(b, a, "client")
	store := stats.NewStore(nil, nil)
	srv, err := NewServer(&tlsv3.DownstreamTlsContext{RequireClientCertificate: wrapperspb.Bool(true),
		CommonTlsContext: commonCtx(sp, roots, nil, &tlsv3.CertificateValidationContext{
			MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{SanType: tlsv3.SubjectAltNameMatcher_URI,
				Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "spiffe://cluster.local/ns/default/sa/client"}}}}})},
		nil, store.Scope("s"))
	require.NoError(b, err)
	cl, err := NewClient(&tlsv3.UpstreamTlsContext{CommonTlsContext: commonCtx(cp, roots, nil, nil)}, nil, store.Scope("c"))
	require.NoError(b, err)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sErr, cErr, _, _ := handshake(b, srv, cl)
		if sErr != nil || cErr != nil {
			b.Fatal(sErr, cErr)
		}
	}
}
