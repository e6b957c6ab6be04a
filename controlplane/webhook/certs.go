package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/dirwatch"
)

// Files of a certificate directory (--webhookCertDir), as a kubernetes.io/tls Secret with a
// ca.crt (cert-manager's) mounts them.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// current holds the serving certificate and CA bundle in force, and tells who waits when
// the bundle changes.
type current struct {
	mu      sync.RWMutex
	cert    *tls.Certificate
	ca      []byte
	changed chan struct{}
}

func newCurrent() *current { return &current{changed: make(chan struct{})} }

func (c *current) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.cert == nil {
		return nil, errors.New("webhook: no serving certificate yet")
	}
	return c.cert, nil
}

// WaitServing returns once a serving certificate is in force (at once if one is), or with
// ctx's error: a TLS port served before would fail its first handshakes.
func (c *current) WaitServing(ctx context.Context) error {
	for {
		changed := c.Changed() // before the check, so a certificate set in between wakes us
		c.mu.RLock()
		ready := c.cert != nil
		c.mu.RUnlock()
		if ready {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *current) CABundle() []byte {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.ca
}

func (c *current) Changed() <-chan struct{} {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.changed
}

// set puts cert and ca in force; a new ca wakes whoever waits on Changed.
func (c *current) set(cert *tls.Certificate, ca []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cert = cert
	if !bytes.Equal(ca, c.ca) {
		c.ca = ca
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// FileCerts serves the certificate of a directory (tls.crt, tls.key, and the ca.crt that
// signed it), reloaded whenever the directory changes (a mounted Secret is swapped in
// whole); a change that does not load keeps the last good pair.
type FileCerts struct {
	*current
	dir string
	log *slog.Logger
}

// NewFileCerts loads the directory's certificates; they must load.
func NewFileCerts(dir string, log *slog.Logger) (*FileCerts, error) {
	if log == nil {
		log = slog.Default()
	}
	f := &FileCerts{current: newCurrent(), dir: dir, log: log.With("scope", "webhook")}
	if err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *FileCerts) load() error {
	read := func(name string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(f.dir, name))
		if err != nil {
			return nil, fmt.Errorf("webhookCertDir: %w", err)
		}
		return b, nil
	}
	certPEM, err := read(CertFile)
	if err != nil {
		return err
	}
	keyPEM, err := read(KeyFile)
	if err != nil {
		return err
	}
	caPEM, err := read(CAFile)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("webhookCertDir %s: %s and %s: %w", f.dir, CertFile, KeyFile, err)
	}
	if err := verifyChain(cert, caPEM); err != nil {
		return fmt.Errorf("webhookCertDir %s: %w", f.dir, err)
	}
	f.set(&cert, caPEM)
	return nil
}

// verifyChain checks that the serving certificate chains to the CA bundle: a caBundle that
// does not would have the API server refuse every call.
func verifyChain(cert tls.Certificate, caPEM []byte) error {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("%s holds no PEM certificate", CAFile)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("%s: %w", CertFile, err)
	}
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("%s is not signed by %s: %w", CertFile, CAFile, err)
	}
	return nil
}

// Run reloads the certificates whenever the directory changes, until ctx ends.
func (f *FileCerts) Run(ctx context.Context) error {
	if err := dirwatch.Run(ctx, f.dir, f.log, f.reload); err != nil {
		return fmt.Errorf("webhookCertDir: %w", err)
	}
	return nil
}

func (f *FileCerts) reload() {
	before := f.CABundle()
	if err := f.load(); err != nil {
		f.log.Warn("webhook certificates not reloaded; serving the last good ones", "error", err)
		return
	}
	if !bytes.Equal(before, f.CABundle()) {
		f.log.Info("webhook CA changed", "dir", f.dir)
	}
}
