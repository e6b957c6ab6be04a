// Package csr makes a workload's private key and the certificate signing request that
// asks the mesh CA for its SPIFFE identity, as pilot-agent does: ECDSA P-256 by default,
// RSA 2048 when asked for.
package csr

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net/url"
	"strings"
)

// KeyType is the workload key's algorithm.
type KeyType string

// The key types pilot-agent offers.
const (
	ECDSA KeyType = "ECDSA"
	RSA   KeyType = "RSA"
)

// RSABits is pilot-agent's RSA key size.
const RSABits = 2048

// ParseKeyType reads a key type, as ECC_SIGNATURE_ALGORITHM names it (ECDSA) or "RSA";
// the empty string is the default, ECDSA.
func ParseKeyType(s string) (KeyType, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "", "ECDSA", "EC", "P256":
		return ECDSA, nil
	case "RSA":
		return RSA, nil
	}
	return "", fmt.Errorf("key type %q: want ECDSA (P-256) or RSA", s)
}

// SPIFFEID is Istio's workload identity.
func SPIFFEID(trustDomain, namespace, serviceAccount string) (*url.URL, error) {
	for _, f := range [][2]string{{"trust domain", trustDomain}, {"namespace", namespace}, {"service account", serviceAccount}} {
		if f[1] == "" || strings.ContainsAny(f[1], "/?#") {
			return nil, fmt.Errorf("SPIFFE identity: %s %q is empty or has /, ? or #", f[0], f[1])
		}
	}
	return &url.URL{Scheme: "spiffe", Host: trustDomain, Path: "/ns/" + namespace + "/sa/" + serviceAccount}, nil
}

// Request is a private key and the CSR made with it, both PEM.
type Request struct {
	CSR []byte
	Key []byte
	// Signer is the private key itself (for a TLS client certificate).
	Signer crypto.Signer
}

// New generates a key of the given type and a CSR naming id as its only URI SAN, the
// form Istio's CA expects (the CA puts the caller's identity in the certificate anyway).
func New(t KeyType, id *url.URL) (*Request, error) {
	key, err := generate(t)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.CertificateRequest{
		Subject: pkix.Name{Organization: []string{"wasmesh"}},
		URIs:    []*url.URL{id},
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, fmt.Errorf("certificate request for %s: %w", id, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding the %s key: %w", t, err)
	}
	return &Request{
		CSR:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		Key:    pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
		Signer: key,
	}, nil
}

func generate(t KeyType) (crypto.Signer, error) {
	switch t {
	case ECDSA, "":
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generating an ECDSA P-256 key: %w", err)
		}
		return k, nil
	case RSA:
		k, err := rsa.GenerateKey(rand.Reader, RSABits)
		if err != nil {
			return nil, fmt.Errorf("generating an RSA %d key: %w", RSABits, err)
		}
		return k, nil
	}
	return nil, fmt.Errorf("key type %q: want ECDSA or RSA", t)
}

// Parse decodes a PEM CSR and checks its signature.
func Parse(pemCSR []byte) (*x509.CertificateRequest, error) {
	b, _ := pem.Decode(pemCSR)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("certificate request: no PEM CERTIFICATE REQUEST block")
	}
	r, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	if err := r.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request: bad signature: %w", err)
	}
	return r, nil
}
