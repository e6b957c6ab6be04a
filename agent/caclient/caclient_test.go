package caclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmesh/wasmesh/agent/csr"
	"github.com/wasmesh/wasmesh/agent/internal/testca"
)

// The CA here is the agent's test stand-in (internal/testca) speaking Istio's API over
// real TLS; discovery's real CA is tested in controlplane.

func request(t *testing.T, ns, sa string) *csr.Request {
	id, err := csr.SPIFFEID("cluster.local", ns, sa)
	require.NoError(t, err)
	r, err := csr.New(csr.ECDSA, id)
	require.NoError(t, err)
	return r
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestSignReturnsTheChainForTheCallersIdentity(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	token := ca.Allow(t, "reviews-token", "cluster.local", "default", "reviews")
	c, err := New(Config{Address: ca.Addr, RootFile: ca.RootFile, ServerName: testca.ServerName, TokenFile: token})
	require.NoError(t, err)
	defer c.Close()

	chain, err := c.Sign(ctx(t), request(t, "default", "reviews").CSR, 12*time.Hour)
	require.NoError(t, err)
	require.Len(t, chain, 2, "leaf first, root last")
	assert.Equal(t, string(ca.RootPEM), chain[1])
	b, _ := pem.Decode([]byte(chain[0]))
	leaf, err := x509.ParseCertificate(b.Bytes)
	require.NoError(t, err)
	assert.Equal(t, "spiffe://cluster.local/ns/default/sa/reviews", leaf.URIs[0].String())

	calls := ca.Calls()
	require.Len(t, calls, 1)
	assert.Equal(t, "reviews-token", calls[0].Token, "sent as authorization: Bearer <token>, trimmed")
	assert.Equal(t, 12*time.Hour, calls[0].Validity)
	assert.Nil(t, calls[0].ClientCert, "no certificate yet, none presented")
}

func TestRenewalPresentsTheCurrentCertificate(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	token := ca.Allow(t, "tok", "cluster.local", "default", "reviews")
	r := request(t, "default", "reviews")
	first, err := New(Config{Address: ca.Addr, RootFile: ca.RootFile, ServerName: testca.ServerName, TokenFile: token})
	require.NoError(t, err)
	chain, err := first.Sign(ctx(t), r.CSR, time.Hour)
	require.NoError(t, err)
	first.Close()
	cert, err := tls.X509KeyPair([]byte(chain[0]), r.Key)
	require.NoError(t, err)

	c, err := New(Config{Address: ca.Addr, RootFile: ca.RootFile, ServerName: testca.ServerName, TokenFile: token,
		ClientCertificate: func() *tls.Certificate { return &cert }})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Sign(ctx(t), request(t, "default", "reviews").CSR, time.Hour)
	require.NoError(t, err)
	calls := ca.Calls()
	require.Len(t, calls, 2)
	require.NotNil(t, calls[1].ClientCert)
	assert.Equal(t, "spiffe://cluster.local/ns/default/sa/reviews", calls[1].ClientCert.URIs[0].String())
}

func TestRefusalKeepsTheStatus(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	token := ca.Allow(t, "tok", "cluster.local", "default", "reviews")
	ca.FailNext(status.Error(codes.PermissionDenied, "identity mismatch"))
	c, err := New(Config{Address: ca.Addr, RootFile: ca.RootFile, ServerName: testca.ServerName, TokenFile: token})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Sign(ctx(t), request(t, "default", "reviews").CSR, time.Hour)
	require.Error(t, err)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.ErrorContains(t, err, ca.Addr)
}

func TestTheCAMustBeTrusted(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	other := testca.Start(t, time.Hour)
	token := ca.Allow(t, "tok", "cluster.local", "default", "reviews")
	for name, cfg := range map[string]Config{
		"another root":  {Address: ca.Addr, RootFile: other.RootFile, ServerName: testca.ServerName, TokenFile: token},
		"another name":  {Address: ca.Addr, RootFile: ca.RootFile, ServerName: "evil.example", TokenFile: token},
		"missing root":  {Address: ca.Addr, RootFile: filepath.Join(t.TempDir(), "none.pem"), TokenFile: token},
		"missing token": {Address: ca.Addr, RootFile: ca.RootFile, TokenFile: filepath.Join(t.TempDir(), "none")},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := New(cfg)
			require.NoError(t, err)
			defer c.Close()
			_, err = c.Sign(ctx(t), request(t, "default", "reviews").CSR, time.Hour)
			require.Error(t, err)
			assert.Empty(t, ca.Calls(), "nothing reached the CA")
		})
	}
	// By IP, the name defaults to the address host (the test CA's certificate has 127.0.0.1).
	c, err := New(Config{Address: ca.Addr, RootFile: ca.RootFile, TokenFile: token})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Sign(ctx(t), request(t, "default", "reviews").CSR, time.Hour)
	require.NoError(t, err)
}

func TestConfigErrorsAreNamed(t *testing.T) {
	_, err := New(Config{Address: "nohost", RootFile: "r", TokenFile: "t"})
	assert.ErrorContains(t, err, `CA address "nohost"`)
	_, err = New(Config{Address: "h:1", RootFile: "r"})
	assert.ErrorContains(t, err, "no token file")
	_, err = New(Config{Address: "h:1", TokenFile: "t"})
	assert.ErrorContains(t, err, "CA_ROOT_CA")
	empty := filepath.Join(t.TempDir(), "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	_, err = tokenFile(empty).GetRequestMetadata(context.Background())
	assert.ErrorContains(t, err, "is empty")
	_, err = LoadRoots(empty)
	assert.ErrorContains(t, err, "no PEM certificate")
}
