package sidecar_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/internal/sdstest"
	"github.com/wasmesh/wasmesh/agent/internal/testca"
	"github.com/wasmesh/wasmesh/agent/sds"
	"github.com/wasmesh/wasmesh/agent/sidecar"
	"github.com/wasmesh/wasmesh/agent/workloadcert"
)

// The CA in these tests is the agent's in-test stand-in (internal/testca: Istio's
// certificate API over real TLS); discovery's real CA is tested in controlplane.

// sdsOptions is a pod whose proxy is a script that fails unless the SDS socket exists
// when it starts, then waits: what is tested here is the agent's side (meshproxy's SDS
// client is tested in testenv/proxy).
func sdsOptions(t *testing.T, env ...string) (sidecar.Options, *running) {
	o, r := options(t, pod{env: env, proxyConfig: `"terminationDrainDuration":"0s"`})
	dir, err := os.MkdirTemp("", "sds") // a socket path has at most 107 bytes
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	o.SDSSocket = filepath.Join(dir, "socket")
	o.CredentialsDir = filepath.Join(r.dir, "credentials")
	proxy := filepath.Join(r.dir, "proxy.sh")
	require.NoError(t, os.WriteFile(proxy, []byte("#!/bin/sh\n[ -S \"$SDS_SOCKET\" ] || { echo no SDS socket at start >&2; exit 3; }\nexec sleep 3600\n"), 0o755))
	o.BinaryPath, o.ProxyEnv = proxy, []string{"SDS_SOCKET=" + o.SDSSocket}
	return o, r
}

func leafURI(t *testing.T, chain []byte) string {
	t.Helper()
	b, _ := pem.Decode(chain)
	require.NotNil(t, b, "a PEM chain")
	c, err := x509.ParseCertificate(b.Bytes)
	require.NoError(t, err)
	require.Len(t, c.URIs, 1)
	return c.URIs[0].String()
}

// The agent with a CA credential: a CSR for the pod's identity, SDS on the socket before
// the proxy starts, the bootstrap's sds-grpc cluster, and a rotation at half the
// lifetime pushed on the proxy's open stream with no proxy restart.
func TestCertificatesFromTheCAServedBySDS(t *testing.T) {
	ca := testca.Start(t, 3*time.Second)
	token := ca.Allow(t, "web-token", "cluster.local", "shop", "web")
	o, r := sdsOptions(t, sidecar.TokenFileEnv+"="+token, "CA_ADDR="+ca.Addr, "CA_ROOT_CA="+ca.RootFile,
		"ISTIOD_SAN="+testca.ServerName, "SECRET_TTL=3s")
	r.run(t, o)
	assert.Equal(t, o.SDSSocket, r.agent.Params().SDSSocketPath)

	client := sdstest.Dial(t, o.SDSSocket)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cert := sdstest.Watch(ctx, t, client, sds.WorkloadSecret)
	first, _ := cert.Next()
	cert.ACK()
	assert.Equal(t, "spiffe://cluster.local/ns/shop/sa/web", leafURI(t, first.GetTlsCertificate().GetCertificateChain().GetInlineBytes()))
	root, _ := sdstest.Watch(ctx, t, client, sds.RootSecret).Next()
	assert.Equal(t, ca.RootPEM, root.GetValidationContext().GetTrustedCa().GetInlineBytes())

	// SDS serves before the proxy starts: the bootstrap is written when epoch 0 starts.
	var boot []byte
	require.Eventually(t, func() bool {
		var err error
		boot, err = os.ReadFile(filepath.Join(o.ConfigPath, "envoy-rev0.json"))
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "the proxy's bootstrap is written")
	assert.Contains(t, string(boot), `"sds-grpc"`)
	assert.Contains(t, string(boot), `"path": "`+o.SDSSocket+`"`)

	second, _ := cert.Next()
	assert.NotEqual(t, first.GetTlsCertificate().GetCertificateChain().GetInlineBytes(),
		second.GetTlsCertificate().GetCertificateChain().GetInlineBytes(), "rotated on the same stream")
	calls := ca.Calls()
	require.GreaterOrEqual(t, len(calls), 2)
	assert.Equal(t, "web-token", calls[0].Token)
	assert.NotNil(t, calls[1].ClientCert, "the renewal presents the current certificate")
	assert.Equal(t, 1.0, r.agentCounter(t, "wasmesh_agent_proxy_starts_total"), "no proxy restart")
}

// Mounted credentials are served instead of asking a CA, and followed.
func TestMountedCredentialsServedBySDS(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	o, r := sdsOptions(t)
	require.NoError(t, os.MkdirAll(o.CredentialsDir, 0o755))
	write := func(sa string) {
		chain, key := ca.Issue(t, "spiffe://cluster.local/ns/shop/sa/"+sa, time.Hour)
		for name, b := range map[string][]byte{workloadcert.CertChainFile: chain, workloadcert.KeyFile: key, workloadcert.RootCertFile: ca.RootPEM} {
			p := filepath.Join(o.CredentialsDir, name)
			require.NoError(t, os.WriteFile(p+".tmp", b, 0o600))
			require.NoError(t, os.Rename(p+".tmp", p))
		}
	}
	write("mounted")
	r.run(t, o)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cert := sdstest.Watch(ctx, t, sdstest.Dial(t, o.SDSSocket), sds.WorkloadSecret)
	first, _ := cert.Next()
	cert.ACK()
	assert.Equal(t, "spiffe://cluster.local/ns/shop/sa/mounted", leafURI(t, first.GetTlsCertificate().GetCertificateChain().GetInlineBytes()))
	write("remounted")
	second, _ := cert.Next()
	assert.Equal(t, "spiffe://cluster.local/ns/shop/sa/remounted", leafURI(t, second.GetTlsCertificate().GetCertificateChain().GetInlineBytes()))
}

// Without credentials or a CA credential the agent serves no SDS and the bootstrap has
// no sds-grpc cluster, as before.
func TestNoCertificateSourceNoSDS(t *testing.T) {
	o, _ := sdsOptions(t)
	a, err := sidecar.New(o)
	require.NoError(t, err)
	assert.Empty(t, a.Params().SDSSocketPath)
}

func TestCertificateSettingsErrorsAreNamed(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	for env, want := range map[string]string{
		"PILOT_CERT_PROVIDER=kubernetes":      `PILOT_CERT_PROVIDER: "kubernetes" is not supported`,
		"SECRET_TTL=soon":                     `SECRET_TTL: "soon" is not a positive duration`,
		"SECRET_GRACE_PERIOD_RATIO=2":         `SECRET_GRACE_PERIOD_RATIO: "2" is not a ratio`,
		"SECRET_GRACE_PERIOD_RATIO_JITTER=-1": `SECRET_GRACE_PERIOD_RATIO_JITTER: "-1" is not a non-negative ratio`,
		"ECC_SIGNATURE_ALGORITHM=DSA":         `ECC_SIGNATURE_ALGORITHM: key type "DSA"`,
		"SERVICE_ACCOUNT=":                    `service account ""`,
		"CA_ADDR=nohost":                      `CA address "nohost"`,
	} {
		t.Run(strings.Split(env, "=")[0], func(t *testing.T) {
			o, _ := sdsOptions(t, sidecar.TokenFileEnv+"="+token, env)
			_, err := sidecar.New(o)
			assert.ErrorContains(t, err, want)
		})
	}
}
