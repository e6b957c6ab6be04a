// Package workloadcert provides the workload's certificate, key and trusted roots to
// whoever serves them to the proxy (package sds): from the mesh CA by CSR, rotated at
// half the certificate's lifetime and retried with back-off (Rotator), or from mounted
// files, followed as they change (Files).
package workloadcert

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Bundle is one certificate as the proxy gets it: the chain (leaf first) and its key for
// Envoy's tls_certificate, and the roots for its validation_context. All PEM.
type Bundle struct {
	CertChain []byte
	Key       []byte
	Roots     []byte
	// Leaf is the parsed first certificate of the chain.
	Leaf *x509.Certificate
	// TLS is the chain and key, ready to present as a TLS certificate.
	TLS *tls.Certificate
}

// Lifetime is the leaf's validity period.
func (b *Bundle) Lifetime() time.Duration { return b.Leaf.NotAfter.Sub(b.Leaf.NotBefore) }

// NewBundle checks that the key belongs to the chain's leaf and that roots holds at least
// one certificate; the error says which part is wrong.
func NewBundle(chain, key, roots []byte) (*Bundle, error) {
	pair, err := tls.X509KeyPair(chain, key)
	if err != nil {
		return nil, fmt.Errorf("certificate chain and key: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("certificate chain: leaf: %w", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(roots) {
		return nil, fmt.Errorf("root certificates: no PEM certificate")
	}
	pair.Leaf = leaf
	return &Bundle{CertChain: chain, Key: key, Roots: roots, Leaf: leaf, TLS: &pair}, nil
}

// MergeRoots joins PEM root sets, each certificate once, in order: during a root rotation
// the old and the new root are trusted together.
func MergeRoots(sets ...[]byte) []byte {
	var out bytes.Buffer
	seen := map[string]bool{}
	for _, set := range sets {
		for rest := set; ; {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			if b.Type != "CERTIFICATE" || seen[string(b.Bytes)] {
				continue
			}
			seen[string(b.Bytes)] = true
			pem.Encode(&out, b)
		}
	}
	return out.Bytes()
}

// Served tracks the bundle the proxy is served, for the expiry metric and for a CA
// renewal that presents the current certificate.
type Served struct {
	cur atomic.Pointer[Bundle]
	now func() time.Time
}

// NewServed registers wasmesh_agent_cert_expiry_seconds (Istio's agent has the same
// gauge): seconds until the served certificate expires, negative once expired; absent
// until there is one.
func NewServed(reg prometheus.Registerer, now func() time.Time) *Served {
	if now == nil {
		now = time.Now
	}
	s := &Served{now: now}
	if reg != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "wasmesh_agent_cert_expiry_seconds",
			Help: "Seconds until the workload certificate served to the proxy expires (negative: expired); NaN before the first.",
		}, s.expirySeconds))
	}
	return s
}

func (s *Served) expirySeconds() float64 {
	b := s.cur.Load()
	if b == nil {
		return nan()
	}
	return b.Leaf.NotAfter.Sub(s.now()).Seconds()
}

// Set records the bundle now served.
func (s *Served) Set(b *Bundle) { s.cur.Store(b) }

// Current is the bundle served (nil before the first).
func (s *Served) Current() *Bundle { return s.cur.Load() }

// TLSCertificate is the served certificate for a TLS handshake (nil before the first).
func (s *Served) TLSCertificate() *tls.Certificate {
	if b := s.cur.Load(); b != nil {
		return b.TLS
	}
	return nil
}

// Expiry is how near the served certificate is to its end.
type Expiry int

// The states of Expiry.
const (
	NoCertificate Expiry = iota
	Valid
	// ExpiringSoon is less than a quarter of the lifetime left.
	ExpiringSoon
	Expired
)

// Check says how near the served certificate is to its end, and how long it has left.
func (s *Served) Check() (Expiry, time.Duration) {
	b := s.cur.Load()
	if b == nil {
		return NoCertificate, 0
	}
	left := b.Leaf.NotAfter.Sub(s.now())
	switch {
	case left <= 0:
		return Expired, left
	case left < b.Lifetime()/4:
		return ExpiringSoon, left
	}
	return Valid, left
}

// WatchExpiry checks the served certificate every period until ctx ends and logs, when
// the state changes, that it nears its end or has expired: for certificates nobody here
// renews (mounted files).
func (s *Served) WatchExpiry(ctx context.Context, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	last := NoCertificate
	for {
		state, left := s.Check()
		if state != last {
			switch state {
			case ExpiringSoon:
				log.Error("the served workload certificate expires soon and nothing renews it", "expiresIn", left.Round(time.Second))
			case Expired:
				log.Error("the served workload certificate has EXPIRED", "expiredFor", (-left).Round(time.Second))
			}
			last = state
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// describe names a bundle in logs.
func describe(b *Bundle) []any {
	id := ""
	if len(b.Leaf.URIs) > 0 {
		id = b.Leaf.URIs[0].String()
	}
	return []any{"identity", id, "serial", b.Leaf.SerialNumber.Text(16), "notAfter", b.Leaf.NotAfter.UTC().Format(time.RFC3339)}
}

func nan() float64 { return math.NaN() }
