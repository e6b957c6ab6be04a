package hcm

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmesh/wasmesh/controlplane/ca"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
	"github.com/wasmesh/wasmesh/testenv/proxy/tlsctx"
)

// testSecureConn is the server side of a real mutual TLS handshake.
type testSecureConn struct {
	*tls.Conn
	info *streaminfo.TLS
}

func (c *testSecureConn) DownstreamTLS() *streaminfo.TLS { return c.info }
func (c *testSecureConn) PeerChain() []*x509.Certificate { return c.ConnectionState().PeerCertificates }

func workloadCert(t *testing.T, a *ca.Authority, sa string) tls.Certificate {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	id, _ := url.Parse("spiffe://cluster.local/ns/default/sa/" + sa)
	chain, err := a.SignWorkload(&k.PublicKey, id, time.Hour, time.Now())
	require.NoError(t, err)
	key, err := ca.PEMKey(k)
	require.NoError(t, err)
	c, err := tls.X509KeyPair(chain, key)
	require.NoError(t, err)
	return c
}

// mtls runs a mutual TLS handshake on loopback and returns the server's connection.
func mtls(t *testing.T, server, client tls.Certificate) *testSecureConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer lis.Close()
	go func() {
		c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{Certificates: []tls.Certificate{client}, InsecureSkipVerify: true}) //nolint:gosec // test peer
		if err == nil {
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	raw, err := lis.Accept()
	require.NoError(t, err)
	tc := tls.Server(raw, &tls.Config{Certificates: []tls.Certificate{server}, ClientAuth: tls.RequireAnyClientCert})
	require.NoError(t, tc.Handshake())
	t.Cleanup(func() { _ = tc.Close() })
	return &testSecureConn{Conn: tc, info: tlsctx.Info(tc.ConnectionState(), &server)}
}

func TestForwardClientCert(t *testing.T) {
	a, err := ca.NewSelfSigned(time.Now())
	require.NoError(t, err)
	sc := mtls(t, workloadCert(t, a, "server"), workloadCert(t, a, "client"))
	peer := sc.ConnectionState().PeerCertificates[0]
	sum := sha256.Sum256(peer.Raw)
	hash := hex.EncodeToString(sum[:])
	details := &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{Subject: wrapperspb.Bool(true), Uri: true, Dns: true}
	this := "By=spiffe://cluster.local/ns/default/sa/server;Hash=" + hash + `;Subject="";URI=spiffe://cluster.local/ns/default/sa/client`

	for _, tc := range []struct {
		mode      hcmv3.HttpConnectionManager_ForwardClientCertDetails
		plaintext bool
		want      string
	}{
		{mode: hcmv3.HttpConnectionManager_SANITIZE, want: ""},
		{mode: hcmv3.HttpConnectionManager_FORWARD_ONLY, want: "By=earlier"},
		{mode: hcmv3.HttpConnectionManager_FORWARD_ONLY, plaintext: true, want: ""},
		{mode: hcmv3.HttpConnectionManager_APPEND_FORWARD, want: "By=earlier," + this},
		{mode: hcmv3.HttpConnectionManager_APPEND_FORWARD, plaintext: true, want: ""},
		{mode: hcmv3.HttpConnectionManager_SANITIZE_SET, want: this},
		{mode: hcmv3.HttpConnectionManager_ALWAYS_FORWARD_ONLY, plaintext: true, want: "By=earlier"},
	} {
		m := &Manager{proto: &hcmv3.HttpConnectionManager{ForwardClientCertDetails: tc.mode, SetCurrentClientCertDetails: details}}
		r, _ := http.NewRequest("GET", "/", nil)
		r.Header.Set(xfccHeader, "By=earlier")
		var conn SecureConn = sc
		if tc.plaintext {
			conn = nil
		}
		m.forwardClientCert(r, conn)
		assert.Equal(t, tc.want, r.Header.Get(xfccHeader), "%s plaintext=%v", tc.mode, tc.plaintext)
	}

	// Cert and Chain: the peer's PEM, URL-encoded and quoted.
	m := &Manager{proto: &hcmv3.HttpConnectionManager{ForwardClientCertDetails: hcmv3.HttpConnectionManager_SANITIZE_SET,
		SetCurrentClientCertDetails: &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{Cert: true, Chain: true}}}
	r, _ := http.NewRequest("GET", "/", nil)
	m.forwardClientCert(r, sc)
	v := r.Header.Get(xfccHeader)
	require.True(t, strings.HasPrefix(v, "By=spiffe://cluster.local/ns/default/sa/server;Hash="+hash+`;Cert="-----BEGIN%20CERTIFICATE-----%0a`), v)
	i := strings.Index(v, `;Chain="`)
	require.Greater(t, i, 0)
	cert := strings.TrimSuffix(strings.TrimPrefix(v[:i], "By=spiffe://cluster.local/ns/default/sa/server;Hash="+hash+`;Cert="`), `"`)
	dec, err := url.QueryUnescape(cert)
	require.NoError(t, err)
	assert.Equal(t, pemOf(peer), dec)
	assert.NotContains(t, cert, "+")
	assert.NotContains(t, cert, "/")
}
