// Package testca is an in-test stand-in for discovery's CA: Istio's certificate API
// (IstioCertificateService/CreateCertificate) over real TLS on 127.0.0.1, callers known
// by their bearer token, certificates signed for the caller's identity. The real CA is
// discovery's (controlplane), tested there; this one lets the agent's tests control
// lifetimes and failures.
package testca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/wasmesh/wasmesh/agent/csr"
)

// ServerName is the name on the CA's serving certificate (Istio's istiod SAN).
const ServerName = "istiod.istio-system.svc"

// Call is what the CA saw of one request.
type Call struct {
	Token      string
	CSR        *x509.CertificateRequest
	ClientCert *x509.Certificate
	Validity   time.Duration
}

// CA is a running test CA.
type CA struct {
	// Addr is where it listens; RootFile holds its root (PEM), to trust it with.
	Addr     string
	RootFile string
	RootPEM  []byte
	root     *x509.Certificate
	key      *ecdsa.PrivateKey

	mu       sync.Mutex
	tokens   map[string]string // token → SPIFFE id
	lifetime time.Duration
	failures []error
	calls    []Call
}

// Start runs a CA until the test ends; lifetime is that of the certificates it signs.
func Start(t testing.TB, lifetime time.Duration) *CA {
	t.Helper()
	root, key := newRoot(t)
	ca := &CA{root: root, key: key, tokens: map[string]string{}, lifetime: lifetime}
	ca.RootPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw})
	ca.RootFile = filepath.Join(t.TempDir(), "root-cert.pem")
	require.NoError(t, os.WriteFile(ca.RootFile, ca.RootPEM, 0o644))

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ca.Addr = l.Addr().String()
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.ServingCert(t)},
		ClientAuth:   tls.RequestClientCert,
	})))
	securityapi.RegisterIstioCertificateServiceServer(srv, &service{ca: ca})
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return ca
}

// Allow lets the bearer of token ask for the identity of namespace/sa; it returns the
// path of a file holding the token.
func (ca *CA) Allow(t testing.TB, token, trustDomain, namespace, sa string) string {
	ca.mu.Lock()
	ca.tokens[token] = "spiffe://" + trustDomain + "/ns/" + namespace + "/sa/" + sa
	ca.mu.Unlock()
	f := filepath.Join(t.TempDir(), "istio-token")
	require.NoError(t, os.WriteFile(f, []byte(token+"\n"), 0o600))
	return f
}

// FailNext makes the next calls fail with these errors, in order.
func (ca *CA) FailNext(errs ...error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	ca.failures = append(ca.failures, errs...)
}

// SetLifetime changes the lifetime of the certificates signed from now on.
func (ca *CA) SetLifetime(d time.Duration) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	ca.lifetime = d
}

// Calls is every request so far, failed ones included.
func (ca *CA) Calls() []Call {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return append([]Call(nil), ca.calls...)
}

// Roots is a pool of the CA's root.
func (ca *CA) Roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.root)
	return p
}

type service struct {
	securityapi.UnimplementedIstioCertificateServiceServer
	ca *CA
}

func (s *service) CreateCertificate(ctx context.Context, req *securityapi.IstioCertificateRequest) (*securityapi.IstioCertificateResponse, error) {
	ca := s.ca
	call := Call{Validity: time.Duration(req.GetValidityDuration()) * time.Second}
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) == 1 {
		call.Token, _ = strings.CutPrefix(v[0], "Bearer ")
	}
	if ti, ok := peerTLS(ctx); ok && len(ti.State.PeerCertificates) > 0 {
		call.ClientCert = ti.State.PeerCertificates[0]
	}
	if b, _ := pem.Decode([]byte(req.GetCsr())); b != nil {
		call.CSR, _ = x509.ParseCertificateRequest(b.Bytes)
	}
	ca.mu.Lock()
	ca.calls = append(ca.calls, call)
	id, known := ca.tokens[call.Token]
	lifetime := ca.lifetime
	var fail error
	if len(ca.failures) > 0 {
		fail, ca.failures = ca.failures[0], ca.failures[1:]
	}
	ca.mu.Unlock()
	switch {
	case fail != nil:
		return nil, fail
	case !known:
		return nil, status.Error(codes.Unauthenticated, "unknown token")
	case call.CSR == nil:
		return nil, status.Error(codes.InvalidArgument, "no CSR")
	}
	u, _ := url.Parse(id)
	leaf := ca.sign(call.CSR, u, lifetime)
	return &securityapi.IstioCertificateResponse{CertChain: []string{leaf, string(ca.RootPEM)}}, nil
}

// sign issues a certificate for the caller's identity, whatever the CSR asks.
func (ca *CA) sign(req *x509.CertificateRequest, id *url.URL, lifetime time.Duration) string {
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), NotBefore: now.Add(-time.Second), NotAfter: now.Add(lifetime),
		URIs: []*url.URL{id}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.root, req.PublicKey, ca.key)
	if err != nil {
		panic(err) // a test CA's own template is wrong
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// ServingCert is a certificate for ServerName and 127.0.0.1 signed by the CA's root, as
// discovery's TLS port presents.
func (ca *CA) ServingCert(t testing.TB) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: ServerName},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{ServerName}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.root, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func newRoot(t testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{Organization: []string{"wasmesh test CA"}},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	root, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return root, key
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	return n
}

func peerTLS(ctx context.Context) (credentials.TLSInfo, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return credentials.TLSInfo{}, false
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	return ti, ok
}

// Issue makes a key and a certificate for the SPIFFE id directly, as files mounted by
// an operator would hold them (PEM chain, PEM key).
func (ca *CA) Issue(t testing.TB, id string, lifetime time.Duration) (chain, key []byte) {
	t.Helper()
	u, err := url.Parse(id)
	require.NoError(t, err)
	req, err := csr.New(csr.ECDSA, u)
	require.NoError(t, err)
	parsed, err := csr.Parse(req.CSR)
	require.NoError(t, err)
	return []byte(ca.sign(parsed, u, lifetime)), req.Key
}
