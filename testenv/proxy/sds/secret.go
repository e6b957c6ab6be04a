// Package sds is meshproxy's secret manager: static secrets from the bootstrap, inline and
// file data sources, and Envoy's SDS client (envoy.service.secret.v3.SecretDiscoveryService
// StreamSecrets, State of the World, one stream per secret as Envoy opens one subscription
// per SdsSecretConfig) over a static envoy_grpc cluster, ACKing and NACKing as Envoy does.
// A Provider is one secret's current value; its user (a TLS context) reads it at each
// handshake, so a new version applies to new connections only. A Provider is done once
// its first value arrived or its initial_fetch_timeout passed (Envoy's init target): the
// listeners and clusters using it warm until then.
package sds

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/wasmesh/wasmesh/testenv/proxy/internal/latch"
)

// Secret is a secret checked and parsed.
type Secret struct {
	Proto       *tlsv3.Secret
	Version     string
	LastUpdated time.Time
	// Cert is the tls_certificate's chain and key (nil for a validation context).
	Cert *tls.Certificate
	// Validation is the validation_context, RootCerts its parsed trusted_ca (nil when the
	// context names none).
	Validation *tlsv3.CertificateValidationContext
	RootCerts  []*x509.Certificate
}

// ReadDataSource reads an Envoy DataSource (inline bytes or string, or a file).
func ReadDataSource(ds *corev3.DataSource) ([]byte, error) {
	switch s := ds.GetSpecifier().(type) {
	case *corev3.DataSource_InlineBytes:
		return s.InlineBytes, nil
	case *corev3.DataSource_InlineString:
		return []byte(s.InlineString), nil
	case *corev3.DataSource_Filename:
		b, err := os.ReadFile(s.Filename)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", s.Filename, err)
		}
		return b, nil
	case nil:
		return nil, nil
	}
	return nil, fmt.Errorf("data source %T is not supported", ds.GetSpecifier())
}

// Compile checks and parses a secret. Errors never include the secret's data.
func Compile(s *tlsv3.Secret) (*Secret, error) {
	if err := s.ValidateAll(); err != nil {
		return nil, fmt.Errorf("secret %s: %w", s.GetName(), err)
	}
	out := &Secret{Proto: s, LastUpdated: time.Now()}
	switch t := s.GetType().(type) {
	case *tlsv3.Secret_TlsCertificate:
		c, err := CompileCertificate(t.TlsCertificate)
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", s.GetName(), err)
		}
		out.Cert = c
	case *tlsv3.Secret_ValidationContext:
		roots, err := ParseRoots(t.ValidationContext)
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", s.GetName(), err)
		}
		out.Validation, out.RootCerts = t.ValidationContext, roots
	default:
		return nil, fmt.Errorf("secret %s: only tls_certificate and validation_context secrets are supported, not %T", s.GetName(), s.GetType())
	}
	return out, nil
}

// CompileCertificate parses a TlsCertificate's chain and private key.
func CompileCertificate(tc *tlsv3.TlsCertificate) (*tls.Certificate, error) {
	chain, err := ReadDataSource(tc.GetCertificateChain())
	if err != nil {
		return nil, fmt.Errorf("certificate_chain: %w", err)
	}
	key, err := ReadDataSource(tc.GetPrivateKey())
	if err != nil {
		return nil, fmt.Errorf("private_key: %w", err)
	}
	if len(chain) == 0 || len(key) == 0 {
		return nil, errors.New("tls_certificate needs a certificate_chain and a private_key")
	}
	c, err := tls.X509KeyPair(chain, key)
	if err != nil {
		// crypto/tls's messages name the PEM block types, never their contents.
		return nil, fmt.Errorf("failed to load certificate chain and private key: %w", err)
	}
	return &c, nil
}

// CheckValidation refuses the verification settings meshproxy does not implement, so that
// none is silently skipped.
func CheckValidation(vc *tlsv3.CertificateValidationContext) error {
	switch {
	case len(vc.GetVerifyCertificateSpki()) > 0:
		return errors.New("verify_certificate_spki is not supported")
	case vc.GetCrl() != nil:
		return errors.New("crl is not supported")
	case vc.GetCustomValidatorConfig() != nil:
		return errors.New("custom_validator_config is not supported")
	case vc.GetTrustChainVerification() != tlsv3.CertificateValidationContext_VERIFY_TRUST_CHAIN:
		return fmt.Errorf("trust_chain_verification %s is not supported", vc.GetTrustChainVerification())
	}
	return nil
}

// ParseRoots checks a validation context and parses its trusted_ca (nil without one).
func ParseRoots(vc *tlsv3.CertificateValidationContext) ([]*x509.Certificate, error) {
	if err := CheckValidation(vc); err != nil {
		return nil, err
	}
	b, err := ReadDataSource(vc.GetTrustedCa())
	if err != nil {
		return nil, fmt.Errorf("trusted_ca: %w", err)
	}
	if vc.GetTrustedCa() == nil {
		return nil, nil
	}
	var out []*x509.Certificate
	for len(b) > 0 {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("trusted_ca: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("trusted_ca: failed to load trusted CA certificates: no PEM certificate found")
	}
	return out, nil
}

// Provider is one secret as its users see it.
type Provider struct {
	Name string
	// Source is the SDS cluster ("" for a static or inline secret).
	Source string

	cur  atomic.Pointer[Secret]
	done latch.Latch // set once a value arrived or the initial fetch ended without one
}

// NewStatic is a provider with a fixed secret (inline in a TLS context, or a bootstrap
// static secret).
func NewStatic(s *Secret) *Provider {
	p := &Provider{Name: s.Proto.GetName()}
	p.cur.Store(s)
	p.done.Set()
	return p
}

// Current is the secret's current value (nil before the first).
func (p *Provider) Current() *Secret { return p.cur.Load() }

// Done reports whether the provider's initialization ended: a value arrived or the
// initial fetch timeout passed.
func (p *Provider) Done() bool { return p.done.IsSet() }

// OnDone calls f once the provider is done (at once if it already is).
func (p *Provider) OnDone(f func()) { p.done.OnSet(f) }

func (p *Provider) finish() { p.done.Set() }

func (p *Provider) set(s *Secret) {
	p.cur.Store(s)
	p.finish()
}
