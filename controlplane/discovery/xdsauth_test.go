package discovery_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
	"github.com/wasmesh/wasmesh/controlplane/ca"
	"github.com/wasmesh/wasmesh/controlplane/ca/catest"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/webhook/webhooktest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const reviewsEntry = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: demo}
spec:
  hosts: [reviews.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9080, name: http}]
  workloadSelector: {labels: {app: reviews}}
`

const reviewsHost = "reviews.demo.svc.cluster.local"

// secureEnv is discovery with its CA and the secure port, and the runner's key that mints
// local-mesh credentials.
type secureEnv struct {
	*env
	runnerKey ed25519.PrivateKey
	roots     *x509.CertPool
}

func startSecure(t testing.TB, tunes ...func(*discovery.Options)) *secureEnv {
	caDir, keyFile := t.TempDir(), filepath.Join(t.TempDir(), "credential.pub")
	pub, runnerKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	pubPEM, err := ca.MarshalCredentialKey(pub)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(keyFile, pubPEM, 0o644))
	e := start(t, map[string]string{"reviews.yaml": reviewsEntry}, func(o *discovery.Options) {
		o.CA = discovery.CAOptions{SecureGRPCAddr: "127.0.0.1:0", Dir: caDir, LocalCredentialKey: keyFile, Hosts: []string{"127.0.0.1"}}
		for _, tune := range tunes {
			tune(o)
		}
	})
	roots := x509.NewCertPool()
	root, err := os.ReadFile(filepath.Join(caDir, ca.RootCertFile))
	require.NoError(t, err)
	require.True(t, roots.AppendCertsFromPEM(root))
	// The serving certificate is issued as discovery starts.
	require.Eventually(t, func() bool {
		c, err := tls.Dial("tcp", e.d.SecureGRPCAddr(), &tls.Config{RootCAs: roots, ServerName: catest.ServerName, NextProtos: []string{"h2"}})
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	return &secureEnv{env: e, runnerKey: runnerKey, roots: roots}
}

// dial is a TLS connection to the secure port verifying discovery as istiod.istio-system.svc
// (the agent's contract), showing cert when given.
func (e *secureEnv) dial(t testing.TB, cert *tls.Certificate) *grpc.ClientConn {
	cfg := &tls.Config{RootCAs: e.roots, ServerName: catest.ServerName, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	cc, err := grpc.NewClient(e.d.SecureGRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return cc
}

func (e *secureEnv) credential(t testing.TB, ns, sa string, ips ...string) string {
	c, err := ca.MintCredential(e.runnerKey, ns, sa, time.Now().Add(time.Hour), ips...)
	require.NoError(t, err)
	return c
}

// workloadCert is a certificate of ns/sa signed by discovery's CA at now for ttl.
func (e *secureEnv) workloadCert(t testing.TB, a *ca.Authority, ns, sa string, now time.Time, ttl time.Duration) *tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leafPEM, err := a.SignWorkload(key.Public(), ca.Identity{Namespace: ns, ServiceAccount: sa}.SPIFFE("cluster.local"), ttl, now)
	require.NoError(t, err)
	block, _ := pem.Decode(leafPEM)
	return &tls.Certificate{Certificate: [][]byte{block.Bytes}, PrivateKey: key}
}

// hijacker is the node: a workload of demo claiming reviews' labels, with whatever
// namespace, service account and addresses a case gives it.
func hijacker(t testing.TB, id, ns, sa, ips string) *core.Node {
	md := map[string]any{"NAME": "reviews-v1-x", "LABELS": map[string]any{"app": "reviews", "version": "v1"},
		"INTERCEPTION_MODE": "NONE"}
	for k, v := range map[string]string{"NAMESPACE": ns, "SERVICE_ACCOUNT": sa, "INSTANCE_IPS": ips} {
		if v != "" {
			md[k] = v
		}
	}
	s, err := structpb.NewStruct(md)
	require.NoError(t, err)
	return &core.Node{Id: id, Metadata: s}
}

// openStream sends a node's first request (CDS) on a SotW or Delta stream and returns the
// first answer's error (nil: a response came).
func openStream(t testing.TB, cc *grpc.ClientConn, token string, n *core.Node, delta bool) error {
	return openTyped(cc, token, n, delta, adsc.ClusterType)
}

// openTyped is openStream with the first request's type.
func openTyped(cc *grpc.ClientConn, token string, n *core.Node, delta bool, typ string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if token != "" {
		ctx = catest.WithToken(ctx, token)
	}
	client := discoverypb.NewAggregatedDiscoveryServiceClient(cc)
	if delta {
		st, err := client.DeltaAggregatedResources(ctx)
		if err != nil {
			return err
		}
		// A stream refused before its first request ends the send with io.EOF; the status
		// is Recv's.
		_ = st.Send(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: typ})
		_, err = st.Recv()
		return err
	}
	st, err := client.StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	_ = st.Send(&discoverypb.DiscoveryRequest{Node: n, TypeUrl: typ})
	_, err = st.Recv()
	return err
}

func reviewsAddresses(e *secureEnv) []string {
	var out []string
	for _, ep := range e.d.State.Registry.Endpoints(reviewsHost) {
		out = append(out, ep.Address)
	}
	return out
}

// The hijack on the secure port: a client claiming reviews' labels and 127.0.0.99 is
// refused, whether it holds no credential, another namespace's, or its own namespace's
// without that address; the pod that holds the address and identity is served and
// registered, over SotW and Delta.
func TestXDSAuthHijackRefused(t *testing.T) {
	e := startSecure(t)
	cc := e.dial(t, nil)
	const id = "sidecar~127.0.0.99~reviews-v1-x.demo~demo.svc.cluster.local"
	attackerNS := e.credential(t, "attack", "default", "127.0.0.99")
	attacker := e.credential(t, "demo", "attacker", "127.0.0.50")
	for _, tc := range []struct {
		name, token string
		node        *core.Node
		code        codes.Code
		says        string
	}{
		{"no credential", "", hijacker(t, id, "demo", "", "127.0.0.99"), codes.Unauthenticated, "no client certificate and no bearer token"},
		{"forged credential", attacker[:len(attacker)-4] + "AAAA", hijacker(t, id, "demo", "", "127.0.0.99"), codes.Unauthenticated, "signature"},
		{"wrong namespace", attackerNS, hijacker(t, id, "demo", "", "127.0.0.99"), codes.PermissionDenied, `NAMESPACE "demo" is not the caller's namespace "attack"`},
		{"wrong namespace in the node id", attackerNS, hijacker(t, id, "attack", "", "127.0.0.99"), codes.PermissionDenied, `node id "` + id + `" names namespace "demo"`},
		{"foreign IP", attacker, hijacker(t, id, "demo", "", "127.0.0.99"), codes.PermissionDenied, "INSTANCE_IPS: 127.0.0.99 is not an address of demo/attacker (its credential names [127.0.0.50])"},
		{"one foreign IP of two", attacker, hijacker(t, id, "demo", "", "127.0.0.50,127.0.0.99"), codes.PermissionDenied, "INSTANCE_IPS: 127.0.0.99"},
		{"another service account", attacker, hijacker(t, id, "demo", "reviews", "127.0.0.50"), codes.PermissionDenied, `SERVICE_ACCOUNT "reviews" is not the caller's service account "attacker"`},
		{"credential without ips", e.credential(t, "demo", "reviews"), hijacker(t, id, "demo", "reviews", "127.0.0.99"), codes.PermissionDenied, "its credential names no ips"},
		{"no namespace at all", attacker, hijacker(t, "sidecar~127.0.0.50~x~demo.svc.cluster.local", "", "", ""), codes.PermissionDenied, "the node names no namespace"},
	} {
		for _, delta := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/delta=%v", tc.name, delta), func(t *testing.T) {
				err := openStream(t, cc, tc.token, tc.node, delta)
				require.Error(t, err)
				assert.Equal(t, tc.code, status.Code(err), "%v", err)
				assert.Contains(t, status.Convert(err).Message(), tc.says)
			})
		}
	}
	// Nor may it report another workload's health.
	err := openTyped(cc, attackerNS, hijacker(t, id, "demo", "", "127.0.0.99"), false, server.HealthType)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	metrics := httpGet(t, "http://"+e.d.HTTPAddr()+"/metrics")
	assert.Contains(t, metrics, `pilot_xds_auth_failures{reason="unauthenticated"} 4`)
	assert.Contains(t, metrics, `pilot_xds_auth_failures{reason="permission_denied"} 15`)
	assert.Empty(t, reviewsAddresses(e), "no refused node was registered")
	assert.Empty(t, e.d.Server.Connections())

	// The pod that holds 127.0.0.99 as demo/reviews.
	for _, delta := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		c, err := adsc.Dial(catest.WithToken(ctx, e.credential(t, "demo", "reviews", "127.0.0.99")), e.dial(t, nil),
			adsc.Config{Node: hijacker(t, id, "demo", "reviews", "127.0.0.99"), Delta: delta})
		require.NoError(t, err)
		wait(t, c, func(c *adsc.Client) bool { return len(c.Names(adsc.ClusterType)) > 0 })
	}
	require.Eventually(t, func() bool { return slices.Equal(reviewsAddresses(e), []string{"127.0.0.99"}) }, 10*time.Second, 10*time.Millisecond)
	conns := e.d.Server.Connections()
	require.Len(t, conns, 2)
	assert.Equal(t, "spiffe://cluster.local/ns/demo/sa/reviews", conns[0].Caller)
}

// A workload certificate authenticates a stream; an expired one, one of another CA, and one
// sent with another identity's credential do not. A certificate names no address: without a
// credential naming it (or Kubernetes pods), the node may not claim INSTANCE_IPS.
func TestXDSAuthCertificates(t *testing.T) {
	e := startSecure(t)
	a := e.d.CA.Current()
	now := time.Now()
	foreign, err := ca.NewSelfSigned(now)
	require.NoError(t, err)
	valid := e.workloadCert(t, a, "demo", "reviews", now, time.Hour)
	const id = "sidecar~127.0.0.99~reviews-v1-x.demo~demo.svc.cluster.local"
	for _, tc := range []struct {
		name  string
		cert  *tls.Certificate
		token string
		node  *core.Node
		code  codes.Code
		says  string
	}{
		// Without INSTANCE_IPS the node id's address is the workload's: a certificate alone
		// holds no address (no credential, no Kubernetes pod registry).
		{"valid, the node id's address", valid, "", hijacker(t, id, "demo", "reviews", ""), codes.PermissionDenied,
			"node id " + id + ": 127.0.0.99 is not an address of demo/reviews"},
		{"valid, with the credential naming the address", valid, e.credential(t, "demo", "reviews", "127.0.0.99"),
			hijacker(t, id, "demo", "reviews", "127.0.0.99"), codes.OK, ""},
		{"valid, with an expired credential (ignored: no address held)", valid, mintExpired(t, e), hijacker(t, id, "demo", "reviews", ""),
			codes.PermissionDenied, "127.0.0.99 is not an address of demo/reviews"},
		{"valid, with the credential, the node id's address", valid, e.credential(t, "demo", "reviews", "127.0.0.99"),
			hijacker(t, id, "demo", "reviews", ""), codes.OK, ""},
		{"valid, claiming an address", valid, "", hijacker(t, id, "demo", "reviews", "127.0.0.99"), codes.PermissionDenied,
			"INSTANCE_IPS: 127.0.0.99 is not an address of demo/reviews (a certificate names no addresses"},
		{"valid, another identity's credential", valid, e.credential(t, "demo", "attacker", "127.0.0.99"),
			hijacker(t, id, "demo", "reviews", ""), codes.Unauthenticated, "the client certificate is demo/reviews's but the bearer credential demo/attacker's"},
		{"expired", e.workloadCert(t, a, "demo", "reviews", now.Add(-2*time.Hour), time.Hour), "", hijacker(t, id, "demo", "reviews", ""),
			codes.Unauthenticated, "certificate has expired"},
		{"foreign CA", e.workloadCert(t, foreign, "demo", "reviews", now, time.Hour), "", hijacker(t, id, "demo", "reviews", ""),
			codes.Unauthenticated, "not a valid certificate of this mesh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := openStream(t, e.dial(t, tc.cert), tc.token, tc.node, false)
			assert.Equal(t, tc.code, status.Code(err), "%v", err)
			if tc.says != "" {
				assert.Contains(t, status.Convert(err).Message(), tc.says)
			}
		})
	}
}

func mintExpired(t testing.TB, e *secureEnv) string {
	c, err := ca.MintCredential(e.runnerKey, "demo", "reviews", time.Now().Add(-time.Minute))
	require.NoError(t, err)
	return c
}

// Plaintext xDS only on an explicit loopback address: anything else is refused naming the
// flag.
func TestPlaintextOnlyOnLoopback(t *testing.T) {
	for _, addr := range []string{":0", "0.0.0.0:0", "[::]:0", "192.0.2.1:0", "example.com:0", "127.0.0.1"} {
		_, err := discovery.New(discovery.Options{GRPCAddr: addr}, discardLog())
		require.Error(t, err, addr)
		assert.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("grpcAddr %q: ", addr)), "%v", err)
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", ""} {
		d, err := discovery.New(discovery.Options{GRPCAddr: addr}, discardLog())
		require.NoError(t, err, addr)
		if addr == "" {
			assert.Empty(t, d.GRPCAddr(), "no plaintext port unless asked for")
		} else {
			assert.NotEmpty(t, d.GRPCAddr())
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		cancel()
		require.NoError(t, <-done)
	}
}

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Setting up a stream on the secure port (a new connection: TLS handshake, the credential
// checked, the node authorized) against one on the plaintext port, alternately in one run.
func BenchmarkStreamSetup(b *testing.B) {
	e := startSecure(b, func(o *discovery.Options) { o.Server.ConnectRate = 0 }) // admission control would pace the loop
	n := hijacker(b, "sidecar~127.0.0.99~bench.demo~demo.svc.cluster.local", "demo", "reviews", "127.0.0.99")
	delete(n.Metadata.Fields, "LABELS") // not registered: the cost measured is the stream's
	cred := e.credential(b, "demo", "reviews", "127.0.0.99")
	plainAddr := e.d.GRPCAddr()
	var plain, secure time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		cc, err := grpc.NewClient(plainAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(b, err)
		require.NoError(b, openStream(b, cc, "", n, false))
		cc.Close()
		plain += time.Since(start)

		start = time.Now()
		cfg := &tls.Config{RootCAs: e.roots, ServerName: catest.ServerName, MinVersion: tls.VersionTLS12}
		cc, err = grpc.NewClient(e.d.SecureGRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		require.NoError(b, err)
		require.NoError(b, openStream(b, cc, cred, n, false))
		cc.Close()
		secure += time.Since(start)
	}
	b.ReportMetric(float64(plain.Microseconds())/float64(b.N), "plain-µs/stream")
	b.ReportMetric(float64(secure.Microseconds())/float64(b.N), "secure-µs/stream")
	b.ReportMetric(float64(secure)/float64(plain), "secure/plain")
}

// checkXDSAuthKube: on Kubernetes a proxy authenticated by its service-account token may
// claim the IP of a pod of its namespace running as its service account, and no other: not
// another service account's pod's, not an address no pod has.
func checkXDSAuthKube(t *testing.T, c *kubecluster.Cluster, r *replica) {
	ctx := context.Background()
	for _, p := range []struct{ name, sa, ip string }{{"reviews-1", "reviews", "10.1.0.9"}, {"other-1", "other", "10.1.0.10"}} {
		catest.Token(t, c.Client, "demo", p.sa, ca.CredentialAudience) // the service account
		pod, err := c.Client.CoreV1().Pods("demo").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: map[string]string{"app": p.sa}},
			Spec:       corev1.PodSpec{ServiceAccountName: p.sa, Containers: []corev1.Container{{Name: "app", Image: "echo"}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.ip, PodIPs: []corev1.PodIP{{IP: p.ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		_, err = c.Client.CoreV1().Pods("demo").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(webhooktest.CASecret(t, c)))
	e := &secureEnv{env: &env{d: r.d.Discovery}, roots: roots}
	cc := e.dial(t, nil)
	tok := catest.Token(t, c.Client, "demo", "reviews", ca.CredentialAudience)
	n := func(ip string) *core.Node {
		return hijacker(t, "sidecar~"+ip+"~reviews-1.demo~demo.svc.cluster.local", "demo", "reviews", ip)
	}
	var err error
	require.Eventually(t, func() bool { // the pods reach the registry through the informers
		err = openStream(t, cc, tok, n("10.1.0.9"), false)
		return err == nil
	}, time.Minute, 50*time.Millisecond, "the pod's own IP: %v", err)
	for ip, says := range map[string]string{
		"10.1.0.10": "INSTANCE_IPS: 10.1.0.10 is not an address of demo/reviews (no pod of that namespace and service account has it)",
		"10.1.0.99": "INSTANCE_IPS: 10.1.0.99 is not an address of demo/reviews",
	} {
		err := openStream(t, cc, tok, n(ip), true)
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "%s: %v", ip, err)
		assert.Contains(t, status.Convert(err).Message(), says)
	}
}
