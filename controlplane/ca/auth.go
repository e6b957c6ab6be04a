package ca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// errNoIdentity marks a caller that authenticated but whose identity is not a workload's.
var errNoIdentity = errors.New("no workload identity")

// Caller is an authenticated client of the secure port.
type Caller struct {
	Identity
	// IPs are the addresses the caller's local-mesh credential names: the only ones its
	// proxy may claim. Nil when none is known (a certificate or a Kubernetes token, which
	// name no address, or a credential without ips).
	IPs []string
	// By says what authenticated it: "certificate", "credential" or "token".
	By string
}

// Authenticate finds who calls with the CA's rules, for the secure port's other services
// (xDS): the holder of a valid workload certificate of this mesh, else the bearer of a
// Kubernetes service-account token or a local-mesh credential. A caller none of them accepts
// gets codes.Unauthenticated naming the reasons. It counts and logs nothing: that is the
// calling service's.
func (s *Server) Authenticate(ctx context.Context) (Caller, error) {
	a := s.opts.CA()
	if a == nil {
		return Caller{}, status.Error(codes.Unavailable, "the CA is not loaded yet")
	}
	c, errs := s.identify(ctx, a, s.opts.TrustDomain())
	if errs != nil {
		return Caller{}, unauthenticated(errs)
	}
	return c, nil
}

// AuthenticateToken checks a bearer token (a Kubernetes service-account token for audience
// istio-ca, or a local-mesh credential) with the CA's rules, for callers that are not gRPC
// (discovery's HTTP admin endpoints).
func (s *Server) AuthenticateToken(ctx context.Context, token string) (Caller, error) {
	return s.fromToken(ctx, token)
}

// authenticate is Authenticate for the certificate service, which counts and logs refusals.
func (s *Server) authenticate(ctx context.Context, a *Authority, trustDomain string) (Identity, error) {
	c, errs := s.identify(ctx, a, trustDomain)
	if errs == nil {
		return c.Identity, nil
	}
	if errors.Is(errors.Join(errs...), errNoIdentity) {
		s.metrics.idExtraction.Inc()
	}
	s.metrics.authnFailure.Inc()
	err := unauthenticated(errs)
	s.log.Warn("CSR caller not authenticated", "reasons", status.Convert(err).Message())
	return Identity{}, err
}

func unauthenticated(errs []error) error {
	reasons := make([]string, len(errs))
	for i, e := range errs {
		reasons[i] = e.Error()
	}
	return status.Error(codes.Unauthenticated, "authenticating the caller: "+strings.Join(reasons, "; "))
}

// identify tries the client certificate, then the bearer token; it returns the reasons when
// neither authenticates. A valid certificate wins without asking the API server; a valid
// local-mesh credential sent with it adds the addresses it names, and must name the same
// identity.
func (s *Server) identify(ctx context.Context, a *Authority, trustDomain string) (Caller, []error) {
	var errs []error
	token, tokenErr := bearer(ctx)
	if leaf, chain := peerCertificate(ctx); leaf != nil {
		id, err := s.fromCertificate(a, leaf, chain, trustDomain)
		if err == nil {
			c := Caller{Identity: id, By: "certificate"}
			if tokenErr != nil || !strings.HasPrefix(token, CredentialPrefix) || s.opts.LocalKey == nil {
				return c, nil
			}
			cred, err := VerifyCredential(s.opts.LocalKey, token, s.now())
			switch {
			case err != nil: // an expired credential: the certificate is enough
				return c, nil
			case cred.Namespace != id.Namespace || cred.ServiceAccount != id.ServiceAccount:
				return Caller{}, []error{fmt.Errorf("the client certificate is %s/%s's but the bearer credential %s/%s's",
					id.Namespace, id.ServiceAccount, cred.Namespace, cred.ServiceAccount)}
			}
			c.IPs = cred.IPs
			return c, nil
		}
		errs = append(errs, fmt.Errorf("client certificate: %w", err))
	}
	if tokenErr != nil {
		return Caller{}, append(errs, tokenErr)
	}
	c, err := s.fromToken(ctx, token)
	if err != nil {
		return Caller{}, append(errs, err)
	}
	return c, nil
}

// peerCertificate is the client certificate of the TLS connection (nil without one) and the
// certificates sent after it.
func peerCertificate(ctx context.Context) (*x509.Certificate, []*x509.Certificate) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return nil, nil
	}
	return info.State.PeerCertificates[0], info.State.PeerCertificates[1:]
}

// fromCertificate accepts a workload certificate that chains to the CA's roots now and names
// one SPIFFE identity of this trust domain.
func (s *Server) fromCertificate(a *Authority, leaf *x509.Certificate, chain []*x509.Certificate, trustDomain string) (Identity, error) {
	inter := x509.NewCertPool()
	for _, c := range chain {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: a.Roots(), Intermediates: inter, CurrentTime: s.now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return Identity{}, fmt.Errorf("not a valid certificate of this mesh: %w", err)
	}
	if len(leaf.URIs) != 1 {
		return Identity{}, fmt.Errorf("%w: the certificate has %d URI SANs, want one SPIFFE ID", errNoIdentity, len(leaf.URIs))
	}
	return ParseSPIFFE(leaf.URIs[0].String(), trustDomain)
}

// ParseSPIFFE reads spiffe://<trustDomain>/ns/<ns>/sa/<sa>.
func ParseSPIFFE(id, trustDomain string) (Identity, error) {
	rest, ok := strings.CutPrefix(id, "spiffe://"+trustDomain+"/")
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa" || parts[1] == "" || parts[3] == "" {
		return Identity{}, fmt.Errorf("%w: %q is not spiffe://%s/ns/<namespace>/sa/<service account>", errNoIdentity, id, trustDomain)
	}
	return Identity{Namespace: parts[1], ServiceAccount: parts[3]}, nil
}

// bearer is the token of the authorization metadata ("Bearer <token>").
func bearer(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", errors.New("no client certificate and no bearer token (authorization metadata)")
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || strings.TrimSpace(tok) == "" {
		return "", errors.New(`the authorization metadata is not "Bearer <token>"`)
	}
	return strings.TrimSpace(tok), nil
}

// fromToken checks a local-mesh credential with the local key, anything else with the
// TokenReview API.
func (s *Server) fromToken(ctx context.Context, token string) (Caller, error) {
	if strings.HasPrefix(token, CredentialPrefix) {
		if s.opts.LocalKey == nil {
			return Caller{}, errors.New("a local-mesh credential, but discovery has no localCredentialKey")
		}
		c, err := VerifyCredential(s.opts.LocalKey, token, s.now())
		if err != nil {
			return Caller{}, err
		}
		return Caller{Identity: Identity{Namespace: c.Namespace, ServiceAccount: c.ServiceAccount}, IPs: c.IPs, By: "credential"}, nil
	}
	if s.opts.Kube == nil {
		return Caller{}, errors.New("a bearer token, but discovery checks only local-mesh credentials (no Kubernetes API server)")
	}
	id, err := s.tokenReview(ctx, token)
	return Caller{Identity: id, By: "token"}, err
}

// tokenReview asks the API server whose token it is, for audience istio-ca.
func (s *Server) tokenReview(ctx context.Context, token string) (Identity, error) {
	tr, err := s.opts.Kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{CredentialAudience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return Identity{}, fmt.Errorf("TokenReview: %w", err)
	}
	st := tr.Status
	if !st.Authenticated {
		if st.Error == "" {
			st.Error = "not authenticated"
		}
		return Identity{}, fmt.Errorf("service-account token refused by TokenReview: %s", st.Error)
	}
	audienceOK := false
	for _, aud := range st.Audiences {
		audienceOK = audienceOK || aud == CredentialAudience
	}
	if !audienceOK {
		return Identity{}, fmt.Errorf("service-account token for audiences %v, not %s", st.Audiences, CredentialAudience)
	}
	rest, ok := strings.CutPrefix(st.User.Username, "system:serviceaccount:")
	ns, sa, found := strings.Cut(rest, ":")
	if !ok || !found || ns == "" || sa == "" {
		return Identity{}, fmt.Errorf("%w: the token is %q's, not a service account's", errNoIdentity, st.User.Username)
	}
	return Identity{Namespace: ns, ServiceAccount: sa}, nil
}
