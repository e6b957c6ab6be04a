package localmesh

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/wasmesh/wasmesh/controlplane/ca"
)

// tlsModeLabel marks a workload whose sidecar takes mutual TLS (Istio's auto mTLS reads it
// from the endpoint's labels).
const tlsModeLabel = "security.istio.io/tlsMode"

// credentialLifetime is how long a pod's credential is good for: the life of any local
// mesh (a Kubernetes projected token is refreshed by the kubelet; a local pod's credential
// is not).
const credentialLifetime = 30 * 24 * time.Hour

// identity is the local mesh's stand-in for the Kubernetes parts of workload identity: the
// runner holds the Ed25519 key that signs each pod's credential (what a projected
// service-account token is on Kubernetes) and gives discovery only the public key, so no
// pod, and not discovery, can make a credential for another identity (docs/contracts.md).
type identity struct {
	key        ed25519.PrivateKey
	caDir      string // discovery's --caDir: root-cert.pem is the mesh root pods trust
	keyFile    string // discovery's --localCredentialKey
	secureAddr string // discovery's TLS port: the CA (and xDS once it is served there)
}

// newIdentity makes the credential key; discovery's secure port is secureAddr.
func newIdentity(dir, secureAddr string) (*identity, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	id := &identity{key: key, caDir: filepath.Join(dir, "ca"), keyFile: filepath.Join(dir, "ca", "credential-key.pem"),
		secureAddr: secureAddr}
	if err := os.MkdirAll(id.caDir, 0o700); err != nil {
		return nil, err
	}
	b, err := ca.MarshalCredentialKey(pub)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(id.keyFile, b, 0o644); err != nil {
		return nil, err
	}
	return id, nil
}

// discoveryArgs are discovery's flags for the CA and xDS over TLS only (mutual TLS between
// sidecars is discovery's default).
func (id *identity) discoveryArgs() []string {
	return []string{"--secureGRPCAddr", id.secureAddr, "--caDir", id.caDir, "--localCredentialKey", id.keyFile}
}

// RootFile is the mesh's root certificate (discovery writes it on its first start).
func (id *identity) rootFile() string { return filepath.Join(id.caDir, "root-cert.pem") }

// podEnv writes the pod's credential into its directory and returns the agent's variables
// that make it ask discovery's CA for its certificate and serve it to the proxy by SDS.
func (id *identity) podEnv(p *Pod) ([]string, error) {
	// The pod IP is the one address its proxy may claim (INSTANCE_IPS) on xDS.
	cred, err := ca.MintCredential(id.key, p.Spec.Namespace, p.Spec.ServiceAccount, time.Now().Add(credentialLifetime), p.IP)
	if err != nil {
		return nil, fmt.Errorf("localmesh: credential of pod %s: %w", p.Spec.Name, err)
	}
	file := p.CredentialFile()
	if err := os.WriteFile(file, []byte(cred), 0o600); err != nil {
		return nil, err
	}
	return []string{"WASMESH_CA_TOKEN_FILE=" + file, "CA_ADDR=" + id.secureAddr, "CA_ROOT_CA=" + id.rootFile()}, nil
}

// CADir is discovery's CA directory (ca-cert.pem, ca-key.pem, root-cert.pem); "" without
// identity.
func (m *Mesh) CADir() string {
	if m.identity == nil {
		return ""
	}
	return m.identity.caDir
}

// CredentialFile is the pod's credential (what its agent shows the CA and discovery).
func (p *Pod) CredentialFile() string { return filepath.Join(p.Dir, "pod", "credential") }
