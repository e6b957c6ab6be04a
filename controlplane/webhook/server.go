// Package webhook is discovery's admission webhook server, as istiod's on port 15017: one
// TLS listener hosting AdmissionReview (admission.k8s.io/v1) handlers by path (/validate
// today, sidecar injection next), the certificate it serves (from files, or signed by a CA
// every replica shares through a Secret, renewed before it expires) and the caBundle of the
// ValidatingWebhookConfiguration discovery owns, kept current.
package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultAddr is istiod's webhook port.
const DefaultAddr = ":15017"

// Certs is what the server serves and what the webhook configuration must trust.
type Certs interface {
	// GetCertificate is the serving certificate, read at every handshake: a renewed or
	// reloaded certificate is served from the next connection on, without a restart.
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// CABundle is the PEM of the CA the serving certificate chains to (nil until known): the
	// caBundle of the webhook configuration.
	CABundle() []byte
	// Changed is closed at the next change of CABundle after the call.
	Changed() <-chan struct{}
	// Run keeps the certificates current until ctx ends.
	Run(ctx context.Context) error
}

// Options configure a Server.
type Options struct {
	Addr  string // default DefaultAddr
	Certs Certs
	Log   *slog.Logger
	// Registerer takes the server's and its handlers' metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Server is the TLS server of the admission webhooks.
type Server struct {
	log      *slog.Logger
	certs    Certs
	lis      net.Listener
	mux      *http.ServeMux
	reg      prometheus.Registerer
	requests *prometheus.CounterVec
}

// New binds the listener (so that tests can ask for port 0 and read the address); Run
// serves.
func New(opts Options) (*Server, error) {
	if opts.Certs == nil {
		return nil, errors.New("webhook server: no certificates")
	}
	if opts.Addr == "" {
		opts.Addr = DefaultAddr
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	lis, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("webhookAddr: %w", err)
	}
	s := &Server{log: opts.Log.With("scope", "webhook"), certs: opts.Certs, lis: lis, mux: http.NewServeMux(), reg: opts.Registerer,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmesh_webhook_requests_total",
			Help: "Admission requests served by the webhook server, by path and HTTP status.",
		}, []string{"path", "code"})}
	if s.reg != nil {
		if err := s.reg.Register(s.requests); err != nil {
			lis.Close()
			return nil, fmt.Errorf("webhook metrics: %w", err)
		}
	}
	return s, nil
}

// Registerer is where handlers register their metrics (nil: nowhere).
func (s *Server) Registerer() prometheus.Registerer { return s.reg }

// HandleAdmission serves AdmissionReviews on path with admit.
func (s *Server) HandleAdmission(path string, admit AdmitFunc) {
	s.mux.Handle(path, reviewHandler(path, admit, s.log, s.requests))
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Run serves until ctx ends, then shuts down, giving requests under way grace to finish.
func (s *Server) Run(ctx context.Context, grace time.Duration) error {
	h := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.certs.GetCertificate},
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug), // TLS handshake failures of probes
	}
	errc := make(chan error, 1)
	go func() { errc <- h.ServeTLS(s.lis, "", "") }()
	s.log.Info("webhook server serving", "addr", s.Addr())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	_ = h.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close releases the listener of a server that never ran.
func (s *Server) Close() error { return s.lis.Close() }
