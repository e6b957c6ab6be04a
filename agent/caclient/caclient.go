// Package caclient asks the mesh CA (discovery's Istio certificate API,
// istio.v1.auth.IstioCertificateService/CreateCertificate on 15012) to sign a workload's
// CSR: over TLS trusting the mesh root, authenticated by a bearer token read from a file
// (a projected service-account token, or the local mesh's per-pod credential), and, once
// the workload has a certificate, presenting it as TLS client certificate too.
package caclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	securityapi "istio.io/api/security/v1alpha1"
)

// Config says where the CA is and how to trust it and be trusted by it.
type Config struct {
	// Address is the CA's host:port (CA_ADDR).
	Address string
	// RootFile holds the PEM roots the CA's serving certificate must chain to (CA_ROOT_CA,
	// Istio's ./var/run/secrets/istio/root-cert.pem). It is read at every handshake, so a
	// root rotation written to the file is followed.
	RootFile string
	// ServerName is the name the CA's certificate must have (ISTIOD_SAN); default the
	// host of Address.
	ServerName string
	// TokenFile holds the bearer token, read at every call (projected tokens are renewed).
	TokenFile string
	// ClientCertificate, if set, returns the workload's current certificate, presented as
	// TLS client certificate on a new connection (nil: none yet).
	ClientCertificate func() *tls.Certificate
}

// Client is a connection to the CA; gRPC reconnects it as needed, and it is dialled
// anew when the workload's certificate changes, so that a renewal presents the current
// one (TLS sends a client certificate only in the handshake).
type Client struct {
	cfg Config

	mu       sync.Mutex
	conn     *grpc.ClientConn
	api      securityapi.IstioCertificateServiceClient
	dialedAs *tls.Certificate
}

// New checks the configuration and prepares the connection (it dials lazily).
func New(cfg Config) (*Client, error) {
	host, _, err := net.SplitHostPort(cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("CA address %q: %w", cfg.Address, err)
	}
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	if cfg.TokenFile == "" {
		return nil, errors.New("CA client: no token file to authenticate with")
	}
	if cfg.RootFile == "" {
		return nil, errors.New("CA client: no root certificate file to trust the CA with (CA_ROOT_CA)")
	}
	c := &Client{cfg: cfg}
	if _, err := c.connection(); err != nil {
		return nil, err
	}
	return c, nil
}

// connection is the gRPC client for the workload's current certificate.
func (c *Client) connection() (securityapi.IstioCertificateServiceClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var cert *tls.Certificate
	if c.cfg.ClientCertificate != nil {
		cert = c.cfg.ClientCertificate()
	}
	if c.conn != nil && cert == c.dialedAs {
		return c.api, nil
	}
	dialed := c.cfg
	dialed.ClientCertificate = func() *tls.Certificate { return cert }
	conn, err := grpc.NewClient(c.cfg.Address, dialed.DialOptions()...)
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", c.cfg.Address, err)
	}
	if c.conn != nil {
		c.conn.Close()
	}
	c.conn, c.api, c.dialedAs = conn, securityapi.NewIstioCertificateServiceClient(conn), cert
	return c.api, nil
}

// Close closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// Address is the CA's address.
func (c *Client) Address() string { return c.cfg.Address }

// Sign sends a PEM CSR and returns the certificate chain, leaf first and root last, as
// the API defines it. The error keeps the gRPC status (PermissionDenied: the CA refused
// the caller or the identity; Unavailable: not reached).
func (c *Client) Sign(ctx context.Context, csrPEM []byte, ttl time.Duration) ([]string, error) {
	api, err := c.connection()
	if err != nil {
		return nil, err
	}
	resp, err := api.CreateCertificate(ctx, &securityapi.IstioCertificateRequest{
		Csr: string(csrPEM), ValidityDuration: int64(ttl / time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("CA %s: CreateCertificate: %w", c.cfg.Address, err)
	}
	if len(resp.GetCertChain()) == 0 {
		return nil, fmt.Errorf("CA %s: CreateCertificate answered an empty certificate chain", c.cfg.Address)
	}
	return resp.GetCertChain(), nil
}

// DialOptions are the gRPC options to reach discovery's TLS port (15012) as this
// workload: TLS verifying the server against the mesh root and ServerName, the
// certificate ClientCertificate returns at each handshake as client certificate, and
// the token, when TokenFile is set, as `authorization: Bearer` on every call. The CA
// client and the agent's XDS proxy both dial with them.
func (cfg Config) DialOptions() []grpc.DialOption {
	tlsc := cfg.tlsConfig()
	tlsc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if cfg.ClientCertificate != nil {
			if cert := cfg.ClientCertificate(); cert != nil {
				return cert, nil
			}
		}
		return &tls.Certificate{}, nil
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsc))}
	if cfg.TokenFile != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(tokenFile(cfg.TokenFile)))
	}
	return opts
}

// tlsConfig verifies the CA against the root file read at each handshake: Go verifies
// a fixed pool only, and the mesh root rotates.
func (cfg Config) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // verified in VerifyConnection against the current roots
		VerifyConnection: func(cs tls.ConnectionState) error {
			roots, err := LoadRoots(cfg.RootFile)
			if err != nil {
				return err
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("discovery sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots: roots, Intermediates: inter, DNSName: cfg.ServerName,
			})
			if err != nil {
				return fmt.Errorf("discovery's certificate is not trusted by %s for %q: %w", cfg.RootFile, cfg.ServerName, err)
			}
			return nil
		},
	}
}

// LoadRoots reads a PEM file of root certificates.
func LoadRoots(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("root certificates: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("root certificates %s: no PEM certificate in the file", path)
	}
	return pool, nil
}

// tokenFile sends the file's content as `authorization: Bearer <token>`, read per call.
type tokenFile string

func (f tokenFile) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	b, err := os.ReadFile(string(f))
	if err != nil {
		return nil, fmt.Errorf("credential for discovery: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return nil, fmt.Errorf("credential for discovery %s is empty", string(f))
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

func (tokenFile) RequireTransportSecurity() bool { return true }
