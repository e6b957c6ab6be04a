package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/wasmesh/wasmesh/controlplane/ca"
)

func generated(t *testing.T, client *fake.Clientset, ttl time.Duration) *GeneratedCerts {
	t.Helper()
	g, err := NewGeneratedCerts(GenerateOptions{Client: client, Namespace: "istio-system", ServiceName: "wasmesh-discovery",
		Hosts: []string{"127.0.0.1"}, TTL: ttl, Log: quiet})
	require.NoError(t, err)
	return g
}

// verifies checks that the certificate g serves is trusted by the bundle for the Service's
// name.
func verifies(t *testing.T, g Certs, bundle []byte) {
	t.Helper()
	cert, err := g.GetCertificate(nil)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(bundle))
	_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "wasmesh-discovery.istio-system.svc"})
	assert.NoError(t, err)
}

// Replicas starting together all find no Secret, all try to create it; one wins and the
// others read its CA, so every replica's certificate is trusted by one caBundle.
func TestReplicasConvergeOnOneCA(t *testing.T) {
	client := fake.NewClientset()
	var creates atomic.Int32
	client.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		creates.Add(1)
		return false, nil, nil
	})
	replicas := make([]*GeneratedCerts, 8)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range replicas {
		replicas[i] = generated(t, client, time.Hour)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := replicas[i].renew(context.Background())
			assert.NoError(t, err)
		}()
	}
	close(start)
	wg.Wait()
	sec, err := client.CoreV1().Secrets("istio-system").Get(context.Background(), DefaultCASecret, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, CASecretType, sec.Type)
	for i, r := range replicas {
		assert.Equal(t, string(sec.Data[CACertKey]), string(r.CABundle()), "replica %d", i)
		verifies(t, r, sec.Data[CACertKey])
	}
	t.Logf("%d replicas tried to create the CA Secret", creates.Load())
}

// The replica that loses the create race (it saw no Secret, another created one before its
// create) reads the winner's CA instead of keeping its own.
func TestLoserOfTheCreateRaceReadsTheWinnersCA(t *testing.T) {
	client := fake.NewClientset()
	winner := generated(t, client, time.Hour)
	_, err := winner.renew(context.Background())
	require.NoError(t, err)

	var staleOnce atomic.Bool
	client.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if staleOnce.CompareAndSwap(false, true) { // the loser's read happened before the winner's create
			return true, nil, apierrors.NewNotFound(corev1.Resource("secrets"), DefaultCASecret)
		}
		return false, nil, nil
	})
	loser := generated(t, client, time.Hour)
	_, err = loser.renew(context.Background())
	require.NoError(t, err)
	require.True(t, staleOnce.Load())
	assert.Equal(t, string(winner.CABundle()), string(loser.CABundle()))
	verifies(t, loser, winner.CABundle())
}

// A renewal reads the Secret again: a Secret deleted is created again with the CA in use
// (a replica starting later finds that one), and a CA replaced there is adopted.
func TestRenewalKeepsTheSecretAndAdoptsANewCA(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	g := generated(t, client, time.Hour)
	_, err := g.renew(ctx)
	require.NoError(t, err)
	first := g.CABundle()
	secrets := client.CoreV1().Secrets("istio-system")

	require.NoError(t, secrets.Delete(ctx, DefaultCASecret, metav1.DeleteOptions{}))
	_, err = g.renew(ctx)
	require.NoError(t, err)
	sec, err := secrets.Get(ctx, DefaultCASecret, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, string(first), string(sec.Data[CACertKey]), "recreated with the CA in use")

	// Replaced by a kubernetes.io/tls Secret of another CA.
	changed := g.Changed()
	other, err := ca.NewSelfSigned(time.Now())
	require.NoError(t, err)
	sec.Data = map[string][]byte{corev1.TLSCertKey: other.CertPEM, corev1.TLSPrivateKeyKey: other.KeyPEM}
	_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = g.renew(ctx)
	require.NoError(t, err)
	assert.Equal(t, string(other.CertPEM), string(g.CABundle()))
	verifies(t, g, other.CertPEM)
	select {
	case <-changed:
	default:
		t.Fatal("a new CA is announced on Changed")
	}

	// A Secret that holds no CA is an error; the certificate in use stays.
	sec.Data[corev1.TLSCertKey] = []byte("not a certificate")
	_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = g.renew(ctx)
	require.ErrorContains(t, err, "CA Secret istio-system/"+DefaultCASecret)
	verifies(t, g, other.CertPEM)
}

// The serving certificate is renewed before it expires and served from the next
// connection on, without a restart.
func TestServingCertificateRotatesWithoutRestart(t *testing.T) {
	g := generated(t, fake.NewClientset(), 1500*time.Millisecond) // renewed every second
	s, err := New(Options{Addr: "127.0.0.1:0", Certs: g, Log: quiet})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	go func() { defer wg.Done(); _ = g.Run(ctx) }()
	go func() { defer wg.Done(); _ = s.Run(ctx, time.Second) }()
	require.Eventually(t, func() bool { return len(g.CABundle()) > 0 }, 10*time.Second, 10*time.Millisecond)

	serial := func() string {
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(g.CABundle())
		conn, err := tls.Dial("tcp", s.Addr(), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		if err != nil {
			return ""
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	first := serial()
	require.NotEmpty(t, first, "the certificate verifies for the address")
	require.Eventually(t, func() bool { s := serial(); return s != "" && s != first }, 20*time.Second, 50*time.Millisecond,
		"a new certificate is served")
}

func writeCertDir(t *testing.T, dir string, authority *ca.Authority, g *GeneratedCerts) {
	t.Helper()
	cert, err := g.issue(authority)
	require.NoError(t, err)
	kder, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, KeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, CertFile), ca.PEMCert(cert.Certificate[0]), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, CAFile), authority.CertPEM, 0o644))
}

// Certificates from a directory are reloaded when it changes; a change that does not load
// keeps the last good pair.
func TestFileCertsReload(t *testing.T) {
	dir := t.TempDir()
	issuer := generated(t, fake.NewClientset(), time.Hour)
	ca1, err := ca.NewSelfSigned(time.Now())
	require.NoError(t, err)
	writeCertDir(t, dir, ca1, issuer)
	f, err := NewFileCerts(dir, quiet)
	require.NoError(t, err)
	assert.Equal(t, string(ca1.CertPEM), string(f.CABundle()))
	verifies(t, f, ca1.CertPEM)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	defer func() { cancel(); <-done }()
	changed := f.Changed()
	go func() { defer close(done); _ = f.Run(ctx) }()

	ca2, err := ca.NewSelfSigned(time.Now())
	require.NoError(t, err)
	writeCertDir(t, dir, ca2, issuer)
	select {
	case <-changed:
	case <-time.After(20 * time.Second):
		t.Fatal("the new CA was not loaded")
	}
	require.Eventually(t, func() bool { return string(f.CABundle()) == string(ca2.CertPEM) }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		c, _ := f.GetCertificate(nil)
		leaf, _ := x509.ParseCertificate(c.Certificate[0])
		return leaf.CheckSignatureFrom(ca2.Cert) == nil
	}, 10*time.Second, 10*time.Millisecond, "the new pair is served")

	require.NoError(t, os.WriteFile(filepath.Join(dir, CertFile), []byte("garbage"), 0o644))
	f.reload() // as the watcher does on the write
	verifies(t, f, ca2.CertPEM)
}

func TestFileCertsRefusesWhatCannotServe(t *testing.T) {
	issuer := generated(t, fake.NewClientset(), time.Hour)
	authority, err := ca.NewSelfSigned(time.Now())
	require.NoError(t, err)
	other, err := ca.NewSelfSigned(time.Now())
	require.NoError(t, err)

	_, err = NewFileCerts(filepath.Join(t.TempDir(), "missing"), quiet)
	assert.ErrorContains(t, err, "webhookCertDir")

	dir := t.TempDir()
	writeCertDir(t, dir, authority, issuer)
	require.NoError(t, os.WriteFile(filepath.Join(dir, CAFile), other.CertPEM, 0o644))
	_, err = NewFileCerts(dir, quiet)
	assert.ErrorContains(t, err, "tls.crt is not signed by ca.crt")
}

// WaitServing holds a TLS port's serving until a certificate is in force, and gives up with
// its context.
func TestWaitServing(t *testing.T) {
	c := newCurrent()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.WaitServing(ctx), context.DeadlineExceeded, "no certificate yet")

	done := make(chan error, 1)
	go func() { done <- c.WaitServing(context.Background()) }()
	select {
	case <-done:
		t.Fatal("returned before a certificate was set")
	case <-time.After(20 * time.Millisecond):
	}
	c.set(&tls.Certificate{}, []byte("ca"))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting once a certificate is in force")
	}
	require.NoError(t, c.WaitServing(ctx), "in force already: at once, even with an ended context")
}
