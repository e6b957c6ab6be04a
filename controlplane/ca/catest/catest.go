// Package catest helps test callers of the mesh's certificate API: a key and CSR, a client
// over TLS, a bearer token in the call's metadata.
package catest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ServerName is the name clients check the secure port's certificate for: the istiod
// Service's in istio-system.
const ServerName = "istiod.istio-system.svc"

// NewCSR makes an ECDSA P-256 key and a PEM CSR naming the URIs given (none: no SAN).
func NewCSR(t testing.TB, uris ...string) (*ecdsa.PrivateKey, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.CertificateRequest{}
	for _, id := range uris {
		u, err := url.Parse(id)
		require.NoError(t, err)
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	require.NoError(t, err)
	return key, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// Client dials the certificate service at addr trusting roots for ServerName, presenting
// clientCert when given; the connection closes when the test ends.
func Client(t testing.TB, addr string, roots *x509.CertPool, clientCert *tls.Certificate) securityv1alpha1.IstioCertificateServiceClient {
	t.Helper()
	cfg := &tls.Config{RootCAs: roots, ServerName: ServerName, MinVersion: tls.VersionTLS12}
	if clientCert != nil {
		cfg.Certificates = []tls.Certificate{*clientCert}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return securityv1alpha1.NewIstioCertificateServiceClient(conn)
}

// WithToken is ctx carrying `authorization: Bearer <token>`.
func WithToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// Leaf is the first certificate of Istio's answer, verified to chain (through the answer's
// middle elements) to roots, for client and server use.
func Leaf(t testing.TB, resp *securityv1alpha1.IstioCertificateResponse, roots []byte) *x509.Certificate {
	t.Helper()
	chain := resp.GetCertChain()
	require.GreaterOrEqual(t, len(chain), 2, "the leaf and the roots at least")
	require.Equal(t, string(roots), chain[len(chain)-1], "the last element is root-cert.pem")
	block, _ := pem.Decode([]byte(chain[0]))
	require.NotNil(t, block, "the leaf is PEM")
	leaf, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(roots))
	for _, c := range chain[1 : len(chain)-1] {
		require.True(t, inter.AppendCertsFromPEM([]byte(c)))
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}})
	require.NoError(t, err)
	return leaf
}

// Token is a projected service-account token of namespace/serviceAccount (the service
// account made when missing) for audience (istio-ca: ca.CredentialAudience), by the
// TokenRequest API as the kubelet makes a pod's.
func Token(t testing.TB, client kubernetes.Interface, namespace, serviceAccount, audience string) string {
	t.Helper()
	ctx := context.Background()
	_, err := client.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccount}},
		metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	expiry := int64(600)
	tr, err := client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return tr.Status.Token
}
