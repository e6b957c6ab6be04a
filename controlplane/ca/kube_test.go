package ca

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/wasmesh/wasmesh/controlplane/ca/catest"
	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
)

const caNamespace = "istio-system"

// On a real API server: the CA kept in istio-ca-secret (shared by replicas racing to
// create it, and kept across restarts), a plugged-in cacerts Secret, service-account tokens
// checked by TokenReview, and the root ConfigMap in every namespace.
func TestOnKubernetes(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, ns := range []string{caNamespace, "a", "b"} {
		_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	var keeper *Keeper
	t.Run("replicas share the Secret's CA, kept across restarts", func(t *testing.T) {
		keepers := make([]*Keeper, 4)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range keepers {
			k, err := NewKeeper(KeeperOptions{Client: c.Client, Namespace: caNamespace, Log: quiet})
			require.NoError(t, err)
			keepers[i] = k
			wg.Go(func() { <-start; _, err := k.Refresh(ctx); assert.NoError(t, err) })
		}
		close(start)
		wg.Wait()
		sec, err := c.Client.CoreV1().Secrets(caNamespace).Get(ctx, DefaultSecret, metav1.GetOptions{})
		require.NoError(t, err)
		for _, k := range keepers {
			require.NotNil(t, k.Current())
			assert.Equal(t, string(sec.Data[CACertFile]), string(k.Current().CertPEM))
		}
		keeper, err = NewKeeper(KeeperOptions{Client: c.Client, Namespace: caNamespace, Log: quiet}) // a restart
		require.NoError(t, err)
		a, err := keeper.Refresh(ctx)
		require.NoError(t, err)
		assert.Equal(t, string(sec.Data[CACertFile]), string(a.CertPEM))
	})
	t.Run("service-account tokens", func(t *testing.T) { tokenReview(t, c, keeper) })
	t.Run("root ConfigMap in every namespace", func(t *testing.T) { rootConfigMaps(t, c, keeper) })
	t.Run("plugged-in cacerts Secret wins", func(t *testing.T) {
		files, root := pluggedFiles(t)
		_, err := c.Client.CoreV1().Secrets(caNamespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: PluggedSecret}, Data: files},
			metav1.CreateOptions{})
		require.NoError(t, err)
		changed := keeper.Changed()
		a, err := keeper.Refresh(ctx)
		require.NoError(t, err)
		assert.Equal(t, "intermediate", a.Cert.Subject.CommonName)
		assert.Equal(t, string(root.CertPEM), string(a.RootPEM))
		select {
		case <-changed:
		default:
			t.Fatal("a new CA is announced on Changed")
		}
		// The ConfigMaps follow the new root.
		pctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		defer func() { stop(); <-done }()
		go func() { defer close(done); (&RootPublisher{Client: c.Client, CA: keeper, Log: quiet}).Run(pctx) }()
		require.Eventually(t, func() bool {
			cm, err := c.Client.CoreV1().ConfigMaps("a").Get(ctx, RootConfigMap, metav1.GetOptions{})
			return err == nil && cm.Data[RootCertFile] == string(root.CertPEM)
		}, time.Minute, 20*time.Millisecond, "the root ConfigMaps hold the plugged-in CA's root")
	})
}

func token(t *testing.T, c *kubecluster.Cluster, ns, sa, audience string) string {
	return catest.Token(t, c.Client, ns, sa, audience)
}

func tokenReview(t *testing.T, c *kubecluster.Cluster, keeper *Keeper) {
	ts := serve(t, keeper.Current(), c.Client)
	client := ts.client(t, nil)
	ctx := context.Background()
	alpha := token(t, c, "a", "alpha", CredentialAudience)
	_, csr := newCSR(t, idA)
	resp, err := client.CreateCertificate(withToken(ctx, alpha), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	require.NoError(t, err)
	verifyChain(t, resp, keeper.Current().RootPEM, idA)

	_, csr = newCSR(t, idB)
	_, err = client.CreateCertificate(withToken(ctx, alpha), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.PermissionDenied, idA, idB)

	_, csr = newCSR(t, idA)
	for name, tok := range map[string]string{
		"wrong audience": token(t, c, "a", "alpha", "https://kubernetes.default.svc.cluster.local"),
		"bad token":      alpha[:len(alpha)-4] + "AAAA",
	} {
		_, err = client.CreateCertificate(withToken(ctx, tok), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
		requireCode(t, err, codes.Unauthenticated, "TokenReview")
		t.Logf("%s: %v", name, err)
	}
	_, err = client.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	requireCode(t, err, codes.Unauthenticated, "no bearer token")
}

func rootConfigMaps(t *testing.T, c *kubecluster.Cluster, keeper *Keeper) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() { defer close(done); (&RootPublisher{Client: c.Client, CA: keeper, Log: quiet}).Run(ctx) }()
	root := string(keeper.Current().RootPEM)
	cms := func(ns string) string {
		cm, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, RootConfigMap, metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return cm.Data[RootCertFile]
	}
	require.Eventually(t, func() bool { return cms("a") == root && cms(caNamespace) == root }, time.Minute, 20*time.Millisecond,
		"every namespace has the root")
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return cms("new") == root }, time.Minute, 20*time.Millisecond, "a new namespace gets it")

	cm, err := c.Client.CoreV1().ConfigMaps("new").Get(ctx, RootConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	cm.Data[RootCertFile] = "edited"
	_, err = c.Client.CoreV1().ConfigMaps("new").Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return cms("new") == root }, time.Minute, 20*time.Millisecond, "an edit is undone")
	require.NoError(t, c.Client.CoreV1().ConfigMaps("b").Delete(ctx, RootConfigMap, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return cms("b") == root }, time.Minute, 20*time.Millisecond, "a deleted one comes back")
}
