package discovery_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/wasmesh/wasmesh/controlplane/ca"
	"github.com/wasmesh/wasmesh/controlplane/ca/catest"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/controlplane/webhook/webhooktest"
)

// The local mesh: discovery keeps its root in --caDir (root-cert.pem is the file workloads
// trust, the same after a restart) and signs, on the secure port, the identity of the
// local-mesh credential a pod shows, and no other.
func TestLocalMeshCA(t *testing.T) {
	caDir, keyFile := t.TempDir(), filepath.Join(t.TempDir(), "credential.pub")
	pub, runnerKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	pubPEM, err := ca.MarshalCredentialKey(pub)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(keyFile, pubPEM, 0o644))
	tune := func(o *discovery.Options) {
		o.CA = discovery.CAOptions{SecureGRPCAddr: "127.0.0.1:0", Dir: caDir, LocalCredentialKey: keyFile, Hosts: []string{"127.0.0.1"}}
	}
	e := start(t, nil, tune)
	root, err := os.ReadFile(filepath.Join(caDir, ca.RootCertFile))
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(root))

	client := catest.Client(t, e.d.SecureGRPCAddr(), roots, nil)
	credA, err := ca.MintCredential(runnerKey, "shop", "frontend", time.Now().Add(time.Hour))
	require.NoError(t, err)
	ctx := catest.WithToken(context.Background(), credA)
	key, csr := catest.NewCSR(t, "spiffe://cluster.local/ns/shop/sa/frontend")
	var resp *securityv1alpha1.IstioCertificateResponse
	require.Eventually(t, func() bool { // the serving certificate is issued as discovery starts
		resp, err = client.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 120})
		return status.Code(err) != codes.Unavailable
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, err)
	leaf := catest.Leaf(t, resp, root)
	assert.Equal(t, "spiffe://cluster.local/ns/shop/sa/frontend", leaf.URIs[0].String())

	_, csr = catest.NewCSR(t, "spiffe://cluster.local/ns/shop/sa/reviews")
	_, err = client.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.Contains(t, httpGet(t, "http://"+e.d.HTTPAddr()+"/metrics"), `citadel_server_csr_sign_err_count{error_type="identity_mismatch"} 1`)

	// Renewal with the certificate just issued, no credential.
	renewing := catest.Client(t, e.d.SecureGRPCAddr(), roots, &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key})
	_, csr = catest.NewCSR(t)
	resp, err = renewing.CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	require.NoError(t, err)
	assert.Equal(t, "spiffe://cluster.local/ns/shop/sa/frontend", catest.Leaf(t, resp, root).URIs[0].String())

	restarted := start(t, nil, tune)
	assert.NotEqual(t, e.d.SecureGRPCAddr(), restarted.d.SecureGRPCAddr())
	again, err := os.ReadFile(filepath.Join(caDir, ca.RootCertFile))
	require.NoError(t, err)
	assert.Equal(t, string(root), string(again), "the root is kept")
	assert.Equal(t, string(root), string(restarted.d.CA.Current().RootPEM))
}

// rootConfigMap is the root-cert.pem of namespace ns's istio-ca-root-cert ("" without one).
func rootConfigMap(t *testing.T, c *kubecluster.Cluster, ns string) string {
	t.Helper()
	cm, err := c.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), ca.RootConfigMap, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return cm.Data[ca.RootCertFile]
}

// checkCA: on Kubernetes the webhook and the certificate service share the CA of
// istio-ca-secret; the leader publishes its root in every namespace; a projected
// service-account token (audience istio-ca) gets that service account's certificate on the
// secure port.
func checkCA(t *testing.T, c *kubecluster.Cluster, r *replica) {
	root := webhooktest.CASecret(t, c)
	require.NotEmpty(t, root)
	assert.Equal(t, string(root), string(webhooktest.CABundle(t, c)), "the webhook's caBundle is the mesh's root")
	require.Eventually(t, func() bool { return rootConfigMap(t, c, "demo") == string(root) }, time.Minute, 20*time.Millisecond,
		"the leader publishes the root")
	ctx := context.Background()
	tok := catest.Token(t, c.Client, "demo", "reviews", ca.CredentialAudience)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(root))
	_, csr := catest.NewCSR(t)
	var resp *securityv1alpha1.IstioCertificateResponse
	var err error
	require.Eventually(t, func() bool {
		resp, err = catest.Client(t, r.d.SecureGRPCAddr(), roots, nil).CreateCertificate(catest.WithToken(ctx, tok),
			&securityv1alpha1.IstioCertificateRequest{Csr: csr})
		return status.Code(err) != codes.Unavailable
	}, time.Minute, 20*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, "spiffe://cluster.local/ns/demo/sa/reviews", catest.Leaf(t, resp, root).URIs[0].String())
}
