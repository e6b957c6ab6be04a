package ca

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Kubernetes names, istiod's: the self-signed CA's Secret (type istio.io/ca-root), the
// plugged-in CA's Secret, and the ConfigMap of the root in every namespace.
const (
	DefaultSecret = "istio-ca-secret"
	PluggedSecret = "cacerts"
	RootConfigMap = "istio-ca-root-cert"
	SecretType    = corev1.SecretType("istio.io/ca-root")
)

// readDir reads a CA's four files from dir; cert-chain.pem and root-cert.pem may be absent.
// It reports fs.ErrNotExist (wrapped) when ca-cert.pem is absent.
func readDir(dir string) (*Authority, error) {
	files := map[string][]byte{}
	for _, name := range []string{CACertFile, CAKeyFile, CertChainFile, RootCertFile} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil && !(errors.Is(err, fs.ErrNotExist) && (name == CertChainFile || name == RootCertFile)) {
			return nil, fmt.Errorf("CA directory %s: %w", dir, err)
		}
		files[name] = b
	}
	a, err := Parse(files[CACertFile], files[CAKeyFile], files[CertChainFile], files[RootCertFile])
	if err != nil {
		return nil, fmt.Errorf("CA directory %s: %w", dir, err)
	}
	return a, nil
}

// LoadPluggedDir reads a plugged-in CA (Istio's cacerts files: ca-cert.pem, ca-key.pem,
// cert-chain.pem, root-cert.pem) from dir. They must load.
func LoadPluggedDir(dir string) (*Authority, error) {
	a, err := readDir(dir)
	if err != nil {
		return nil, fmt.Errorf("caCertsDir: %w", err)
	}
	return a, nil
}

// LoadOrCreateDir reads the CA kept in dir, or, when dir holds none, makes a self-signed root
// and keeps it there (the key readable by the owner only). Either way root-cert.pem in dir is
// the roots workloads trust.
func LoadOrCreateDir(dir string, now time.Time) (*Authority, bool, error) {
	a, err := readDir(dir)
	if err == nil {
		return a, false, writeFile(dir, RootCertFile, a.RootPEM, 0o644)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	if a, err = NewSelfSigned(now); err != nil {
		return nil, false, err
	}
	// The certificate last: a directory with ca-cert.pem holds a whole CA.
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{CAKeyFile, a.KeyPEM, 0o600}, {RootCertFile, a.RootPEM, 0o644}, {CertChainFile, nil, 0o644}, {CACertFile, a.CertPEM, 0o644}} {
		if err := writeFile(dir, f.name, f.data, f.mode); err != nil {
			return nil, false, err
		}
	}
	return a, true, nil
}

// writeFile replaces dir/name whole (a reader sees the old file or the new one).
func writeFile(dir, name string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("CA directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return fmt.Errorf("CA directory: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("CA directory: writing %s: %w", name, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("CA directory: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("CA directory: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("CA directory: %w", err)
	}
	return nil
}

// SecretStore keeps a self-signed CA in a Secret every replica shares.
type SecretStore struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string // default DefaultSecret
	Log       *slog.Logger
}

func (s SecretStore) name() string {
	if s.Name == "" {
		return DefaultSecret
	}
	return s.Name
}

// Shared reads the CA Secret; when there is none it creates it (with inUse, else a new
// root), and when another replica created it first it reads theirs. The Secret is in
// istiod's shape: type istio.io/ca-root, ca-cert.pem and ca-key.pem, cert-chain.pem empty,
// root-cert.pem the certificate; a kubernetes.io/tls Secret (tls.crt, tls.key) is read too.
func (s SecretStore) Shared(ctx context.Context, inUse *Authority, now time.Time) (*Authority, error) {
	secrets := s.Client.CoreV1().Secrets(s.Namespace)
	where := s.Namespace + "/" + s.name()
	sec, err := secrets.Get(ctx, s.name(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		a := inUse
		if a == nil {
			if a, err = NewSelfSigned(now); err != nil {
				return nil, err
			}
		}
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: s.name(), Namespace: s.Namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "wasmesh-discovery"}},
			Type: SecretType,
			Data: map[string][]byte{CACertFile: a.CertPEM, CAKeyFile: a.KeyPEM, CertChainFile: a.ChainPEM, RootCertFile: a.RootPEM},
		}, metav1.CreateOptions{})
		if err == nil {
			if s.Log != nil {
				s.Log.Info("CA Secret created", "secret", where)
			}
			return a, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating the CA Secret %s: %w", where, err)
		}
		// Another replica created it first: theirs is the CA.
		sec, err = secrets.Get(ctx, s.name(), metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("reading the CA Secret %s: %w", where, err)
	}
	a, err := fromSecret(sec)
	if err != nil {
		return nil, fmt.Errorf("CA Secret %s: %w", where, err)
	}
	return a, nil
}

// fromSecret reads a CA from Istio's keys, or from a kubernetes.io/tls Secret's.
func fromSecret(sec *corev1.Secret) (*Authority, error) {
	d := sec.Data
	certPEM, keyPEM := d[CACertFile], d[CAKeyFile]
	if len(certPEM) == 0 && len(keyPEM) == 0 {
		certPEM, keyPEM = d[corev1.TLSCertKey], d[corev1.TLSPrivateKeyKey]
	}
	return Parse(certPEM, keyPEM, d[CertChainFile], d[RootCertFile])
}

// PluggedFromSecret reads the plugged-in CA of the Secret cacerts in namespace, as istiod
// does; nil without one.
func PluggedFromSecret(ctx context.Context, client kubernetes.Interface, namespace string) (*Authority, error) {
	sec, err := client.CoreV1().Secrets(namespace).Get(ctx, PluggedSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the plugged-in CA Secret %s/%s: %w", namespace, PluggedSecret, err)
	}
	a, err := fromSecret(sec)
	if err != nil {
		return nil, fmt.Errorf("plugged-in CA Secret %s/%s: %w", namespace, PluggedSecret, err)
	}
	return a, nil
}
