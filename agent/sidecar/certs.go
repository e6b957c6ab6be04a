package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wasmesh/wasmesh/agent/caclient"
	"github.com/wasmesh/wasmesh/agent/csr"
	"github.com/wasmesh/wasmesh/agent/sds"
	"github.com/wasmesh/wasmesh/agent/workloadcert"
)

// Istio's defaults for the CA connection.
const (
	// DefaultCAPort is discovery's TLS port, where its certificate API is.
	DefaultCAPort = "15012"
	// DefaultCARootFile is the mesh root as Istio mounts it (the istio-ca-root-cert
	// ConfigMap), relative to the agent's working directory.
	DefaultCARootFile = "./var/run/secrets/istio/root-cert.pem"
	// KubernetesTokenFile is the projected service-account token with audience istio-ca.
	KubernetesTokenFile = "/var/run/secrets/tokens/istio-token"
	// TokenFileEnv names the CA credential file explicitly (wasmesh: the local mesh's
	// per-pod credential; on Kubernetes it defaults to KubernetesTokenFile).
	TokenFileEnv = "WASMESH_CA_TOKEN_FILE"
	// DefaultGraceRatioJitter is Istio's SECRET_GRACE_PERIOD_RATIO_JITTER.
	DefaultGraceRatioJitter = 0.01
)

// certSource is where the workload certificate comes from, when anywhere.
type certSource struct {
	kind  string // "files" or "ca"
	run   func(ctx context.Context, publish func(*workloadcert.Bundle))
	close func()
}

// newCertSource chooses the certificate provider, as Istio's agent does: mounted
// workload credentials when present, else a CSR to the CA when a credential is
// configured, else none (the proxy gets no SDS).
func newCertSource(env map[string]string, o Options, discoveryAddress string, served *workloadcert.Served,
	reg prometheus.Registerer, log *slog.Logger) (*certSource, error) {
	present, err := workloadcert.FilesPresent(o.CredentialsDir)
	if err != nil {
		return nil, err
	}
	if present {
		f := &workloadcert.Files{Dir: o.CredentialsDir, Interval: o.CertCheckInterval, Served: served, Log: log}
		return &certSource{kind: "files", run: f.Run, close: func() {}}, nil
	}
	switch p := env["PILOT_CERT_PROVIDER"]; p {
	case "", "istiod":
	case "none":
		return nil, nil
	default:
		return nil, fmt.Errorf("PILOT_CERT_PROVIDER: %q is not supported (want istiod or none)", p)
	}
	token := caToken(env)
	if token == "" {
		return nil, nil
	}
	rc, err := rotatorConfig(env, discoveryAddress)
	if err != nil {
		return nil, err
	}
	client, err := caclient.New(caclient.Config{Address: rc.caAddr, RootFile: rc.rootFile, ServerName: istiodSAN(env),
		TokenFile: token, ClientCertificate: served.TLSCertificate})
	if err != nil {
		return nil, err
	}
	rc.CA, rc.Served, rc.Registry, rc.Log, rc.MeshRootFile = client, served, reg, log, rc.rootFile
	r, err := workloadcert.NewRotator(rc.RotatorConfig)
	if err != nil {
		client.Close()
		return nil, err
	}
	log.Info("workload certificates from the CA", "ca", rc.caAddr, "identity", rc.Identity, "credential", token,
		"ttl", rc.TTL, "key", rc.KeyType)
	return &certSource{kind: "ca", run: r.Run, close: func() { client.Close() }}, nil
}

// caToken is the credential file for discovery (the CA and xDS): WASMESH_CA_TOKEN_FILE,
// else the projected token in a Kubernetes pod; "" when there is none.
func caToken(env map[string]string) string {
	token := env[TokenFileEnv]
	if token == "" && env["KUBERNETES_SERVICE_HOST"] != "" {
		if _, err := os.Stat(KubernetesTokenFile); err == nil {
			token = KubernetesTokenFile
		}
	}
	return token
}

type caSettings struct {
	workloadcert.RotatorConfig
	caAddr, rootFile string
}

// rotatorConfig reads pilot-agent's variables for the CA and the certificate.
func rotatorConfig(env map[string]string, discoveryAddress string) (caSettings, error) {
	var s caSettings
	s.caAddr = env["CA_ADDR"]
	if s.caAddr == "" {
		host, _, err := net.SplitHostPort(discoveryAddress)
		if err != nil {
			return s, fmt.Errorf("CA_ADDR unset and the discovery address %q has no host: %w", discoveryAddress, err)
		}
		s.caAddr = net.JoinHostPort(host, DefaultCAPort)
	}
	s.rootFile = env["CA_ROOT_CA"]
	if s.rootFile == "" {
		s.rootFile = DefaultCARootFile
	}
	var err error
	if s.TTL, err = durationEnv(env, "SECRET_TTL", workloadcert.DefaultTTL); err != nil {
		return s, err
	}
	if v := env["SECRET_GRACE_PERIOD_RATIO"]; v != "" {
		if s.GraceRatio, err = strconv.ParseFloat(v, 64); err != nil || s.GraceRatio <= 0 || s.GraceRatio >= 1 {
			return s, fmt.Errorf("SECRET_GRACE_PERIOD_RATIO: %q is not a ratio between 0 and 1", v)
		}
	}
	s.GraceRatioJitter = DefaultGraceRatioJitter
	if v := env["SECRET_GRACE_PERIOD_RATIO_JITTER"]; v != "" {
		if s.GraceRatioJitter, err = strconv.ParseFloat(v, 64); err != nil || s.GraceRatioJitter < 0 {
			return s, fmt.Errorf("SECRET_GRACE_PERIOD_RATIO_JITTER: %q is not a non-negative ratio", v)
		}
	}
	if s.KeyType, err = csr.ParseKeyType(env["ECC_SIGNATURE_ALGORITHM"]); err != nil {
		return s, fmt.Errorf("ECC_SIGNATURE_ALGORITHM: %w", err)
	}
	td := env["TRUST_DOMAIN"]
	if td == "" {
		td = "cluster.local"
	}
	if s.Identity, err = csr.SPIFFEID(td, env["POD_NAMESPACE"], env["SERVICE_ACCOUNT"]); err != nil {
		return s, fmt.Errorf("workload identity from TRUST_DOMAIN, POD_NAMESPACE and SERVICE_ACCOUNT: %w", err)
	}
	return s, nil
}

func durationEnv(env map[string]string, name string, def time.Duration) (time.Duration, error) {
	v := env[name]
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s: %q is not a positive duration (e.g. 24h)", name, v)
	}
	return d, nil
}

// serveSDS opens the SDS socket, then serves the certificate source's bundles on it
// until ctx ends; the socket exists when it returns, before the proxy starts.
func (a *Agent) serveSDS(ctx context.Context, spawn func(func())) error {
	srv, err := sds.New(a.log, a.registry)
	if err != nil {
		return err
	}
	l, err := sds.Listen(a.o.SDSSocket)
	if err != nil {
		return fmt.Errorf("--sdsSocket: %w", err)
	}
	spawn(func() {
		if err := srv.Serve(ctx, l); err != nil {
			a.log.Error("SDS server stopped", "err", err)
		}
	})
	spawn(func() {
		defer a.certs.close()
		a.certs.run(ctx, func(b *workloadcert.Bundle) {
			if err := srv.Update(b); err != nil && !errors.Is(err, context.Canceled) {
				a.log.Error("SDS: certificate not served", "err", err)
			}
		})
	})
	a.log.Info("SDS serving the workload certificate", "socket", a.o.SDSSocket, "source", a.certs.kind)
	return nil
}

// CertHelp is the part of `agent proxy sidecar`'s help about workload certificates.
const CertHelp = `Workload certificates, served to the proxy by SDS on --sdsSocket (secrets default and
ROOTCA; the bootstrap gets the sds-grpc cluster) from the first source present:
  1. mounted files cert-chain.pem, key.pem, root-cert.pem in --credentialsDir, followed
     as they change;
  2. the CA, by CSR, when a credential is configured:
  ` + TokenFileEnv + `        the credential file sent as authorization: Bearer (the local
                               mesh's per-pod credential); on Kubernetes the default is
                               ` + KubernetesTokenFile + ` (audience istio-ca)
  PILOT_CERT_PROVIDER          istiod (default) or none (no CSR)
  CA_ADDR                      the CA (default: discovery's host, port ` + DefaultCAPort + `)
  CA_ROOT_CA                   PEM roots the CA's TLS certificate must chain to, also
                               trusted in ROOTCA (default ` + DefaultCARootFile + `)
  ISTIOD_SAN                   the name the CA's certificate must have (default
                               ` + DefaultIstiodSAN + `: discovery's serving certificate
                               names its Service, not the address it is reached at)
  TRUST_DOMAIN                 of the identity spiffe://<TRUST_DOMAIN>/ns/<POD_NAMESPACE>/sa/<SERVICE_ACCOUNT>
                               (default cluster.local)
  SECRET_TTL                   lifetime asked for (default 24h)
  SECRET_GRACE_PERIOD_RATIO    renew with this part of the lifetime left (default 0.5)
  SECRET_GRACE_PERIOD_RATIO_JITTER
                               ± this much on the ratio per renewal (default 0.01)
  ECC_SIGNATURE_ALGORITHM      the key: ECDSA (P-256, default) or RSA (2048)
  3. none: no SDS (certificates in --certDir, if any, are the proxy's own files).`
