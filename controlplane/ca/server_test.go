package ca

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	"k8s.io/client-go/kubernetes"

	"github.com/wasmesh/wasmesh/controlplane/ca/catest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testServer is the certificate service over real gRPC and TLS on loopback.
type testServer struct {
	*Server
	addr  string
	ca    *Authority
	local ed25519.PrivateKey
	reg   *prometheus.Registry
}

// serve starts the certificate service for authority, checking local-mesh credentials of a
// fresh key and, with kube, service-account tokens.
func serve(t testing.TB, authority *Authority, kube kubernetes.Interface) *testServer {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	s, err := NewServer(ServerOptions{CA: func() *Authority { return authority }, Kube: kube, LocalKey: pub, Registerer: reg, Log: quiet})
	require.NoError(t, err)
	cert, err := authority.IssueServing([]string{"istiod.istio-system.svc", "127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{*cert},
		ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12})))
	s.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return &testServer{Server: s, addr: lis.Addr().String(), ca: authority, local: priv, reg: reg}
}

// client dials the service trusting the CA's roots, presenting clientCert when given.
func (ts *testServer) client(t testing.TB, clientCert *tls.Certificate) securityv1alpha1.IstioCertificateServiceClient {
	return catest.Client(t, ts.addr, ts.ca.Roots(), clientCert)
}

// credential is a local-mesh credential of ns/sa valid for ttl.
func (ts *testServer) credential(t testing.TB, ns, sa string, ttl time.Duration) string {
	t.Helper()
	c, err := MintCredential(ts.local, ns, sa, time.Now().Add(ttl))
	require.NoError(t, err)
	return c
}

var newCSR, withToken = catest.NewCSR, catest.WithToken

// verifyChain checks Istio's answer: the leaf, the chain, the roots last; the leaf chains to
// the roots and names id alone.
func verifyChain(t testing.TB, resp *securityv1alpha1.IstioCertificateResponse, roots []byte, id string) *x509.Certificate {
	t.Helper()
	leaf := catest.Leaf(t, resp, roots)
	require.Len(t, leaf.URIs, 1)
	assert.Equal(t, id, leaf.URIs[0].String())
	return leaf
}

func requireCode(t testing.TB, err error, code codes.Code, contains ...string) {
	t.Helper()
	require.Error(t, err)
	assert.Equal(t, code, status.Code(err), "%v", err)
	for _, c := range contains {
		assert.Contains(t, status.Convert(err).Message(), c)
	}
}

const (
	idA = "spiffe://cluster.local/ns/a/sa/alpha"
	idB = "spiffe://cluster.local/ns/b/sa/beta"
)

// A local-mesh credential of pod A gets A's certificate, chained to the root, for the
// lifetime asked (cut at 90 days); it cannot get B's identity (refused and counted); an
// expired or forged credential, or none, is refused Unauthenticated.
func TestLocalCredentialGetsItsOwnIdentityOnly(t *testing.T) {
	root, err := NewSelfSigned(time.Now())
	require.NoError(t, err)
	ts := serve(t, root, nil)
	c := ts.client(t, nil)
	ctx := context.Background()
	credA := ts.credential(t, "a", "alpha", time.Hour)

	_, csr := newCSR(t, idA)
	resp, err := c.CreateCertificate(withToken(ctx, credA), &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
	require.NoError(t, err)
	leaf := verifyChain(t, resp, root.RootPEM, idA)
	assert.InDelta(t, time.Hour.Seconds(), leaf.NotAfter.Sub(leaf.NotBefore).Seconds()-time.Minute.Seconds(), 5)

	_, csr = newCSR(t) // no SAN: the caller's identity
	resp, err = c.CreateCertificate(withToken(ctx, credA), &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: int64(365 * 24 * 3600)})
	require.NoError(t, err)
	leaf = verifyChain(t, resp, root.RootPEM, idA)
	assert.WithinDuration(t, time.Now().Add(MaxWorkloadTTL), leaf.NotAfter, time.Minute, "cut to the maximum")

	_, csr = newCSR(t, idB)
	_, err = c.CreateCertificate(withToken(ctx, credA), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.PermissionDenied, idA, idB)
	assert.Equal(t, 1.0, testutil.ToFloat64(ts.metrics.signErr.WithLabelValues("identity_mismatch")))
	_, csr = newCSR(t, idA, idB)
	_, err = c.CreateCertificate(withToken(ctx, credA), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.PermissionDenied, idB)

	_, csr = newCSR(t, idA)
	expired := ts.credential(t, "a", "alpha", -time.Second)
	_, err = c.CreateCertificate(withToken(ctx, expired), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.Unauthenticated, "expired")
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	forged, err := MintCredential(otherKey, "b", "beta", time.Now().Add(time.Hour))
	require.NoError(t, err)
	_, err = c.CreateCertificate(withToken(ctx, forged), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.Unauthenticated, "signature")
	_, err = c.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.Unauthenticated, "no bearer token")
	_, err = c.CreateCertificate(withToken(ctx, "eyJhbGciOi.not.ajwt"), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.Unauthenticated, "no Kubernetes")
	assert.Equal(t, 4.0, testutil.ToFloat64(ts.metrics.authnFailure))

	_, err = c.CreateCertificate(withToken(ctx, credA), &securityv1alpha1.IstioCertificateRequest{Csr: "not a csr"})
	requireCode(t, err, codes.InvalidArgument, "CERTIFICATE REQUEST")
	assert.Equal(t, 1.0, testutil.ToFloat64(ts.metrics.csrParsing))
	assert.Equal(t, 2.0, testutil.ToFloat64(ts.metrics.success))
	assert.Equal(t, 9.0, testutil.ToFloat64(ts.metrics.csr))
	assert.InDelta(t, float64(root.Cert.NotAfter.Unix()), ts.rootExpiry(), 1)
	n, err := testutil.GatherAndCount(ts.reg, "citadel_server_root_cert_expiry_timestamp", "citadel_server_csr_count")
	require.NoError(t, err)
	assert.Equal(t, 2, n)
}

// A caller holding a valid workload certificate renews for its own identity without a token;
// a certificate of another CA is not an identity.
func TestWorkloadCertificateRenewsItsOwnIdentity(t *testing.T) {
	root, err := NewSelfSigned(time.Now())
	require.NoError(t, err)
	ts := serve(t, root, nil)
	ctx := context.Background()
	key, csr := newCSR(t, idA)
	resp, err := ts.client(t, nil).CreateCertificate(withToken(ctx, ts.credential(t, "a", "alpha", time.Hour)),
		&securityv1alpha1.IstioCertificateRequest{Csr: csr})
	require.NoError(t, err)
	leaf := verifyChain(t, resp, root.RootPEM, idA)
	held := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key}

	renewing := ts.client(t, held)
	_, csr = newCSR(t, idA)
	resp, err = renewing.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	require.NoError(t, err)
	verifyChain(t, resp, root.RootPEM, idA)
	_, csr = newCSR(t, idB)
	_, err = renewing.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.PermissionDenied, idA, idB)

	other, err := NewSelfSigned(time.Now())
	require.NoError(t, err)
	foreignPEM, err := other.SignWorkload(&key.PublicKey, leaf.URIs[0], time.Hour, time.Now())
	require.NoError(t, err)
	foreign, _ := pem.Decode(foreignPEM)
	_, csr = newCSR(t, idA)
	_, err = ts.client(t, &tls.Certificate{Certificate: [][]byte{foreign.Bytes}, PrivateKey: key}).
		CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.Unauthenticated, "not a valid certificate of this mesh")

	// An expired certificate of this CA renews nothing.
	expiredPEM, err := root.SignWorkload(&key.PublicKey, leaf.URIs[0], time.Hour, time.Now().Add(-2*time.Hour))
	require.NoError(t, err)
	expired, _ := pem.Decode(expiredPEM)
	_, err = ts.client(t, &tls.Certificate{Certificate: [][]byte{expired.Bytes}, PrivateKey: key}).
		CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.Unauthenticated, "expired")

	// Signed by this CA, but for another trust domain: no identity here.
	foreignTD, err := url.Parse("spiffe://other.domain/ns/a/sa/alpha")
	require.NoError(t, err)
	otherPEM, err := root.SignWorkload(&key.PublicKey, foreignTD, time.Hour, time.Now())
	require.NoError(t, err)
	otherDomain, _ := pem.Decode(otherPEM)
	_, err = ts.client(t, &tls.Certificate{Certificate: [][]byte{otherDomain.Bytes}, PrivateKey: key}).
		CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.Unauthenticated, `"spiffe://other.domain/ns/a/sa/alpha" is not spiffe://cluster.local/ns/<namespace>/sa/<service account>`)
	assert.Equal(t, 1.0, testutil.ToFloat64(ts.metrics.idExtraction))
}

// BenchmarkCreateCertificate: certificates issued per second over gRPC and TLS (a
// connection reused, a local-mesh credential, an ECDSA P-256 CSR made beforehand), and the
// CPU each costs in the process (client and server together).
func BenchmarkCreateCertificate(b *testing.B) {
	root, err := NewSelfSigned(time.Now())
	require.NoError(b, err)
	ts := serve(b, root, nil)
	c := ts.client(b, nil)
	ctx := withToken(context.Background(), ts.credential(b, "a", "alpha", time.Hour))
	_, csr := newCSR(b, idA)
	req := &securityv1alpha1.IstioCertificateRequest{Csr: csr}
	_, err = c.CreateCertificate(ctx, req)
	require.NoError(b, err)
	cpu0 := processCPU()
	start := time.Now()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.CreateCertificate(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "certs/s")
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/cert")
}

// processCPU is the user and system CPU of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano()) + time.Duration(ru.Stime.Nano())
}

// BenchmarkCertificatesFor2000Workloads: 2000 workloads, each with its own credential, key
// and TLS connection (a handshake each), ask for their certificates, 50 at a time: the time
// and the CPU (client and server in this process) for all 2000.
func BenchmarkCertificatesFor2000Workloads(b *testing.B) {
	const workloads, concurrency = 2000, 50
	root, err := NewSelfSigned(time.Now())
	require.NoError(b, err)
	ts := serve(b, root, nil)
	type workload struct{ cred, csr string }
	all := make([]workload, workloads)
	for i := range all {
		sa := fmt.Sprintf("sa-%d", i)
		_, csr := newCSR(b, "spiffe://cluster.local/ns/bench/sa/"+sa)
		all[i] = workload{cred: ts.credential(b, "bench", sa, time.Hour), csr: csr}
	}
	var elapsed, cpu time.Duration
	for b.Loop() {
		cpu0, start := processCPU(), time.Now()
		work := make(chan workload)
		var wg sync.WaitGroup
		for range concurrency {
			wg.Go(func() {
				for w := range work {
					cfg := &tls.Config{RootCAs: root.Roots(), ServerName: "istiod.istio-system.svc", MinVersion: tls.VersionTLS12}
					conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
					if err == nil {
						_, err = securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(withToken(context.Background(), w.cred),
							&securityv1alpha1.IstioCertificateRequest{Csr: w.csr})
						conn.Close()
					}
					if err != nil {
						b.Error(err)
					}
				}
			})
		}
		for _, w := range all {
			work <- w
		}
		close(work)
		wg.Wait()
		elapsed += time.Since(start)
		cpu += processCPU() - cpu0
	}
	b.ReportMetric(elapsed.Seconds()/float64(b.N), "s/2000-workloads")
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/2000-workloads")
	b.ReportMetric(float64(workloads*b.N)/elapsed.Seconds(), "certs/s")
}
