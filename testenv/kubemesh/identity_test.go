package kubemesh_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/wasmesh/wasmesh/testenv/kubemesh"
)

// checkIdentity: each sample pod's sidecar holds a workload certificate the CA issued for
// its service account (the agent's CSR authenticated by the pod's istio-token), chaining to
// the mesh root that discovery publishes in the namespace (ConfigMap istio-ca-root-cert,
// mounted in the pod); and the sample's calls are mutual TLS, as the callees' telemetry
// reports them (connection_security_policy; the proxies' ssl.* stats are outside the
// bootstrap's stats inclusion, as in Istio).
func checkIdentity(t *testing.T, ctx context.Context, m *kubemesh.Mesh) {
	ns := kubemesh.SampleNamespace
	cm, err := m.Cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
	require.NoError(t, err, "discovery publishes its root in the sample's namespace")
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM([]byte(cm.Data["root-cert.pem"])), "root-cert.pem of istio-ca-root-cert")

	pods, err := m.Cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, pods.Items)
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		sa := p.Spec.ServiceAccountName
		want := "spiffe://cluster.local/ns/" + ns + "/sa/" + sa
		chain, trusted := proxySecrets(t, m, &p)
		require.NotEmpty(t, chain, "pod %s: no workload certificate in its proxy", p.Name)
		assert.Equal(t, []string{want}, uris(chain[0]), "pod %s: the certificate's identity", p.Name)
		inter := x509.NewCertPool()
		for _, c := range chain[1:] {
			inter.AddCert(c)
		}
		_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		assert.NoError(t, err, "pod %s: its certificate chains to the mesh root", p.Name)
		require.NotEmpty(t, trusted, "pod %s: no trusted CA in its proxy", p.Name)
		_, err = trusted[0].Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		assert.NoError(t, err, "pod %s: the proxy trusts the mesh root", p.Name)
	}

	// Traffic, then what the callees' telemetry reports of it (reporter destination): every
	// request mutual TLS, from the caller's identity.
	front := m.FrontURL(ctx, "/")
	require.NotEmpty(t, front)
	require.NotEmpty(t, reviewsAnswers(t, front, 10))
	for _, app := range []string{"reviews", "ratings"} {
		byPolicy := inboundRequests(t, ctx, m, app)
		assert.Positive(t, byPolicy["mutual_tls"], "%s: requests in mutual TLS, by connection_security_policy: %v", app, byPolicy)
		assert.Equal(t, []string{"mutual_tls"}, slices.Sorted(maps.Keys(byPolicy)), "%s: every request in mutual TLS", app)
		t.Logf("%s: requests received by connection_security_policy: %v", app, byPolicy)
	}
}

// proxySecrets are the SDS secrets of the pod's proxy (admin config_dump): the workload
// certificate's chain and the trusted CAs.
func proxySecrets(t *testing.T, m *kubemesh.Mesh, p *corev1.Pod) (chain, trusted []*x509.Certificate) {
	t.Helper()
	url := m.ProxyAdminURL(p, "/config_dump?resource=dynamic_active_secrets")
	require.NotEmpty(t, url, "pod %s has no address on the node", p.Name)
	var dump struct {
		Configs []struct {
			Name   string `json:"name"`
			Secret struct {
				TLSCertificate struct {
					CertificateChain struct {
						InlineBytes []byte `json:"inline_bytes"`
					} `json:"certificate_chain"`
				} `json:"tls_certificate"`
				ValidationContext struct {
					TrustedCA struct {
						InlineBytes []byte `json:"inline_bytes"`
					} `json:"trusted_ca"`
				} `json:"validation_context"`
			} `json:"secret"`
		} `json:"configs"`
	}
	require.NoError(t, json.Unmarshal(httpGet(t, url), &dump), url)
	for _, c := range dump.Configs {
		chain = append(chain, parsePEM(t, c.Secret.TLSCertificate.CertificateChain.InlineBytes)...)
		trusted = append(trusted, parsePEM(t, c.Secret.ValidationContext.TrustedCA.InlineBytes)...)
	}
	return chain, trusted
}

func parsePEM(t *testing.T, data []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		c, err := x509.ParseCertificate(b.Bytes)
		require.NoError(t, err)
		out = append(out, c)
	}
}

func uris(c *x509.Certificate) []string {
	var out []string
	for _, u := range c.URIs {
		out = append(out, u.String())
	}
	return out
}

// inboundRequests are the istio_requests_total the app's pods' proxies report as
// destination, by connection_security_policy, each label set checked for the caller's
// identity (source_principal: the sample's service account).
func inboundRequests(t *testing.T, ctx context.Context, m *kubemesh.Mesh, app string) map[string]int {
	t.Helper()
	pods, err := m.Cluster.Client.CoreV1().Pods(kubemesh.SampleNamespace).List(ctx,
		metav1.ListOptions{LabelSelector: labels.Set{"app": app}.String()})
	require.NoError(t, err)
	out := map[string]int{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, line := range strings.Split(string(httpGet(t, m.ProxyAdminURL(&p, "/stats"))), "\n") {
			tags, value, ok := strings.Cut(line, "istio_requests_total: ")
			if !ok || !strings.Contains(tags, "reporter=.=destination;") {
				continue
			}
			n, err := strconv.Atoi(strings.TrimSpace(value))
			require.NoError(t, err, line)
			assert.Contains(t, tags, "source_principal=.=spiffe://cluster.local/ns/"+kubemesh.SampleNamespace+"/sa/default;", "the caller's identity")
			_, policy, _ := strings.Cut(tags, "connection_security_policy=.=")
			policy, _, _ = strings.Cut(policy, ";")
			out[policy] += n
		}
	}
	return out
}

func httpGet(t *testing.T, url string) []byte {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, fmt.Sprintf("GET %s: %s", url, b))
	return b
}
