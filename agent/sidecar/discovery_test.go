package sidecar_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
	"github.com/wasmesh/wasmesh/agent/sidecar"
)

var discoveryBuild struct {
	dir  string // TestMain's, removed when the tests end
	once sync.Once
	path string
	err  error
}

// discoveryBinary is the mesh's real discovery: $WASMESH_BIN_DIR/discovery when it exists
// (the Makefile builds it), else built once per test binary (built, not imported: the
// agent imports nothing of the control plane).
func discoveryBinary(t *testing.T) string {
	discoveryBuild.once.Do(func() {
		if bin := os.Getenv("WASMESH_BIN_DIR"); bin != "" {
			if _, err := os.Stat(filepath.Join(bin, "discovery")); err == nil {
				discoveryBuild.path = filepath.Join(bin, "discovery")
				return
			}
		}
		discoveryBuild.path, discoveryBuild.err = proxytest.BuildPackage(discoveryBuild.dir, "github.com/wasmesh/wasmesh/controlplane/cmd/discovery", "discovery")
	})
	require.NoError(t, discoveryBuild.err, "the agent's tests need the controlplane module in the Go workspace (go.work)")
	return discoveryBuild.path
}

// realDiscovery is discovery running as a process with its CA in caDir, local-mesh
// credentials checked with credKey, and xDS on its secure port only, until the test ends.
type realDiscovery struct {
	t                    *testing.T
	addr, caDir, credKey string
	stop                 func()
}

func startRealDiscovery(t *testing.T, caDir, credKey string) *realDiscovery {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	d := &realDiscovery{t: t, addr: l.Addr().String(), caDir: caDir, credKey: credKey}
	l.Close()
	d.start()
	t.Cleanup(func() { d.stop() })
	return d
}

// start runs discovery and returns once its secure port accepts.
func (d *realDiscovery) start() {
	t := d.t
	cmd := exec.Command(discoveryBinary(t), "--configDir", t.TempDir(), "--secureGRPCAddr", d.addr, "--caDir", d.caDir,
		"--localCredentialKey", d.credKey, "--httpAddr", "127.0.0.1:0", "--webhookAddr", "")
	cmd.Stdout, cmd.Stderr = logWriter{t}, logWriter{t}
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	d.stop = func() { _ = cmd.Process.Kill(); <-exited }
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", d.addr)
		if err == nil {
			c.Close()
		}
		_, rootErr := os.Stat(filepath.Join(d.caDir, "root-cert.pem"))
		return err == nil && rootErr == nil
	}, 60*time.Second, 50*time.Millisecond, "discovery serving on %s", d.addr)
}

// credentialIssuer makes local-mesh credentials as docs/contracts.md defines them (the
// runner's part): wasmesh1.<payload>.<signature>, Ed25519 over "wasmesh1.<payload>".
type credentialIssuer struct {
	key     ed25519.PrivateKey
	keyFile string // the public key, PEM PKIX, for discovery's --localCredentialKey
}

func newCredentialIssuer(t *testing.T) credentialIssuer {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	f := filepath.Join(t.TempDir(), "credential-key.pem")
	require.NoError(t, os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600))
	return credentialIssuer{key: key, keyFile: f}
}

// issue writes the credential of namespace/sa holding ips to a file and returns its path.
func (c credentialIssuer) issue(t *testing.T, ns, sa string, ips ...string) string {
	payload, err := json.Marshal(map[string]any{"ns": ns, "sa": sa, "aud": "istio-ca", "exp": time.Now().Add(time.Hour).Unix(), "ips": ips})
	require.NoError(t, err)
	signed := "wasmesh1." + base64.RawURLEncoding.EncodeToString(payload)
	cred := signed + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(c.key, []byte(signed)))
	f := filepath.Join(t.TempDir(), "credential")
	require.NoError(t, os.WriteFile(f, []byte(cred), 0o600))
	return f
}

// The mesh's real discovery, serving xDS on its authenticated TLS port only, configures
// meshproxy through the agent's XDS proxy as the local mesh runs a pod: the pod's
// credential gets it a certificate from discovery's CA and authenticates its xDS streams,
// discovery's certificate is verified against the mesh root and istiod's name, and the
// node (namespace, service account, the pod IP) is authorized for that credential.
func TestRealDiscoveryThroughTheXDSProxy(t *testing.T) {
	caDir, issuer := t.TempDir(), newCredentialIssuer(t)
	disc := startRealDiscovery(t, caDir, issuer.keyFile)
	addr := disc.addr
	root := filepath.Join(caDir, "root-cert.pem")

	o, r := options(t, pod{})
	cred := issuer.issue(t, "shop", "web", r.ip)
	env := []string{"WASMESH_XDS_PLAINTEXT=false", sidecar.TokenFileEnv + "=" + cred, "CA_ADDR=" + addr, "CA_ROOT_CA=" + root,
		`PROXY_CONFIG={"discoveryAddress":"` + addr + `","terminationDrainDuration":"0s"}`}
	o.Env = append(o.Env, env...)
	dir, err := os.MkdirTemp("", "xds") // a socket path has at most 107 bytes
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	o.SDSSocket, o.XDSSocket = filepath.Join(dir, "sds"), filepath.Join(dir, "XDS")
	o.CredentialsDir = filepath.Join(r.dir, "credentials")
	r.run(t, o)

	require.Eventually(t, r.readyIs(200, ""), 30*time.Second, 50*time.Millisecond,
		"configured by discovery (CDS and LDS) through the XDS proxy")
	require.Eventually(t, func() bool {
		_, body := r.get("/stats/prometheus", 15020)
		return strings.Contains(body, `wasmesh_agent_cert_requests_total{result="ok"} 1`)
	}, 30*time.Second, 50*time.Millisecond, "a certificate from discovery's CA")
	code, body := r.get("/stats/prometheus", 15020)
	require.Equal(t, 200, code)
	assert.Contains(t, body, "wasmesh_xds_proxy_upstream_streams 1", "the proxy's stream to discovery is open")
	assert.NotContains(t, body, `wasmesh_agent_cert_requests_total{result="Unavailable"}`, "the CA's certificate verified at once")

	// Discovery restarts: the proxy's stream ends, the proxy keeps its configuration (still
	// ready) and reconnects through the XDS proxy to the new discovery.
	disc.stop()
	require.Eventually(t, func() bool {
		_, body := r.get("/stats/prometheus", 15020)
		return strings.Contains(body, "wasmesh_xds_proxy_upstream_streams 0")
	}, 10*time.Second, 20*time.Millisecond)
	code, _ = r.get("/healthz/ready", 15020)
	assert.Equal(t, 200, code, "configured, the pod stays ready while discovery is away")
	disc.start()
	require.Eventually(t, func() bool {
		_, body := r.get("/stats/prometheus", 15020)
		return strings.Contains(body, "wasmesh_xds_proxy_upstream_streams 1") && !strings.Contains(body, "istiod_connection_terminations 0")
	}, 30*time.Second, 50*time.Millisecond, "the proxy's stream is open again")
}
