package ca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// pluggedFiles is Istio's cacerts for an intermediate CA signed by a root of its own
// (tools/certs' layout: cert-chain.pem is the intermediate then the root).
func pluggedFiles(t testing.TB) (files map[string][]byte, root *Authority) {
	t.Helper()
	root, err := NewSelfSigned(time.Now())
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := root.sign(&x509.Certificate{Subject: pkix.Name{CommonName: "intermediate", Organization: []string{"cluster1"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, &key.PublicKey)
	require.NoError(t, err)
	keyPEM, err := PEMKey(key)
	require.NoError(t, err)
	cert := PEMCert(der)
	return map[string][]byte{CACertFile: cert, CAKeyFile: keyPEM, CertChainFile: append(append([]byte{}, cert...), root.CertPEM...),
		RootCertFile: root.CertPEM}, root
}

// The self-signed root is made once and kept in the directory: a restart reads the same
// one; root-cert.pem there is the root.
func TestDirKeptAcrossRestarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	k, err := NewKeeper(KeeperOptions{Dir: dir, Log: quiet})
	require.NoError(t, err)
	first, err := k.Refresh(context.Background())
	require.NoError(t, err)
	assert.True(t, first.Cert.IsCA)
	assert.WithinDuration(t, time.Now().Add(RootTTL), first.Cert.NotAfter, time.Minute)
	fi, err := os.Stat(filepath.Join(dir, CAKeyFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	rootFile, err := os.ReadFile(filepath.Join(dir, RootCertFile))
	require.NoError(t, err)
	assert.Equal(t, string(first.CertPEM), string(rootFile))

	restarted, err := NewKeeper(KeeperOptions{Dir: dir, Log: quiet})
	require.NoError(t, err)
	again, err := restarted.Refresh(context.Background())
	require.NoError(t, err)
	assert.Equal(t, string(first.CertPEM), string(again.CertPEM))
	assert.Equal(t, string(first.KeyPEM), string(again.KeyPEM))

	require.NoError(t, os.WriteFile(filepath.Join(dir, CAKeyFile), []byte("garbage"), 0o600))
	_, err = restarted.Refresh(context.Background())
	require.ErrorContains(t, err, "CA directory "+dir)
	require.ErrorContains(t, err, CAKeyFile)
}

// A plugged-in intermediate (caCertsDir) wins over the directory's root: workload
// certificates chain through it to its root, which is the last element of the answer.
func TestPluggedDirSignsThroughTheIntermediate(t *testing.T) {
	files, root := pluggedFiles(t)
	plugged := t.TempDir()
	for name, b := range files {
		require.NoError(t, os.WriteFile(filepath.Join(plugged, name), b, 0o600))
	}
	k, err := NewKeeper(KeeperOptions{PluggedDir: plugged, Dir: t.TempDir(), Log: quiet})
	require.NoError(t, err)
	a, err := k.Refresh(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "intermediate", a.Cert.Subject.CommonName)
	ts := serve(t, a, nil)
	_, csr := newCSR(t, idA)
	resp, err := ts.client(t, nil).CreateCertificate(withToken(context.Background(), ts.credential(t, "a", "alpha", time.Hour)),
		&securityv1alpha1.IstioCertificateRequest{Csr: csr})
	require.NoError(t, err)
	require.Len(t, resp.CertChain, 3, "leaf, intermediate, root")
	verifyChain(t, resp, root.CertPEM, idA)

	// An intermediate that does not chain to root-cert.pem is refused, naming the files.
	other, err := NewSelfSigned(time.Now())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(plugged, RootCertFile), other.CertPEM, 0o600))
	_, err = LoadPluggedDir(plugged)
	require.ErrorContains(t, err, "caCertsDir")
	require.ErrorContains(t, err, "does not chain to root-cert.pem")
	_, err = LoadPluggedDir(t.TempDir())
	require.ErrorContains(t, err, CACertFile)
}

// Replicas starting together all find no Secret and try to create it; one wins, the
// others read its CA.
func TestReplicasShareTheSecretsCA(t *testing.T) {
	client := fake.NewClientset()
	keepers := make([]*Keeper, 8)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range keepers {
		k, err := NewKeeper(KeeperOptions{Client: client, Namespace: "istio-system", Log: quiet})
		require.NoError(t, err)
		keepers[i] = k
		wg.Go(func() {
			<-start
			_, err := k.Refresh(context.Background())
			assert.NoError(t, err)
		})
	}
	close(start)
	wg.Wait()
	sec, err := client.CoreV1().Secrets("istio-system").Get(context.Background(), DefaultSecret, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, SecretType, sec.Type)
	for i, k := range keepers {
		assert.Equal(t, string(sec.Data[CACertFile]), string(k.Current().CertPEM), "replica %d", i)
	}
}

// A root rotation as controlplane/README.md describes it: root-cert.pem holds both roots
// while the old CA signs, then while the new one does; a workload trusting root-cert.pem
// verifies certificates of either CA throughout.
func TestRootRotationTrustsBothRoots(t *testing.T) {
	oldCA, err := NewSelfSigned(time.Now())
	require.NoError(t, err)
	newCA, err := NewSelfSigned(time.Now())
	require.NoError(t, err)
	both := append(append([]byte{}, oldCA.CertPEM...), newCA.CertPEM...)
	dir := t.TempDir()
	write := func(signer *Authority) {
		for name, b := range map[string][]byte{CACertFile: signer.CertPEM, CAKeyFile: signer.KeyPEM, RootCertFile: both} {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o600))
		}
	}
	id, err := url.Parse(idA)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	issue := func() *x509.Certificate {
		a, err := LoadPluggedDir(dir)
		require.NoError(t, err)
		assert.Equal(t, string(both), string(a.RootPEM), "both roots are published")
		assert.Equal(t, string(both), a.ChainPEMs()[len(a.ChainPEMs())-1], "and answered last")
		certPEM, err := a.SignWorkload(&key.PublicKey, id, time.Hour, time.Now())
		require.NoError(t, err)
		certs, err := parseCerts(certPEM)
		require.NoError(t, err)
		return certs[0]
	}
	write(oldCA) // step 1: the old CA signs, both roots trusted
	fromOld := issue()
	write(newCA) // step 3: the new CA signs, both roots still trusted
	fromNew := issue()
	trusting := x509.NewCertPool()
	require.True(t, trusting.AppendCertsFromPEM(both))
	for _, c := range []*x509.Certificate{fromOld, fromNew} {
		_, err := c.Verify(x509.VerifyOptions{Roots: trusting, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		assert.NoError(t, err, "issued by %s", c.Issuer)
	}
}
