package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/big"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Defaults of generated certificates: istiod's names (its self-signed CA's Secret, its
// Service).
const (
	DefaultCASecret    = "istio-ca-secret"
	DefaultServiceName = "istiod"
	DefaultCertTTL     = 24 * time.Hour
	caTTL              = 10 * 365 * 24 * time.Hour
	caCommonName       = "wasmesh discovery webhook CA"
)

// The CA Secret in istiod's shape (its self-signed CA's istio-ca-secret): type
// istio.io/ca-root with ca-cert.pem and ca-key.pem (and root-cert.pem, the same
// certificate). A kubernetes.io/tls Secret (tls.crt, tls.key) put there instead is read too.
const (
	CASecretType = corev1.SecretType("istio.io/ca-root")
	CACertKey    = "ca-cert.pem"
	CAKeyKey     = "ca-key.pem"
	RootCertKey  = "root-cert.pem"
)

// GenerateOptions configure GeneratedCerts.
type GenerateOptions struct {
	Client kubernetes.Interface
	// Namespace holds the CA Secret and the webhook Service (discovery's own namespace).
	Namespace string
	// SecretName names the CA Secret every replica shares (default DefaultCASecret).
	SecretName string
	// ServiceName is the webhook Service: the serving certificate holds its DNS names
	// (<svc>, <svc>.<ns>, <svc>.<ns>.svc, <svc>.<ns>.svc.<DomainSuffix>).
	ServiceName  string
	DomainSuffix string // default cluster.local
	// Hosts are more names or IP addresses for the certificate (a URL webhook's host).
	Hosts []string
	// TTL is the serving certificate's lifetime (default DefaultCertTTL); it is renewed
	// two thirds of the way through.
	TTL time.Duration
	Log *slog.Logger
}

// GeneratedCerts serves a certificate of its own, signed by the CA of a Secret in
// discovery's namespace that every replica shares: the first replica to find no Secret
// creates it, a replica that loses that race reads the winner's, so each replica's
// certificate is trusted by the one caBundle. Every renewal reads the Secret again: a CA
// replaced there is adopted, and a deleted Secret is created again with the CA in use.
type GeneratedCerts struct {
	*current
	opts GenerateOptions
	log  *slog.Logger
	ca   *authority // owned by Run
	now  func() time.Time
}

// authority is a CA: its certificate (PEM and parsed) and key.
type authority struct {
	certPEM, keyPEM []byte
	cert            *x509.Certificate
	key             any
}

// NewGeneratedCerts checks the options; Run gets the CA and issues the first certificate.
func NewGeneratedCerts(opts GenerateOptions) (*GeneratedCerts, error) {
	if opts.Client == nil || opts.Namespace == "" {
		return nil, errors.New("generated webhook certificates need the API server and discovery's namespace")
	}
	if opts.SecretName == "" {
		opts.SecretName = DefaultCASecret
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
	return &GeneratedCerts{current: newCurrent(), opts: opts, log: opts.Log.With("scope", "webhook"), now: time.Now}, nil
}

// DNSNames are the names the serving certificate is for.
func (g *GeneratedCerts) DNSNames() []string {
	svc, ns := g.opts.ServiceName, g.opts.Namespace
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc." + g.opts.DomainSuffix}
}

// Run gets the CA (retrying while the API server is away or refuses), issues the serving
// certificate and renews it before it expires, until ctx ends.
func (g *GeneratedCerts) Run(ctx context.Context) error {
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 30 * time.Second}
	for {
		next, err := g.renew(ctx)
		if err != nil {
			next = backoff.Step()
			g.log.Error("webhook certificate not issued; retrying", "secret", g.opts.Namespace+"/"+g.opts.SecretName, "retryIn", next.String(), "error", err)
		} else {
			backoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 30 * time.Second}
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// renew reads (or creates) the shared CA, issues a serving certificate and says when to
// renew it.
func (g *GeneratedCerts) renew(ctx context.Context) (time.Duration, error) {
	ca, err := g.sharedCA(ctx)
	if err != nil {
		return 0, err
	}
	if g.ca != nil && !bytes.Equal(g.ca.certPEM, ca.certPEM) {
		g.log.Warn("webhook CA replaced in its Secret; adopting it", "secret", g.opts.Namespace+"/"+g.opts.SecretName)
	}
	g.ca = ca
	cert, notAfter, err := g.issue(ca)
	if err != nil {
		return 0, err
	}
	g.set(cert, ca.certPEM)
	now := g.now()
	next := notAfter.Sub(now) * 2 / 3
	g.log.Debug("webhook serving certificate issued", "dnsNames", g.DNSNames(), "notAfter", notAfter, "renewIn", next.String())
	return next, nil
}

// sharedCA reads the CA Secret; when there is none it creates it (with the CA in use, or a
// new one), and when another replica created it first it reads theirs.
func (g *GeneratedCerts) sharedCA(ctx context.Context) (*authority, error) {
	secrets := g.opts.Client.CoreV1().Secrets(g.opts.Namespace)
	sec, err := secrets.Get(ctx, g.opts.SecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		ca := g.ca
		if ca == nil {
			if ca, err = newAuthority(g.now()); err != nil {
				return nil, err
			}
		}
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: g.opts.SecretName, Namespace: g.opts.Namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "wasmesh-discovery"}},
			Type: CASecretType,
			Data: map[string][]byte{CACertKey: ca.certPEM, CAKeyKey: ca.keyPEM, RootCertKey: ca.certPEM},
		}, metav1.CreateOptions{})
		if err == nil {
			g.log.Info("webhook CA created", "secret", g.opts.Namespace+"/"+g.opts.SecretName)
			return ca, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating the webhook CA Secret %s/%s: %w", g.opts.Namespace, g.opts.SecretName, err)
		}
		// Another replica created it first: theirs is the CA.
		sec, err = secrets.Get(ctx, g.opts.SecretName, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("reading the webhook CA Secret %s/%s: %w", g.opts.Namespace, g.opts.SecretName, err)
	}
	certPEM, keyPEM := sec.Data[CACertKey], sec.Data[CAKeyKey]
	if len(certPEM) == 0 && len(keyPEM) == 0 {
		certPEM, keyPEM = sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]
	}
	ca, err := parseAuthority(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("webhook CA Secret %s/%s: %w", g.opts.Namespace, g.opts.SecretName, err)
	}
	return ca, nil
}

func newAuthority(now time.Time) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: caCommonName, Organization: []string{"wasmesh"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(caTTL),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("webhook CA: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return parseAuthority(pemCert(der), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
}

func parseAuthority(certPEM, keyPEM []byte) (*authority, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("the CA's certificate and key: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, errors.New("the certificate is not a CA's")
	}
	return &authority{certPEM: pemCert(pair.Certificate[0]), keyPEM: keyPEM, cert: cert, key: pair.PrivateKey}, nil
}

// issue signs a serving certificate of this replica for the webhook Service's names.
func (g *GeneratedCerts) issue(ca *authority) (*tls.Certificate, time.Time, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, time.Time{}, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, time.Time{}, err
	}
	now := g.now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: g.DNSNames()[2]},
		DNSNames:  g.DNSNames(),
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(g.opts.TTL),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range g.opts.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("signing the webhook serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, time.Time{}, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, tmpl.NotAfter, nil
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}
