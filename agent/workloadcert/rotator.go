package workloadcert

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"

	"github.com/wasmesh/wasmesh/agent/csr"
)

// Istio's defaults: SECRET_TTL and SECRET_GRACE_PERIOD_RATIO.
const (
	DefaultTTL        = 24 * time.Hour
	DefaultGraceRatio = 0.5
)

// Signer is the CA (package caclient's Client).
type Signer interface {
	Sign(ctx context.Context, csrPEM []byte, ttl time.Duration) ([]string, error)
}

// Clock is the rotator's time, a seam for tests.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Backoff is the wait between failed attempts: Initial, doubled up to Max, ±10% jitter.
type Backoff struct {
	Initial, Max time.Duration
}

// DefaultBackoff retries quickly at first (a pod starting beside a CA that starts too),
// then every 30 s at most.
func DefaultBackoff() Backoff { return Backoff{Initial: 500 * time.Millisecond, Max: 30 * time.Second} }

// RotatorConfig is what a Rotator needs.
type RotatorConfig struct {
	CA       Signer
	Identity *url.URL
	KeyType  csr.KeyType
	// TTL is the lifetime asked for (SECRET_TTL); the CA may give less.
	TTL time.Duration
	// GraceRatio is the part of the lifetime left when the certificate is renewed
	// (SECRET_GRACE_PERIOD_RATIO): 0.5 renews at half the lifetime.
	GraceRatio float64
	// GraceRatioJitter spreads the renewals of workloads started together
	// (SECRET_GRACE_PERIOD_RATIO_JITTER, Istio's default 0.01): each renewal's ratio is
	// GraceRatio ± up to this much. Zero: none.
	GraceRatioJitter float64
	// MeshRootFile, if set, holds roots trusted besides the CA's own (the mesh root
	// file: during a root rotation it holds the old and new roots).
	MeshRootFile string
	Backoff      Backoff
	Clock        Clock
	Served       *Served
	Registry     prometheus.Registerer
	Log          *slog.Logger
}

// Rotator gets the workload's certificate from the CA and renews it before it expires.
type Rotator struct {
	c        RotatorConfig
	log      *slog.Logger
	attempts *prometheus.CounterVec
}

// NewRotator checks the configuration.
func NewRotator(c RotatorConfig) (*Rotator, error) {
	if c.CA == nil || c.Identity == nil {
		return nil, errors.New("certificate rotation needs a CA and an identity")
	}
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.GraceRatio <= 0 || c.GraceRatio >= 1 {
		if c.GraceRatio != 0 {
			return nil, fmt.Errorf("SECRET_GRACE_PERIOD_RATIO %v: want a ratio between 0 and 1", c.GraceRatio)
		}
		c.GraceRatio = DefaultGraceRatio
	}
	if c.GraceRatioJitter < 0 || c.GraceRatioJitter >= min(c.GraceRatio, 1-c.GraceRatio) {
		return nil, fmt.Errorf("SECRET_GRACE_PERIOD_RATIO_JITTER %v: want at least 0 and less than %v", c.GraceRatioJitter, min(c.GraceRatio, 1-c.GraceRatio))
	}
	if c.Backoff.Initial <= 0 {
		c.Backoff = DefaultBackoff()
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Served == nil {
		c.Served = NewServed(nil, c.Clock.Now)
	}
	// The expiry checks are on the rotator's clock.
	c.Served.now = c.Clock.Now
	r := &Rotator{c: c, log: c.Log.With("scope", "workloadcert"), attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "wasmesh_agent_cert_requests_total",
		Help: "Certificate signing requests to the CA, by result (ok, or the gRPC code of the failure).",
	}, []string{"result"})}
	if c.Registry != nil {
		if err := c.Registry.Register(r.attempts); err != nil {
			return nil, fmt.Errorf("certificate metrics: %w", err)
		}
	}
	return r, nil
}

// RefreshAt is when a certificate is renewed: with GraceRatio of its lifetime left.
func RefreshAt(leafNotBefore, leafNotAfter time.Time, graceRatio float64) time.Time {
	life := leafNotAfter.Sub(leafNotBefore)
	return leafNotAfter.Add(-time.Duration(float64(life) * graceRatio))
}

// Run gets a certificate, publishes it, and renews it at its refresh time, until ctx
// ends. A failed request is retried with back-off for as long as it takes; the served
// certificate stays until a new one arrives, and its coming expiry is logged louder as
// it nears.
func (r *Rotator) Run(ctx context.Context, publish func(*Bundle)) {
	for {
		b, ok := r.obtain(ctx)
		if !ok {
			return
		}
		r.c.Served.Set(b)
		r.log.Info("workload certificate issued", describe(b)...)
		publish(b)
		// A certificate already due (a lifetime within the clock's skew, a CA that gave
		// far less than asked) is renewed after the first back-off, not in a loop.
		ratio := r.c.GraceRatio + r.c.GraceRatioJitter*(2*rand.Float64()-1)
		wait := max(RefreshAt(b.Leaf.NotBefore, b.Leaf.NotAfter, ratio).Sub(r.c.Clock.Now()), r.c.Backoff.Initial)
		select {
		case <-ctx.Done():
			return
		case <-r.c.Clock.After(wait):
		}
	}
}

// obtain asks the CA until it answers with a usable certificate, or ctx ends.
func (r *Rotator) obtain(ctx context.Context) (*Bundle, bool) {
	wait := r.c.Backoff.Initial
	for attempt := 1; ; attempt++ {
		b, err := r.issue(ctx)
		if err == nil {
			r.attempts.WithLabelValues("ok").Inc()
			return b, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		r.attempts.WithLabelValues(status.Code(err).String()).Inc()
		d := jitter(wait)
		r.reportFailure(err, attempt, d)
		select {
		case <-ctx.Done():
			return nil, false
		case <-r.c.Clock.After(d):
		}
		wait = min(2*wait, r.c.Backoff.Max)
	}
}

// reportFailure logs a failed attempt, louder when the served certificate has less than
// a quarter of its lifetime left (at the default ratio, half of the time left for renewal).
func (r *Rotator) reportFailure(err error, attempt int, retryIn time.Duration) {
	args := []any{"err", err, "attempt", attempt, "retryIn", retryIn.Round(time.Millisecond)}
	state, left := r.c.Served.Check()
	if state != NoCertificate {
		args = append(args, "expiresIn", left.Round(time.Second))
	}
	switch state {
	case NoCertificate:
		r.log.Warn("no workload certificate yet: the CA request failed", args...)
	case Expired:
		r.log.Error("the served workload certificate has EXPIRED and could not be renewed", args...)
	case ExpiringSoon:
		r.log.Error("the served workload certificate expires soon and could not be renewed", args...)
	default:
		r.log.Warn("workload certificate renewal failed", args...)
	}
}

// issue makes a new key and CSR and has the CA sign it.
func (r *Rotator) issue(ctx context.Context) (*Bundle, error) {
	req, err := csr.New(r.c.KeyType, r.c.Identity)
	if err != nil {
		return nil, err
	}
	chain, err := r.c.CA.Sign(ctx, req.CSR, r.c.TTL)
	if err != nil {
		return nil, fmt.Errorf("signing %s: %w", r.c.Identity, err)
	}
	// The root is the last of the chain (Istio's API); a lone leaf has only the mesh roots.
	var caRoot []byte
	leafAndInter := chain
	if len(chain) > 1 {
		caRoot, leafAndInter = []byte(chain[len(chain)-1]), chain[:len(chain)-1]
	}
	var meshRoots []byte
	if r.c.MeshRootFile != "" {
		if meshRoots, err = os.ReadFile(r.c.MeshRootFile); err != nil {
			r.log.Warn("mesh root file unreadable; trusting the CA's root only", "err", err)
		}
	}
	b, err := NewBundle([]byte(joinPEM(leafAndInter)), req.Key, MergeRoots(caRoot, meshRoots))
	if err != nil {
		return nil, fmt.Errorf("the CA's answer for %s: %w", r.c.Identity, err)
	}
	return b, nil
}

func joinPEM(certs []string) string {
	var sb strings.Builder
	for _, c := range certs {
		sb.WriteString(strings.TrimSpace(c))
		sb.WriteString("\n")
	}
	return sb.String()
}

func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.9 + 0.2*rand.Float64()))
}
