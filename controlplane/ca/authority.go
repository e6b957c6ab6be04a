// Package ca is the mesh's certificate authority: a self-signed root generated on first
// start and kept (in a directory, or in istiod's Secret istio-ca-secret shared by every
// replica), or an intermediate plugged in from Istio's cacerts; it signs workload
// certificates with SPIFFE identities, serving certificates for discovery's own servers, and
// serves Istio's certificate API (istio.v1.auth.IstioCertificateService).
package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"
)

// Files of a CA, Istio's names: in istio-ca-secret, in the cacerts Secret or directory, and
// in --caDir.
const (
	CACertFile    = "ca-cert.pem"    // the signing CA's certificate
	CAKeyFile     = "ca-key.pem"     // its key
	CertChainFile = "cert-chain.pem" // the signing CA's chain up to the root (empty for a root)
	RootCertFile  = "root-cert.pem"  // the roots workloads trust (old and new during a rotation)
)

// Lifetimes, Istio's defaults.
const (
	RootTTL            = 10 * 365 * 24 * time.Hour
	DefaultWorkloadTTL = 24 * time.Hour
	MaxWorkloadTTL     = 90 * 24 * time.Hour
	rootCommonName     = "wasmesh root CA"
)

// Authority is a CA: the certificate and key it signs with, the chain from it to the root,
// and the roots.
type Authority struct {
	CertPEM, KeyPEM []byte
	// ChainPEM is the signing certificate's chain up to the root, as cert-chain.pem holds it
	// (empty when the CA is the root itself).
	ChainPEM []byte
	// RootPEM is every root a workload trusts: the CA's root, and during a root rotation the
	// other one too.
	RootPEM []byte
	Cert    *x509.Certificate
	Key     crypto.Signer
	// chain is the DER of the certificates between a leaf and the root: the signing
	// certificate and its intermediates, no root (nothing for a self-signed CA).
	chain [][]byte
	roots *x509.CertPool
}

// NewSelfSigned makes a self-signed ECDSA P-256 root valid for RootTTL.
func NewSelfSigned(now time.Time) (*Authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("root CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: rootCommonName, Organization: []string{"wasmesh"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(RootTTL),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("root CA certificate: %w", err)
	}
	keyPEM, err := PEMKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := PEMCert(der)
	return Parse(certPEM, keyPEM, nil, certPEM)
}

// Parse reads a CA from its files' contents. An empty rootPEM means the CA is its own root;
// the signing certificate must chain (through chainPEM) to one of the roots.
func Parse(certPEM, keyPEM, chainPEM, rootPEM []byte) (*Authority, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s and %s: %w", CACertFile, CAKeyFile, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CACertFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s: the certificate (subject %q) is not a CA's", CACertFile, cert.Subject)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: the key cannot sign", CAKeyFile)
	}
	a := &Authority{CertPEM: PEMCert(pair.Certificate[0]), KeyPEM: keyPEM, ChainPEM: chainPEM, RootPEM: rootPEM, Cert: cert, Key: signer,
		roots: x509.NewCertPool()}
	if len(bytes.TrimSpace(rootPEM)) == 0 {
		a.RootPEM = a.CertPEM
	}
	rootCerts, err := parseCerts(a.RootPEM)
	if err != nil || len(rootCerts) == 0 {
		return nil, fmt.Errorf("%s holds no certificate: %v", RootCertFile, err)
	}
	for _, r := range rootCerts {
		a.roots.AddCert(r)
	}
	chainCerts, err := parseCerts(chainPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CertChainFile, err)
	}
	if err := a.buildChain(chainCerts, rootCerts); err != nil {
		return nil, err
	}
	return a, nil
}

// buildChain keeps the signing certificate and the chain's intermediates (not the roots) and
// checks that they lead to a root.
func (a *Authority) buildChain(chainCerts, rootCerts []*x509.Certificate) error {
	isRoot := func(c *x509.Certificate) bool {
		for _, r := range rootCerts {
			if c.Equal(r) {
				return true
			}
		}
		return false
	}
	inter := x509.NewCertPool()
	if !isRoot(a.Cert) {
		a.chain = append(a.chain, a.Cert.Raw)
	}
	for _, c := range chainCerts {
		if !isRoot(c) && !c.Equal(a.Cert) {
			a.chain = append(a.chain, c.Raw)
			inter.AddCert(c)
		}
	}
	if _, err := a.Cert.Verify(x509.VerifyOptions{Roots: a.roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("%s (subject %q) does not chain to %s: %w", CACertFile, a.Cert.Subject, RootCertFile, err)
	}
	return nil
}

// Roots is the pool of the roots workloads trust.
func (a *Authority) Roots() *x509.CertPool { return a.roots }

// Intermediates is a pool of the certificates between a leaf this CA signs and the root.
func (a *Authority) Intermediates() *x509.CertPool {
	p := x509.NewCertPool()
	for _, der := range a.chain {
		if c, err := x509.ParseCertificate(der); err == nil {
			p.AddCert(c)
		}
	}
	return p
}

// ChainPEMs is Istio's answer after the leaf: each certificate between the leaf and the
// root, then the roots (root-cert.pem) as the last element.
func (a *Authority) ChainPEMs() []string {
	out := make([]string, 0, len(a.chain)+1)
	for _, der := range a.chain {
		out = append(out, string(PEMCert(der)))
	}
	return append(out, string(a.RootPEM))
}

// sign signs tmpl for pub, its lifetime cut to the CA's.
func (a *Authority) sign(tmpl *x509.Certificate, pub any) ([]byte, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	if tmpl.NotAfter.After(a.Cert.NotAfter) {
		tmpl.NotAfter = a.Cert.NotAfter
	}
	return x509.CreateCertificate(rand.Reader, tmpl, a.Cert, pub, a.Key)
}

// IssueServing signs a TLS server certificate (ECDSA P-256 key) for names, each a DNS name or
// an IP address, valid for ttl from now; the chain up to the root is in it.
func (a *Authority) IssueServing(names []string, ttl time.Duration, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, errors.New("a serving certificate needs at least one name")
	}
	tmpl := &x509.Certificate{
		Subject:   pkix.Name{CommonName: names[0]},
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(ttl),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range names {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := a.sign(tmpl, &key.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("signing the serving certificate for %v: %w", names, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: append([][]byte{der}, a.chain...), PrivateKey: key, Leaf: leaf}, nil
}

// SignWorkload signs a workload certificate for pub naming id (its only SAN), for both
// server and client TLS, valid for ttl from now (cut to the CA's lifetime).
func (a *Authority) SignWorkload(pub any, id *url.URL, ttl time.Duration, now time.Time) ([]byte, error) {
	tmpl := &x509.Certificate{
		URIs:      []*url.URL{id},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(ttl),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := a.sign(tmpl, pub)
	if err != nil {
		return nil, fmt.Errorf("signing the certificate of %s: %w", id, err)
	}
	return PEMCert(der), nil
}

// PEMCert encodes a certificate.
func PEMCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// PEMKey encodes a private key as PKCS #8.
func PEMKey(key any) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding the key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseCerts reads every CERTIFICATE block of a PEM bundle.
func parseCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return out, nil
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}
