package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/ca"
	"github.com/wasmesh/wasmesh/controlplane/ca/catest"
	"github.com/wasmesh/wasmesh/testenv/localmesh"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

func spiffe(sa string) string { return "spiffe://cluster.local/ns/default/sa/" + sa }

func withSA(sa string) func(*localmesh.PodSpec) {
	return func(s *localmesh.PodSpec) { s.ServiceAccount = sa }
}

// peerAuthentication is a PeerAuthentication of the default namespace for the workloads
// labelled app=<app> (all of them when app is "").
func peerAuthentication(app, mode string) string {
	name, sel := "default", ""
	if app != "" {
		name, sel = app, "\n  selector: {matchLabels: {app: "+app+"}}"
	}
	return fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: %s, namespace: default}
spec:%s
  mtls: {mode: %s}
`, name, sel, mode)
}

// plaintextGet calls url directly (no sidecar, no TLS), as a client outside the mesh does.
func plaintextGet(url string) (int, error) {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// 11. Mutual TLS: the mesh's sidecars talk mTLS with their SPIFFE identities (the telemetry
// shows it on both ends); PERMISSIVE, the default, also takes a plaintext client from
// outside the mesh; STRICT refuses it while the mesh's own traffic goes on without a failure.
func TestMutualTLS(t *testing.T) {
	cfg := frontBack()
	cfg["telemetry.yaml"] = deploySample(t, "telemetry.envoyfilter.yaml")
	m, ctx := startMesh(t, cfg)
	// The sample EnvoyFilter adds request_method, a label on pods that ask for it; the
	// listeners' ssl.* stats are kept on pods that ask for them, as in Istio.
	extraTag := func(s *localmesh.PodSpec) {
		s.Annotations = map[string]string{"sidecar.istio.io/extraStatTags": "request_method",
			"sidecar.istio.io/statsInclusionRegexps": `listener\..*\.ssl\..*`}
	}
	back, err := m.AddPod(ctx, backendPod(withSA("backend"), extraTag))
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod(withSA("frontend"), extraTag))
	require.NoError(t, err)

	g := steadyLoad(t, ctx, front.URL("/"), 50)
	waitServed(t, g, 100)

	// The server side sees mutual TLS and both principals.
	hop := map[string]string{"reporter": "destination", "connection_security_policy": "mutual_tls",
		"source_principal": spiffe("frontend"), "destination_principal": spiffe("backend"),
		"destination_app": "backend", "response_code": "200"}
	var ms localmesh.Metrics
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if ms, err = back.Metrics(ctx); err == nil && ms.Sum("istio_requests_total", hop) > 0 {
			break
		}
	}
	require.Positive(t, ms.Sum("istio_requests_total", hop), "backend never reported an mTLS request from the frontend's identity: %v",
		ms.Series("istio_requests_total", map[string]string{"reporter": "destination"}))

	// PERMISSIVE (nothing configured): a plaintext client outside the mesh is served too.
	code, err := plaintextGet(back.URL("/"))
	require.NoError(t, err, "PERMISSIVE takes plaintext")
	assert.Equal(t, http.StatusOK, code)

	// STRICT for the backend: plaintext refused, the mesh's traffic unaffected.
	require.NoError(t, m.WriteConfig("pa-backend.yaml", peerAuthentication("backend", "STRICT")))
	require.Eventually(t, func() bool {
		_, err := plaintextGet(back.URL("/"))
		return err != nil
	}, 20*time.Second, 100*time.Millisecond, "a STRICT workload still serves a plaintext client")
	waitServed(t, g, 100)
	requireNoFailures(t, g)

	// The handshakes are counted where Envoy counts them.
	stats, err := back.Admin(ctx, "/stats")
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^listener\.[^ ]*\.ssl\.handshake: [1-9]`, string(stats))
}

// 12. Authorization: an AuthorizationPolicy letting only the frontend's identity call the
// backend gives any other caller in the mesh 403 "RBAC: access denied".
func TestAuthorizationPolicy(t *testing.T) {
	cfg := frontBack()
	cfg["other.yaml"] = meshtest.ServiceEntry("other", 9082, 8082)
	cfg["authz.yaml"] = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: backend-callers, namespace: default}
spec:
  selector: {matchLabels: {app: backend}}
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/default/sa/frontend]}}]
`
	m, ctx := startMesh(t, cfg)
	_, err := m.AddPod(ctx, backendPod(withSA("backend")))
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod(withSA("frontend")))
	require.NoError(t, err)
	other, err := m.AddPod(ctx, localmesh.PodSpec{Labels: map[string]string{"app": "other"}, Port: 8082, ServiceAccount: "other"})
	require.NoError(t, err)

	backendURL := "http://backend.default.svc.cluster.local:9081/"
	get := func(p *localmesh.Pod) (int, string) {
		resp, err := p.Client().Get(backendURL)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool { c, _ := get(other); return c == http.StatusForbidden }, 20*time.Second, 100*time.Millisecond,
		"the policy never applied")
	code, body := get(other)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, "RBAC: access denied", body)
	for range 20 {
		code, _ := get(front)
		require.Equal(t, http.StatusOK, code, "the allowed caller")
	}
}

// 13. Certificate rotation: workload certificates of a 2-minute lifetime are renewed at half
// of it and reach the proxies by SDS: a minute and a half of steady load across the
// renewals fails no request, and no proxy restarts.
func TestWorkloadCertificateRenewalUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 90 s: a 2-minute certificate lifetime")
	}
	m, ctx := startMesh(t, frontBack())
	ttl := func(s *localmesh.PodSpec) { s.Env = append(s.Env, "SECRET_TTL=2m") }
	back, err := m.AddPod(ctx, backendPod(withSA("backend"), ttl))
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod(withSA("frontend"), ttl))
	require.NoError(t, err)
	// serials are the serial numbers of the workload certificates the proxy presents
	// (Envoy's /certs: cert_chain of each TLS context).
	serials := func(p *localmesh.Pod) string {
		b, err := p.Admin(ctx, "/certs")
		require.NoError(t, err)
		var certs adminv3.Certificates
		require.NoError(t, protojson.Unmarshal(b, &certs))
		var out []string
		for _, c := range certs.GetCertificates() {
			for _, d := range c.GetCertChain() {
				out = append(out, d.GetSerialNumber())
			}
		}
		require.NotEmpty(t, out, "%s's proxy presents no certificate", p.Spec.Name)
		slices.Sort(out)
		return strings.Join(slices.Compact(out), ",")
	}
	firstBack, firstFront := serials(back), serials(front)

	g := steadyLoad(t, ctx, front.URL("/"), 50)
	require.Eventually(t, func() bool { return serials(back) != firstBack && serials(front) != firstFront },
		100*time.Second, time.Second, "the proxies never got renewed certificates")
	waitServed(t, g, 100) // requests on the new certificates
	res := requireNoFailures(t, g)
	t.Logf("across the renewals: %s", res.String())
	for _, p := range []*localmesh.Pod{front, back} {
		assert.Equal(t, 0, restartEpoch(p), "%s's proxy restarted for a certificate", p.Spec.Name)
	}
}

// 14. A control plane that lets no one in: a pod's credential gets no certificate for
// another identity; a client claiming another workload's labels and address is refused
// xDS, and one with no credential is not served at all; a workload presenting a
// certificate of a foreign trust domain or an expired one is refused by a STRICT sidecar.
func TestControlPlaneLetsNoOneIn(t *testing.T) {
	cfg := frontBack()
	cfg["pa.yaml"] = peerAuthentication("", "STRICT")
	m, ctx := startMesh(t, cfg)
	back, err := m.AddPod(ctx, backendPod(withSA("backend")))
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod(withSA("frontend")))
	require.NoError(t, err)
	rootPEM, err := os.ReadFile(m.CADir() + "/" + ca.RootCertFile)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(rootPEM))
	cred, err := os.ReadFile(front.CredentialFile())
	require.NoError(t, err)

	t.Run("a CSR for another identity", func(t *testing.T) {
		_, csr := catest.NewCSR(t, spiffe("backend"))
		_, err := catest.Client(t, m.DiscoveryAddress(), roots, nil).CreateCertificate(catest.WithToken(ctx, string(cred)),
			csrRequest(csr))
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	})

	t.Run("the hijack", func(t *testing.T) {
		evilIP := strings.Join(strings.Split(back.IP, ".")[:3], ".") + ".99"
		err := adsFirstResponse(t, ctx, m.DiscoveryAddress(), roots, string(cred), evilIP, "frontend")
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "claiming %s: %v", evilIP, err)
		err = adsFirstResponseNode(t, ctx, m.DiscoveryAddress(), roots, string(cred), evilIP, "frontend", false)
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "claiming %s in the node id only: %v", evilIP, err)
		err = adsFirstResponse(t, ctx, m.DiscoveryAddress(), roots, string(cred), front.IP, "backend")
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "claiming the backend's service account: %v", err)
		err = adsFirstResponse(t, ctx, m.DiscoveryAddress(), roots, "", front.IP, "frontend")
		assert.Equal(t, codes.Unauthenticated, status.Code(err), "no credential: %v", err)
		page, err := getURL(m.DiscoveryURL("/debug/registryz"))
		require.NoError(t, err)
		assert.NotContains(t, string(page), evilIP)
	})

	t.Run("foreign and expired certificates", func(t *testing.T) {
		a, _, err := ca.LoadOrCreateDir(m.CADir(), time.Now())
		require.NoError(t, err)
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		id, _ := url.Parse(spiffe("frontend"))
		expired := tls.Certificate{Certificate: [][]byte{signed(t, a, key, id, time.Now().Add(-2*time.Hour))}, PrivateKey: key}
		foreign := selfSigned(t, "spiffe://evil.local/ns/default/sa/frontend")
		valid := tls.Certificate{Certificate: [][]byte{signed(t, a, key, id, time.Now())}, PrivateKey: key}

		assert.NoError(t, tlsGet(back.URL("/"), valid), "a current certificate of the mesh is served")
		assert.Error(t, tlsGet(back.URL("/"), expired), "an expired certificate")
		assert.Error(t, tlsGet(back.URL("/"), foreign), "a foreign trust domain's certificate")
	})
}

func csrRequest(csr string) *securityv1alpha1.IstioCertificateRequest {
	return &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600}
}

// signed is the DER of a workload certificate for id the mesh's CA signed at now, valid an
// hour.
func signed(t *testing.T, a *ca.Authority, key *ecdsa.PrivateKey, id *url.URL, now time.Time) []byte {
	p, err := a.SignWorkload(&key.PublicKey, id, time.Hour, now)
	require.NoError(t, err)
	b, _ := pem.Decode(p)
	require.NotNil(t, b)
	return b.Bytes
}

// selfSigned is a certificate of its own CA naming the SPIFFE id.
func selfSigned(t *testing.T, id string) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	u, _ := url.Parse(id)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{Organization: []string{"evil"}},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), URIs: []*url.URL{u},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// tlsGet calls a sidecar's inbound port as a mesh peer would (ALPN istio, client
// certificate cert) and reports whether it got an answer. The server's own certificate is
// not what is tested here.
func tlsGet(rawURL string, cert tls.Certificate) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	cfg := &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}, NextProtos: []string{"istio-http/1.1", "istio"}} //nolint:gosec // the test judges the server's checks
	c := http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		// HTTP over the TLS connection, as a sidecar sends it (the URL stays http://).
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&tls.Dialer{Config: cfg}).DialContext(ctx, network, u.Host)
		}}}
	resp, err := c.Get(rawURL)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// adsFirstResponse opens an ADS stream to discovery's secure port with the credential (none
// when empty) and a node claiming the backend's labels with address ip and service account
// sa, and returns the error of its first response (nil when it was served).
func adsFirstResponse(t *testing.T, ctx context.Context, addr string, roots *x509.CertPool, cred, ip, sa string) error {
	return adsFirstResponseNode(t, ctx, addr, roots, cred, ip, sa, true)
}

// adsFirstResponseNode is adsFirstResponse, the address in the node id only when
// instanceIPs is false (discovery then takes the node id's).
func adsFirstResponseNode(t *testing.T, ctx context.Context, addr string, roots *x509.CertPool, cred, ip, sa string, instanceIPs bool) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{RootCAs: roots, ServerName: catest.ServerName, MinVersion: tls.VersionTLS12})))
	require.NoError(t, err)
	defer conn.Close()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if cred != "" {
		sctx = catest.WithToken(sctx, cred)
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		return err
	}
	fields := map[string]any{"NAMESPACE": "default", "SERVICE_ACCOUNT": sa, "LABELS": map[string]any{"app": "backend", "version": "v1"}}
	if instanceIPs {
		fields["INSTANCE_IPS"] = ip
	}
	md, err := structpb.NewStruct(fields)
	require.NoError(t, err)
	err = stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster",
		Node: &corev3.Node{Id: "sidecar~" + ip + "~backend-evil.default~default.svc.cluster.local", Metadata: md}})
	// io.EOF: the server ended the stream first (a refusal can beat the request); its
	// status is what Recv returns (grpc-go's ClientStream.SendMsg).
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = stream.Recv()
	return err
}
