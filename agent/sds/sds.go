// Package sds serves the workload's certificate to the proxy over Envoy's Secret
// Discovery Service on a Unix socket, as Istio's agent does: the secret `default`
// (tls_certificate: chain and key) and `ROOTCA` (validation_context: trusted CA), by
// State of the World (StreamSecrets) and Delta (DeltaSecrets). A new certificate is
// pushed on the proxy's open streams; a rejected one (NACK) is logged and counted.
//
// The wire protocol is go-control-plane's server (nonces, versions, ACK/NACK, both
// variants) over its LinearCache of secrets; the cache is wrapped only so that a stream
// asking for a secret before the first certificate exists waits for it, instead of
// getting the empty answer the cache gives a first request, which Envoy rejects and
// after which it lets its listeners warm without a certificate.
package sds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/wasmesh/wasmesh/agent/internal/uds"
	"github.com/wasmesh/wasmesh/agent/workloadcert"
)

// Istio's names: the socket, relative to the agent's working directory, and the secrets.
const (
	DefaultSocketPath = "./var/run/secrets/workload-spiffe-uds/socket"
	WorkloadSecret    = "default"
	RootSecret        = "ROOTCA"
)

// Server is the agent's SDS server.
type Server struct {
	cache  *waitingCache
	log    *slog.Logger
	nacks  prometheus.Counter
	pushes prometheus.Counter
}

// New makes a server with no secrets yet; reg may be nil.
func New(log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{
		cache: newWaitingCache(cachev3.NewLinearCache(resource.SecretType)),
		log:   log.With("scope", "sds"),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wasmesh_agent_sds_nacks_total", Help: "Secrets the proxy rejected (SDS NACKs).",
		}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wasmesh_agent_sds_pushes_total", Help: "SDS responses sent to the proxy.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{s.nacks, s.pushes} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("SDS metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Update serves a new certificate: both secrets change together, and every stream
// watching them gets them.
func (s *Server) Update(b *workloadcert.Bundle) error {
	return s.cache.update(map[string]types.Resource{
		WorkloadSecret: WorkloadSecretOf(b),
		RootSecret:     RootSecretOf(b),
	})
}

// WorkloadSecretOf is the `default` secret: Envoy's tls_certificate, inline.
func WorkloadSecretOf(b *workloadcert.Bundle) *tlsv3.Secret {
	return &tlsv3.Secret{Name: WorkloadSecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: inline(b.CertChain),
		PrivateKey:       inline(b.Key),
	}}}
}

// RootSecretOf is the `ROOTCA` secret: Envoy's validation_context with the trusted roots.
func RootSecretOf(b *workloadcert.Bundle) *tlsv3.Secret {
	return &tlsv3.Secret{Name: RootSecret, Type: &tlsv3.Secret_ValidationContext{
		ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: inline(b.Roots)},
	}}
}

func inline(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}

// Listen makes the socket: its directory is created, a stale socket from an earlier run
// removed, and the socket made readable by its owner only (it hands out the private key).
func Listen(path string) (net.Listener, error) {
	return uds.Listen("SDS socket", path)
}

// Serve answers SDS on l until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	g := grpc.NewServer()
	secretv3.RegisterSecretDiscoveryServiceServer(g, serverv3.NewServer(ctx, s.cache, s.callbacks()))
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		g.Stop()
	}()
	s.log.Info("SDS serving", "socket", l.Addr().String())
	err := g.Serve(l)
	<-stopped
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("SDS server: %w", err)
	}
	return nil
}

func (s *Server) callbacks() serverv3.CallbackFuncs {
	return serverv3.CallbackFuncs{
		StreamRequestFunc: func(id int64, r *discoveryv3.DiscoveryRequest) error {
			s.request(id, r.GetResourceNames(), r.GetResponseNonce(), r.GetVersionInfo(), r.GetErrorDetail().GetMessage(), r.GetErrorDetail() != nil)
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, r *discoveryv3.DeltaDiscoveryRequest) error {
			s.request(id, r.GetResourceNamesSubscribe(), r.GetResponseNonce(), "", r.GetErrorDetail().GetMessage(), r.GetErrorDetail() != nil)
			return nil
		},
		StreamResponseFunc: func(context.Context, int64, *discoveryv3.DiscoveryRequest, *discoveryv3.DiscoveryResponse) {
			s.pushes.Inc()
		},
		StreamDeltaResponseFunc: func(int64, *discoveryv3.DeltaDiscoveryRequest, *discoveryv3.DeltaDiscoveryResponse) {
			s.pushes.Inc()
		},
	}
}

func (s *Server) request(stream int64, names []string, nonce, version, nackMessage string, nack bool) {
	switch {
	case nack:
		s.nacks.Inc()
		s.log.Warn("the proxy rejected a secret (NACK)", "stream", stream, "nonce", nonce, "version", version, "err", nackMessage)
	case nonce == "":
		s.log.Info("proxy asks for secrets", "stream", stream, "names", strings.Join(names, ","))
	default:
		s.log.Debug("proxy applied secrets (ACK)", "stream", stream, "nonce", nonce, "version", version)
	}
}
