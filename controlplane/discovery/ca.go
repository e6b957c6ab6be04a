package discovery

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/client-go/kubernetes"

	"github.com/wasmesh/wasmesh/controlplane/ca"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/webhook"
)

// CAOptions configure the mesh's CA and Istio's certificate API.
type CAOptions struct {
	// SecureGRPCAddr serves istio.v1.auth.IstioCertificateService over TLS (istiod's
	// ":15012"); empty: no CA server.
	SecureGRPCAddr string
	// Dir keeps the self-signed root without Kubernetes (--caDir; root-cert.pem there is the
	// local mesh's root file). On Kubernetes the root is kept in the Secret istio-ca-secret.
	Dir string
	// CertsDir is a plugged-in CA (Istio's cacerts files, --caCertsDir); on Kubernetes the
	// Secret cacerts is read too. A plugged-in CA wins over the self-signed root.
	CertsDir string
	// LocalCredentialKey is the file of the Ed25519 public key local-mesh credentials are
	// checked with (ca.MintCredential); empty: none accepted.
	LocalCredentialKey string
	// Hosts are more names or addresses for the secure port's serving certificate, beside
	// the istiod Service's names (WebhookOptions.ServiceName).
	Hosts []string
	// WorkloadCertTTL is a workload certificate's lifetime when the caller asks for none
	// (DEFAULT_WORKLOAD_CERT_TTL, 24h); MaxWorkloadCertTTL cuts a longer one
	// (MAX_WORKLOAD_CERT_TTL, 90 days).
	WorkloadCertTTL, MaxWorkloadCertTTL time.Duration
}

// certificateAuthority sets up the CA (where it is kept) when something needs it: the
// certificate service (with SecureGRPCAddr, on its TLS listener) or the webhook's generated
// certificate.
func (d *Discovery) certificateAuthority(kc kubernetes.Interface) error {
	o, w := d.opts.CA, d.opts.Webhook
	if o.SecureGRPCAddr == "" && (kc == nil || w.Addr == "" || w.CertDir != "") {
		return nil
	}
	if o.Dir == "" && o.CertsDir == "" && kc == nil {
		return fmt.Errorf("secureGRPCAddr %s: the CA needs caDir (or caCertsDir, or the Kubernetes API server) to keep its root", o.SecureGRPCAddr)
	}
	keep := ca.KeeperOptions{PluggedDir: o.CertsDir, Dir: o.Dir, Log: d.log}
	if kc != nil {
		keep.Client, keep.Namespace, keep.SecretName = kc, d.namespace(), w.CASecret
	}
	var err error
	if d.CA, err = ca.NewKeeper(keep); err != nil {
		return err
	}
	if kc == nil { // files: a CA that does not load is a mistake to say at once
		if _, err := d.CA.Refresh(context.Background()); err != nil {
			return err
		}
	}
	if o.SecureGRPCAddr == "" {
		return nil
	}
	return d.caServer(kc)
}

// caServer binds the secure port and builds the certificate service on it.
func (d *Discovery) caServer(kc kubernetes.Interface) error {
	o := d.opts.CA
	opts := ca.ServerOptions{CA: d.CA.Current, Kube: kc, DefaultTTL: o.WorkloadCertTTL, MaxTTL: o.MaxWorkloadCertTTL,
		Registerer: d.Reg, Log: d.log, TrustDomain: func() string {
			if td := d.Mesh.Mesh().GetTrustDomain(); td != "" {
				return td
			}
			return "cluster.local"
		}}
	if o.LocalCredentialKey != "" {
		key, err := ca.ReadCredentialKey(o.LocalCredentialKey)
		if err != nil {
			return err
		}
		opts.LocalKey = key
	}
	srv, err := ca.NewServer(opts)
	if err != nil {
		return err
	}
	certs, err := webhook.NewGeneratedCerts(webhook.GenerateOptions{CA: d.CA.Refresh, Namespace: d.namespace(),
		ServiceName: d.opts.Webhook.ServiceName, Hosts: o.Hosts, Scope: "ca", Log: d.log})
	if err != nil {
		return err
	}
	d.secureCerts, d.certService = certs, srv
	// A client certificate is asked for, not required: a workload renewing shows its own,
	// one getting its first certificate shows a token; the services check either. ADS is
	// served here too, as istiod does, every stream authenticated with the CA's rules.
	d.secureGRPC = grpc.NewServer(server.GRPCOptions(append([]grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{
		GetCertificate: certs.GetCertificate, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12,
	}))}, d.opts.GRPCOptions...)...)...)
	srv.Register(d.secureGRPC)
	var podIPs func(ip, ns, sa string) bool
	if d.Kube != nil {
		podIPs = d.podHolds
	}
	auth, err := newXDSAuth(srv, opts.TrustDomain, podIPs, d.Reg, d.log)
	if err != nil {
		return err
	}
	d.Server.RegisterSecure(d.secureGRPC, auth)
	if d.secureLis, err = net.Listen("tcp", o.SecureGRPCAddr); err != nil {
		return fmt.Errorf("secureGRPCAddr: %w", err)
	}
	return nil
}

// podHolds reports whether ip is the address of a workload of the registry (Kubernetes pods,
// and proxies already authorized) of namespace ns running as service account sa.
func (d *Discovery) podHolds(ip, ns, sa string) bool {
	for _, w := range d.State.Entries.Workloads() {
		if w.Namespace == ns && w.ServiceAccount == sa && slices.Contains(w.IPs, ip) {
			return true
		}
	}
	return false
}

// namespace is discovery's (default istio-system): where the CA Secret is, and the
// namespace of the Service whose names the serving certificates hold.
func (d *Discovery) namespace() string {
	if d.opts.Namespace == "" {
		return "istio-system"
	}
	return d.opts.Namespace
}

// SecureGRPCAddr is the bound secure address ("" without a CA server).
func (d *Discovery) SecureGRPCAddr() string {
	if d.secureLis == nil {
		return ""
	}
	return d.secureLis.Addr().String()
}

// runCA keeps the CA current (Keeper.Run: a CA replaced where it is kept is adopted) and
// serves the secure port.
func (d *Discovery) runCA(ctx context.Context, goRun func(string, func() error), grace time.Duration) {
	if d.CA == nil {
		return
	}
	goRun("ca", func() error { return d.CA.Run(ctx) })
	if d.secureGRPC != nil {
		goRun("secureCerts", func() error { return d.secureCerts.Run(ctx) })
		goRun("secureGRPC", func() error {
			// The port is bound (early clients wait in its backlog) and served once the
			// serving certificate is issued: a handshake before would fail ("tls: internal
			// error") and send a starting agent into its retry back-off.
			if err := d.secureCerts.WaitServing(ctx); err != nil {
				return d.secureLis.Close() // stopped before
			}
			return server.Serve(ctx, d.secureGRPC, d.secureLis, grace)
		})
	}
}
