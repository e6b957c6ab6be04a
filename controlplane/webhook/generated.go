package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/wasmesh/wasmesh/controlplane/ca"
)

// Defaults of generated certificates: istiod's names (its self-signed CA's Secret, its
// Service).
const (
	DefaultCASecret    = ca.DefaultSecret
	DefaultServiceName = "istiod"
	DefaultCertTTL     = 24 * time.Hour
)

// The CA Secret in istiod's shape (see ca.SecretStore): type istio.io/ca-root with
// ca-cert.pem and ca-key.pem (and root-cert.pem, the same certificate). A kubernetes.io/tls
// Secret (tls.crt, tls.key) put there instead is read too.
const (
	CASecretType = ca.SecretType
	CACertKey    = ca.CACertFile
	CAKeyKey     = ca.CAKeyFile
	RootCertKey  = ca.RootCertFile
)

// GenerateOptions configure GeneratedCerts.
type GenerateOptions struct {
	// CA is the CA that signs the certificate, read again at every renewal (discovery's
	// ca.Keeper: the mesh's CA). Without it, Client, Namespace and SecretName name the
	// Secret of a CA every replica shares (a ca.Keeper of its own).
	CA         func(ctx context.Context) (*ca.Authority, error)
	Client     kubernetes.Interface
	Namespace  string // discovery's own, where the CA Secret and the Service are
	SecretName string // default DefaultCASecret
	// ServiceName is the Service: the serving certificate holds its DNS names
	// (<svc>, <svc>.<ns>, <svc>.<ns>.svc, <svc>.<ns>.svc.<DomainSuffix>).
	ServiceName  string
	DomainSuffix string // default cluster.local
	// Hosts are more names or IP addresses for the certificate (a URL webhook's host).
	Hosts []string
	// TTL is the serving certificate's lifetime (default DefaultCertTTL); it is renewed
	// two thirds of the way through.
	TTL time.Duration
	// Scope names the server in logs (default webhook).
	Scope string
	Log   *slog.Logger
}

// GeneratedCerts serves a certificate of its own, signed by the CA of a Secret in
// discovery's namespace that every replica shares (or by discovery's CA): the first replica
// to find no Secret creates it, a replica that loses that race reads the winner's, so each
// replica's certificate is trusted by the one caBundle. Every renewal reads the CA again: a
// CA replaced there is adopted, and a deleted Secret is created again with the CA in use.
type GeneratedCerts struct {
	*current
	opts GenerateOptions
	log  *slog.Logger
	now  func() time.Time
}

// NewGeneratedCerts checks the options; Run gets the CA and issues the first certificate.
func NewGeneratedCerts(opts GenerateOptions) (*GeneratedCerts, error) {
	if opts.Namespace == "" || (opts.CA == nil && opts.Client == nil) {
		return nil, errors.New("generated certificates need discovery's namespace, and its CA or the API server to keep one in")
	}
	if opts.CA == nil {
		k, err := ca.NewKeeper(ca.KeeperOptions{Client: opts.Client, Namespace: opts.Namespace, SecretName: opts.SecretName, Log: opts.Log})
		if err != nil {
			return nil, err
		}
		opts.CA = k.Refresh
	}
	if opts.Scope == "" {
		opts.Scope = "webhook"
	}
	if opts.ServiceName == "" {
		opts.ServiceName = DefaultServiceName
	}
	if opts.DomainSuffix == "" {
		opts.DomainSuffix = "cluster.local"
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultCertTTL
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	return &GeneratedCerts{current: newCurrent(), opts: opts, log: opts.Log.With("scope", opts.Scope), now: time.Now}, nil
}

// DNSNames are the names the serving certificate is for: the Service's.
func (g *GeneratedCerts) DNSNames() []string {
	svc, ns := g.opts.ServiceName, g.opts.Namespace
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc." + g.opts.DomainSuffix}
}

// names are the DNS names and the more hosts, the Service's ".svc" name first (the
// certificate's common name).
func (g *GeneratedCerts) names() []string {
	dns := g.DNSNames()
	return append([]string{dns[2], dns[0], dns[1], dns[3]}, g.opts.Hosts...)
}

// Run gets the CA (retrying while the API server is away or refuses), issues the serving
// certificate and renews it before it expires, until ctx ends.
func (g *GeneratedCerts) Run(ctx context.Context) error {
	ca.Repeat(ctx, g.renew, func(err error, retryIn time.Duration) {
		g.log.Error("serving certificate not issued; retrying", "retryIn", retryIn.String(), "error", err)
	})
	return nil
}

// renew reads the CA, issues a serving certificate and says when to renew it.
func (g *GeneratedCerts) renew(ctx context.Context) (time.Duration, error) {
	authority, err := g.opts.CA(ctx)
	if err != nil {
		return 0, err
	}
	cert, err := g.issue(authority)
	if err != nil {
		return 0, err
	}
	g.set(cert, authority.RootPEM)
	next := cert.Leaf.NotAfter.Sub(g.now()) * 2 / 3
	g.log.Debug("serving certificate issued", "dnsNames", g.DNSNames(), "notAfter", cert.Leaf.NotAfter, "renewIn", next.String())
	return next, nil
}

// issue signs a serving certificate of this replica for the Service's names.
func (g *GeneratedCerts) issue(authority *ca.Authority) (*tls.Certificate, error) {
	return authority.IssueServing(g.names(), g.opts.TTL, g.now())
}
