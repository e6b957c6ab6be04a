// Package tlsctx is Envoy's envoy.transport_sockets.tls for meshproxy: a
// DownstreamTlsContext (listener filter chains) or UpstreamTlsContext (clusters) compiled
// into handshakes whose certificate and trust come from sds providers read at each
// handshake (a new secret version applies to new connections, open ones keep theirs),
// peer verification as Envoy's default certificate validator (chain to the trusted CA,
// expiry, match_typed_subject_alt_names, verify_certificate_hash), and Envoy's ssl.*
// statistics.
package tlsctx

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"

	"github.com/wasmesh/wasmesh/testenv/proxy/sds"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

// Transport socket names and the TLS contexts' type URLs.
const (
	SocketTLS       = "envoy.transport_sockets.tls"
	SocketRawBuffer = "envoy.transport_sockets.raw_buffer"
	downstreamType  = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
	upstreamType    = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
	rawBufferType   = "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"
)

// Stats are Envoy's ssl.* statistics of a listener or cluster.
type Stats struct {
	scope                                     stats.Scope
	handshake, connectionError, noCertificate *stats.Counter
	failNoCert, failError, failSAN, failHash  *stats.Counter
}

// NewStats makes the statistics under scope (listener.<address>.ssl, cluster.<name>.ssl).
func NewStats(sc stats.Scope) *Stats {
	return &Stats{scope: sc, handshake: sc.Counter("handshake"), connectionError: sc.Counter("connection_error"),
		noCertificate: sc.Counter("no_certificate"), failNoCert: sc.Counter("fail_verify_no_cert"),
		failError: sc.Counter("fail_verify_error"), failSAN: sc.Counter("fail_verify_san"),
		failHash: sc.Counter("fail_verify_cert_hash")}
}

// common is what both sides of a TLS context share.
type common struct {
	certs      []*sds.Provider
	validation *sds.Provider // nil: no peer verification
	defaultCVC *tlsv3.CertificateValidationContext
	alpn       []string
	minV, maxV uint16
	suites     []uint16
	st         *Stats
}

// Providers are the secrets the context waits for.
func (c *common) Providers() []*sds.Provider {
	out := append([]*sds.Provider(nil), c.certs...)
	if c.validation != nil {
		out = append(out, c.validation)
	}
	return out
}

// Ready reports whether every secret's initialization ended (the warming condition).
func (c *common) Ready() bool {
	for _, p := range c.Providers() {
		if !p.Done() {
			return false
		}
	}
	return true
}

// Context is a compiled TLS context of either side.
type Context interface {
	// Secrets are the certificate providers and the validation context's (nil without).
	Secrets() (certs []*sds.Provider, validation *sds.Provider)
}

// Secrets implements Context.
func (c *common) Secrets() ([]*sds.Provider, *sds.Provider) { return c.certs, c.validation }

// Stats returns the context's ssl.* statistics.
func (c *common) Stats() *Stats { return c.st }

func compileCommon(ctc *tlsv3.CommonTlsContext, m *sds.Manager, sc stats.Scope, maxAuto uint16) (*common, error) {
	c := &common{alpn: ctc.GetAlpnProtocols(), st: NewStats(sc)}
	var err error
	if c.minV, c.maxV, c.suites, err = params(ctc.GetTlsParams(), maxAuto); err != nil {
		return nil, err
	}
	for i, tc := range ctc.GetTlsCertificates() {
		cert, err := sds.CompileCertificate(tc)
		if err != nil {
			return nil, fmt.Errorf("tls_certificates[%d]: %w", i, err)
		}
		c.certs = append(c.certs, sds.NewStatic(&sds.Secret{Proto: &tlsv3.Secret{Name: fmt.Sprintf("tls_certificates[%d]", i)}, Cert: cert}))
	}
	provider := func(sc *tlsv3.SdsSecretConfig) (*sds.Provider, error) {
		if m == nil {
			return nil, errors.New("no secret manager for SDS secrets")
		}
		return m.Provider(sc)
	}
	for i, sc := range ctc.GetTlsCertificateSdsSecretConfigs() {
		p, err := provider(sc)
		if err != nil {
			return nil, fmt.Errorf("tls_certificate_sds_secret_configs[%d]: %w", i, err)
		}
		c.certs = append(c.certs, p)
	}
	switch v := ctc.GetValidationContextType().(type) {
	case *tlsv3.CommonTlsContext_ValidationContext:
		roots, err := sds.ParseRoots(v.ValidationContext)
		if err != nil {
			return nil, fmt.Errorf("validation_context: %w", err)
		}
		c.validation = sds.NewStatic(&sds.Secret{Proto: &tlsv3.Secret{Name: "validation_context"}, Validation: v.ValidationContext, RootCerts: roots})
	case *tlsv3.CommonTlsContext_ValidationContextSdsSecretConfig:
		if c.validation, err = provider(v.ValidationContextSdsSecretConfig); err != nil {
			return nil, fmt.Errorf("validation_context_sds_secret_config: %w", err)
		}
	case *tlsv3.CommonTlsContext_CombinedValidationContext:
		c.defaultCVC = v.CombinedValidationContext.GetDefaultValidationContext()
		if err := sds.CheckValidation(c.defaultCVC); err != nil {
			return nil, fmt.Errorf("combined_validation_context.default_validation_context: %w", err)
		}
		if c.validation, err = provider(v.CombinedValidationContext.GetValidationContextSdsSecretConfig()); err != nil {
			return nil, fmt.Errorf("combined_validation_context: %w", err)
		}
	case nil:
	default:
		return nil, fmt.Errorf("validation context %T is not supported", v)
	}
	return c, nil
}

// validator is the peer verification in force for one handshake: the default validation
// context with the SDS one merged into it, as Envoy combines them.
type validator struct {
	cvc   *tlsv3.CertificateValidationContext
	roots *x509.CertPool
}

func (c *common) validatorNow() (*validator, error) {
	if c.validation == nil {
		return nil, nil
	}
	s := c.validation.Current()
	if s == nil {
		return nil, fmt.Errorf("validation context %s has not been received", c.validation.Name)
	}
	cvc := s.Validation
	if c.defaultCVC != nil {
		merged := proto.Clone(c.defaultCVC).(*tlsv3.CertificateValidationContext)
		proto.Merge(merged, s.Validation)
		cvc = merged
	}
	v := &validator{cvc: cvc}
	if len(s.RootCerts) > 0 {
		v.roots = x509.NewCertPool()
		for _, r := range s.RootCerts {
			v.roots.AddCert(r)
		}
	} else if len(cvc.GetMatchTypedSubjectAltNames()) > 0 || len(cvc.GetMatchSubjectAltNames()) > 0 { //nolint:staticcheck // deprecated field still honoured
		return nil, errors.New("SAN-based verification of peer certificates without trusted CA is insecure and not allowed")
	}
	return v, nil
}

// verify checks a peer chain: the CA, expiry, SANs and certificate hash, counting the
// reason it failed.
func (v *validator) verify(raw [][]byte, st *Stats) error {
	if len(raw) == 0 {
		return nil
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, b := range raw {
		c, err := x509.ParseCertificate(b)
		if err != nil {
			st.failError.Inc()
			return fmt.Errorf("peer certificate: %w", err)
		}
		certs[i] = c
	}
	if v.roots != nil {
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: v.roots, Intermediates: inter, CurrentTime: time.Now(),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			st.failError.Inc()
			return fmt.Errorf("peer certificate verification failed: %w", err)
		}
	}
	if !v.sanOK(certs[0]) {
		st.failSAN.Inc()
		return errors.New("peer certificate SAN verification failed")
	}
	if hs := v.cvc.GetVerifyCertificateHash(); len(hs) > 0 {
		sum := sha256.Sum256(raw[0])
		got := hex.EncodeToString(sum[:])
		ok := false
		for _, h := range hs {
			ok = ok || strings.EqualFold(strings.ReplaceAll(h, ":", ""), got)
		}
		if !ok {
			st.failHash.Inc()
			return errors.New("peer certificate hash verification failed")
		}
	}
	return nil
}

// sanOK applies match_typed_subject_alt_names, and the deprecated
// match_subject_alt_names (a matcher against a SAN of any type), as Envoy still does.
func (v *validator) sanOK(c *x509.Certificate) bool {
	typed := v.cvc.GetMatchTypedSubjectAltNames()
	//nolint:staticcheck // the deprecated field is still what older control planes send.
	legacy := v.cvc.GetMatchSubjectAltNames()
	if len(typed) == 0 && len(legacy) == 0 {
		return true
	}
	if matchSANs(typed, c) {
		return true
	}
	for _, m := range legacy {
		for _, t := range []tlsv3.SubjectAltNameMatcher_SanType{tlsv3.SubjectAltNameMatcher_DNS, tlsv3.SubjectAltNameMatcher_URI,
			tlsv3.SubjectAltNameMatcher_EMAIL, tlsv3.SubjectAltNameMatcher_IP_ADDRESS} {
			if matchSANs([]*tlsv3.SubjectAltNameMatcher{{SanType: t, Matcher: m}}, c) {
				return true
			}
		}
	}
	return false
}

func matchSANs(ms []*tlsv3.SubjectAltNameMatcher, c *x509.Certificate) bool {
	for _, m := range ms {
		var vals []string
		switch m.GetSanType() {
		case tlsv3.SubjectAltNameMatcher_DNS:
			vals = c.DNSNames
		case tlsv3.SubjectAltNameMatcher_URI:
			for _, u := range c.URIs {
				vals = append(vals, u.String())
			}
		case tlsv3.SubjectAltNameMatcher_EMAIL:
			vals = c.EmailAddresses
		case tlsv3.SubjectAltNameMatcher_IP_ADDRESS:
			for _, ip := range c.IPAddresses {
				vals = append(vals, ip.String())
			}
		}
		for _, s := range vals {
			if stats.MatchString(m.GetMatcher(), s) {
				return true
			}
		}
	}
	return false
}

func (c *common) certificate() (*tls.Certificate, error) {
	for _, p := range c.certs {
		if s := p.Current(); s != nil && s.Cert != nil {
			return s.Cert, nil
		}
	}
	if len(c.certs) == 0 {
		return nil, nil
	}
	return nil, fmt.Errorf("certificate %s has not been received", c.certs[0].Name)
}

// Info describes an established connection for streaminfo and XFCC.
func Info(cs tls.ConnectionState, local *tls.Certificate) *streaminfo.TLS {
	t := &streaminfo.TLS{Version: VersionName(cs.Version), Cipher: CipherName(cs.CipherSuite), SNI: cs.ServerName,
		ALPN: cs.NegotiatedProtocol}
	if len(cs.PeerCertificates) > 0 {
		p := cs.PeerCertificates[0]
		t.PeerCertificate = p
		t.PeerSubject = p.Subject.String()
		t.PeerDNSSANs = p.DNSNames
		for _, u := range p.URIs {
			t.PeerURISANs = append(t.PeerURISANs, u.String())
		}
	}
	if local != nil {
		leaf := local.Leaf
		if leaf == nil && len(local.Certificate) > 0 {
			leaf, _ = x509.ParseCertificate(local.Certificate[0])
		}
		if leaf != nil {
			for _, u := range leaf.URIs {
				t.LocalURISANs = append(t.LocalURISANs, u.String())
			}
		}
	}
	return t
}

func (c *common) established(cs tls.ConnectionState) {
	c.st.handshake.Inc()
	c.st.scope.Counter("versions." + strings.ReplaceAll(VersionName(cs.Version), ".", "_")).Inc()
	c.st.scope.Counter("ciphers." + CipherName(cs.CipherSuite)).Inc()
	if len(cs.PeerCertificates) == 0 {
		c.st.noCertificate.Inc()
	}
}

// Server is a compiled DownstreamTlsContext.
type Server struct {
	*common
	requireClient bool
}

// NewServer compiles a DownstreamTlsContext; sc is the listener's ssl scope.
func NewServer(d *tlsv3.DownstreamTlsContext, m *sds.Manager, sc stats.Scope) (*Server, error) {
	if d.GetSessionTicketKeysType() != nil {
		return nil, errors.New("session ticket keys are not supported")
	}
	c, err := compileCommon(d.GetCommonTlsContext(), m, sc, tls.VersionTLS13)
	if err != nil {
		return nil, err
	}
	if len(c.certs) == 0 {
		return nil, errors.New("No TLS certificates found for server context")
	}
	return &Server{common: c, requireClient: d.GetRequireClientCertificate().GetValue()}, nil
}

// Handshake runs the server side of a handshake on conn (the ClientHello may have been
// peeked and replayed) and returns the TLS connection with its description.
func (s *Server) Handshake(ctx context.Context, conn net.Conn) (*tls.Conn, *streaminfo.TLS, error) {
	var local *tls.Certificate
	cfg := &tls.Config{GetConfigForClient: func(ch *tls.ClientHelloInfo) (*tls.Config, error) {
		cert, err := s.certificate()
		if err != nil {
			return nil, err
		}
		v, err := s.validatorNow()
		if err != nil {
			return nil, err
		}
		local = cert
		out := &tls.Config{Certificates: []tls.Certificate{*cert}, NextProtos: s.nextProtos(ch.SupportedProtos), MinVersion: s.minV,
			MaxVersion: s.maxV, CipherSuites: s.suites, ClientAuth: tls.NoClientCert}
		if v != nil || s.requireClient {
			// The certificate is requested and judged here (not by crypto/tls), so that
			// each failure is counted under Envoy's name before the alert goes out.
			out.ClientAuth = tls.RequestClientCert
			out.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
				if len(raw) == 0 {
					if s.requireClient {
						s.st.failNoCert.Inc()
						return errors.New("peer did not return a certificate")
					}
					return nil
				}
				if v == nil {
					return nil
				}
				return v.verify(raw, s.st)
			}
		}
		return out, nil
	}}
	tc := tls.Server(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		s.st.connectionError.Inc()
		return nil, nil, err
	}
	cs := tc.ConnectionState()
	s.established(cs)
	return tc, Info(cs, local), nil
}

// nextProtos: BoringSSL's server goes on without ALPN when it shares no protocol with the
// client (Istio's clients offer istio-peer-exchange and istio to servers configured for
// h2 and http/1.1); Go's would refuse the handshake, so it is offered none then.
func (s *Server) nextProtos(offered []string) []string {
	for _, p := range s.alpn {
		if slices.Contains(offered, p) {
			return s.alpn
		}
	}
	return nil
}

// Client is a compiled UpstreamTlsContext.
type Client struct {
	*common
	sni string
}

// NewClient compiles an UpstreamTlsContext; sc is the cluster's ssl scope.
func NewClient(u *tlsv3.UpstreamTlsContext, m *sds.Manager, sc stats.Scope) (*Client, error) {
	c, err := compileCommon(u.GetCommonTlsContext(), m, sc, tls.VersionTLS12)
	if err != nil {
		return nil, err
	}
	return &Client{common: c, sni: u.GetSni()}, nil
}

// Handshake runs the client side on conn.
func (c *Client) Handshake(ctx context.Context, conn net.Conn) (*tls.Conn, *streaminfo.TLS, error) {
	cert, err := c.certificate()
	if err != nil {
		c.st.connectionError.Inc()
		return nil, nil, err
	}
	v, err := c.validatorNow()
	if err != nil {
		c.st.connectionError.Inc()
		return nil, nil, err
	}
	cfg := &tls.Config{ServerName: c.sni, NextProtos: c.alpn, MinVersion: c.minV, MaxVersion: c.maxV,
		CipherSuites: c.suites, InsecureSkipVerify: true} //nolint:gosec // verified below, as Envoy's validator does
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	if v != nil {
		cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error { return v.verify(raw, c.st) }
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.st.connectionError.Inc()
		return nil, nil, err
	}
	cs := tc.ConnectionState()
	c.established(cs)
	return tc, Info(cs, cert), nil
}

// DownstreamContext decodes a listener filter chain's transport socket: nil for
// plaintext (none, or raw_buffer).
func DownstreamContext(ts *corev3.TransportSocket) (*tlsv3.DownstreamTlsContext, error) {
	d := &tlsv3.DownstreamTlsContext{}
	ok, err := decode(ts, downstreamType, d)
	if !ok || err != nil {
		return nil, err
	}
	return d, nil
}

// UpstreamContext decodes a cluster's transport socket: nil for plaintext.
func UpstreamContext(ts *corev3.TransportSocket) (*tlsv3.UpstreamTlsContext, error) {
	u := &tlsv3.UpstreamTlsContext{}
	ok, err := decode(ts, upstreamType, u)
	if !ok || err != nil {
		return nil, err
	}
	return u, nil
}

func decode(ts *corev3.TransportSocket, want string, into proto.Message) (bool, error) {
	if ts == nil {
		return false, nil
	}
	tc := ts.GetTypedConfig()
	switch {
	case tc.GetTypeUrl() == rawBufferType || (tc == nil && ts.GetName() == SocketRawBuffer):
		return false, nil
	case tc.GetTypeUrl() == want:
		if err := tc.UnmarshalTo(into); err != nil {
			return false, fmt.Errorf("transport_socket %s: %w", ts.GetName(), err)
		}
		if v, ok := into.(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				return false, fmt.Errorf("transport_socket %s: %w", ts.GetName(), err)
			}
		}
		return true, nil
	case tc == nil:
		return false, fmt.Errorf("transport_socket %s: no typed_config", ts.GetName())
	}
	return false, fmt.Errorf("transport_socket %s: type %s is not supported here", ts.GetName(), strings.TrimPrefix(tc.GetTypeUrl(), "type.googleapis.com/"))
}
