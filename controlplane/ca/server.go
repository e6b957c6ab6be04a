package ca

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	"k8s.io/client-go/kubernetes"
)

// ServerOptions configure the certificate service.
type ServerOptions struct {
	// CA is the CA in force (a Keeper's Current), read at every request.
	CA func() *Authority
	// TrustDomain is the mesh config's, read at every request (default cluster.local).
	TrustDomain func() string
	// Kube, when set, checks Kubernetes service-account tokens (audience istio-ca) with the
	// TokenReview API.
	Kube kubernetes.Interface
	// LocalKey, when set, checks local-mesh credentials (MintCredential's) with this key.
	LocalKey ed25519.PublicKey
	// DefaultTTL is a certificate's lifetime when the caller asks for none (DefaultWorkloadTTL);
	// a longer one than MaxTTL (MaxWorkloadTTL) is cut to MaxTTL.
	DefaultTTL, MaxTTL time.Duration
	Registerer         prometheus.Registerer
	Log                *slog.Logger
}

// Server is istio.v1.auth.IstioCertificateService: it signs a caller's CSR with the caller's
// own SPIFFE identity.
type Server struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	opts    ServerOptions
	log     *slog.Logger
	now     func() time.Time
	metrics serverMetrics
}

// serverMetrics are istiod's citadel_server_* metrics.
type serverMetrics struct {
	csr, authnFailure, csrParsing, idExtraction, success prometheus.Counter
	signErr                                              *prometheus.CounterVec
}

// NewServer checks the options and registers the metrics.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.CA == nil {
		return nil, errors.New("the certificate service needs a CA")
	}
	if opts.TrustDomain == nil {
		opts.TrustDomain = func() string { return "cluster.local" }
	}
	if opts.DefaultTTL <= 0 {
		opts.DefaultTTL = DefaultWorkloadTTL
	}
	if opts.MaxTTL <= 0 {
		opts.MaxTTL = MaxWorkloadTTL
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	s := &Server{opts: opts, log: opts.Log.With("scope", "ca"), now: time.Now}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &s.metrics
	m.csr = counter("citadel_server_csr_count", "The number of CSRs received by the CA server.")
	m.authnFailure = counter("citadel_server_authentication_failure_count", "The number of authentication failures.")
	m.csrParsing = counter("citadel_server_csr_parsing_err_count", "The number of errors occurred when parsing the CSR.")
	m.idExtraction = counter("citadel_server_id_extraction_err_count", "The number of errors occurred when extracting the caller's identity.")
	m.success = counter("citadel_server_success_cert_issuance_count", "The number of certificates issuances that have succeeded.")
	m.signErr = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "citadel_server_csr_sign_err_count",
		Help: "The number of CSRs not signed, by why (identity_mismatch: the CSR names another identity than the caller's)."}, []string{"error_type"})
	expiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "citadel_server_root_cert_expiry_timestamp",
		Help: "The unix timestamp, in seconds, when the CA's root certificate expires."}, s.rootExpiry)
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{m.csr, m.authnFailure, m.csrParsing, m.idExtraction, m.success, m.signErr, expiry} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("CA metrics: %w", err)
			}
		}
	}
	return s, nil
}

// rootExpiry is when the CA's root (the earliest of root-cert.pem's) expires.
func (s *Server) rootExpiry() float64 {
	a := s.opts.CA()
	if a == nil {
		return 0
	}
	roots, _ := parseCerts(a.RootPEM)
	var first time.Time
	for _, r := range roots {
		if first.IsZero() || r.NotAfter.Before(first) {
			first = r.NotAfter
		}
	}
	return float64(first.Unix())
}

// Register serves the certificate service on g.
func (s *Server) Register(g *grpc.Server) {
	securityv1alpha1.RegisterIstioCertificateServiceServer(g, s)
}

// CreateCertificate authenticates the caller, checks that the CSR asks for nothing but the
// caller's identity, and signs it with that identity for the lifetime asked (cut to MaxTTL).
func (s *Server) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	s.metrics.csr.Inc()
	a := s.opts.CA()
	if a == nil {
		return nil, status.Error(codes.Unavailable, "the CA is not loaded yet")
	}
	td := s.opts.TrustDomain()
	caller, err := s.authenticate(ctx, a, td)
	if err != nil {
		return nil, err
	}
	id := caller.SPIFFE(td)
	csr, err := parseCSR(req.GetCsr())
	if err != nil {
		s.metrics.csrParsing.Inc()
		s.log.Warn("CSR refused", "caller", id.String(), "error", err)
		return nil, status.Errorf(codes.InvalidArgument, "CSR of %s: %v", id, err)
	}
	for _, u := range csr.URIs {
		if u.String() != id.String() {
			s.metrics.signErr.WithLabelValues("identity_mismatch").Inc()
			s.log.Warn("CSR for another identity refused", "caller", id.String(), "asked", u.String())
			return nil, status.Errorf(codes.PermissionDenied, "the CSR asks for identity %s but the caller is %s", u, id)
		}
	}
	ttl := time.Duration(req.GetValidityDuration()) * time.Second
	if ttl <= 0 {
		ttl = s.opts.DefaultTTL
	}
	ttl = min(ttl, s.opts.MaxTTL)
	leaf, err := a.SignWorkload(csr.PublicKey, id, ttl, s.now())
	if err != nil {
		s.metrics.signErr.WithLabelValues("sign").Inc()
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	s.metrics.success.Inc()
	s.log.Debug("certificate issued", "identity", id.String(), "ttl", ttl.String())
	return &securityv1alpha1.IstioCertificateResponse{CertChain: append([]string{string(leaf)}, a.ChainPEMs()...)}, nil
}

// parseCSR reads a PEM CSR, checks its signature, and accepts the keys a proxy can use: ECDSA
// P-256 or P-384, RSA of 2048 bits or more.
func parseCSR(text string) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode([]byte(text))
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("not a PEM CERTIFICATE REQUEST")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("the CSR's signature: %w", err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if n := k.Curve.Params().Name; n != "P-256" && n != "P-384" {
			return nil, fmt.Errorf("ECDSA curve %s: want P-256 or P-384", n)
		}
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return nil, fmt.Errorf("RSA key of %d bits: want 2048 or more", k.N.BitLen())
		}
	default:
		return nil, fmt.Errorf("a %T key: want ECDSA or RSA", k)
	}
	return csr, nil
}

// Identity is a workload's: its namespace and service account.
type Identity struct {
	Namespace, ServiceAccount string
}

// SPIFFE is the identity's SPIFFE ID in trustDomain: spiffe://<td>/ns/<ns>/sa/<sa>.
func (id Identity) SPIFFE(trustDomain string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: trustDomain, Path: "/ns/" + id.Namespace + "/sa/" + id.ServiceAccount}
}
