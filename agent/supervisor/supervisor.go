// Package supervisor runs the proxy as a sequence of hot-restart epochs, as pilot-agent's
// agent loop does: a new desired configuration starts a new epoch beside the running
// one (Envoy drains the old one itself), a proxy that fails takes every epoch down and
// is restarted with exponential backoff from a bounded budget, and a spent budget ends
// the agent.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Proxy starts and stops one epoch of the proxy process.
type Proxy interface {
	// Run starts the epoch for config and returns when its process ends. abort ends when
	// the supervisor wants the process gone; Run then kills it and returns ErrAborted.
	// Run calls ready once, when the epoch's proxy reports it is live.
	Run(abort context.Context, config string, epoch int, ready func()) error
	// Cleanup removes what Run left behind for the epoch (its bootstrap file).
	Cleanup(epoch int)
}

// ErrAborted is what Run returns for an epoch the supervisor aborted.
var ErrAborted = errors.New("epoch aborted")

// ErrBudgetExhausted ends Run when the proxy kept failing through every retry.
var ErrBudgetExhausted = errors.New("proxy restart budget exhausted")

// ErrProxyExited ends Run when the last epoch exited on its own without an error (for
// example after /quitquitquit): there is nothing left to supervise.
var ErrProxyExited = errors.New("proxy exited")

// Retry is the restart policy after a proxy error.
type Retry struct {
	MaxRetries      int
	InitialInterval time.Duration
}

// DefaultRetry is pilot-agent's policy: 10 retries, the first after 200 ms, doubling.
func DefaultRetry() Retry { return Retry{MaxRetries: 10, InitialInterval: 200 * time.Millisecond} }

type exitStatus struct {
	epoch int
	err   error
}

// Supervisor owns the epochs. Create it with New; Run is its only goroutine of control.
type Supervisor struct {
	proxy  Proxy
	retry  Retry
	log    *slog.Logger
	config chan string
	status chan exitStatus
	ready  chan int

	// Owned by Run.
	desired, current string
	epochs           map[int]string
	aborts           map[int]context.CancelFunc
	aborting         map[int]bool
	budget           int
	restartAt        time.Time
	restartPending   bool
	live             map[int]bool // running epochs that reported live

	handover atomic.Bool // see HotRestarting

	mBudget   prometheus.Gauge
	mEpoch    prometheus.Gauge
	mRestarts *prometheus.CounterVec
}

// New returns a supervisor; reg (optional) receives its metrics.
func New(p Proxy, retry Retry, log *slog.Logger, reg prometheus.Registerer) *Supervisor {
	s := &Supervisor{
		proxy:    p,
		retry:    retry,
		log:      log.With("scope", "supervisor"),
		config:   make(chan string),
		status:   make(chan exitStatus),
		ready:    make(chan int, 16),
		epochs:   map[int]string{},
		aborts:   map[int]context.CancelFunc{},
		aborting: map[int]bool{},
		live:     map[int]bool{},
		budget:   retry.MaxRetries,
		mBudget: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wasmesh_agent_proxy_retry_budget", Help: "Restarts left before the agent gives up on the proxy."}),
		mEpoch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wasmesh_agent_proxy_epoch", Help: "Hot-restart epoch of the newest proxy process."}),
		mRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmesh_agent_proxy_starts_total", Help: "Proxy epochs started, by reason."}, []string{"reason"}),
	}
	s.mBudget.Set(float64(s.budget))
	if reg != nil {
		reg.MustRegister(s.mBudget, s.mEpoch, s.mRestarts)
	}
	return s
}

// Apply hands the supervisor a desired configuration (an opaque value such as the hash
// of the certificates); a value different from the current one starts a new epoch. It
// blocks until Run takes it or ctx ends.
func (s *Supervisor) Apply(ctx context.Context, config string) error {
	select {
	case s.config <- config:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// HotRestarting reports whether a hot restart is under way: the newest epoch has not
// reported live yet while an older one that did still runs, not aborted (and serves, as
// Envoy's parent does until its child is initialized). Safe to call from any goroutine.
func (s *Supervisor) HotRestarting() bool { return s.handover.Load() }

// updateHandover recomputes HotRestarting after the epochs changed.
func (s *Supervisor) updateHandover() {
	latest, older := s.latestEpoch(), false
	for e := range s.live {
		older = older || (e < latest && !s.aborting[e])
	}
	s.handover.Store(latest >= 0 && !s.live[latest] && older)
}

// Run is the control loop. It returns nil when ctx ends (after every epoch has been
// aborted and has exited), ErrBudgetExhausted, or ErrProxyExited.
func (s *Supervisor) Run(ctx context.Context) error {
	s.log.Info("starting proxy supervisor", "budget", s.budget)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	started := false
	for {
		select {
		case cfg := <-s.config:
			if started && cfg == s.desired {
				continue
			}
			started = true
			s.log.Info("received new config, resetting budget", "config", short(cfg))
			s.desired = cfg
			s.setBudget(s.retry.MaxRetries)
			s.reconcile("config")

		case epoch := <-s.ready:
			if _, running := s.epochs[epoch]; running {
				s.live[epoch] = true
				s.updateHandover()
			}
			if epoch == s.latestEpoch() && s.budget != s.retry.MaxRetries {
				s.log.Info("proxy epoch is live, restoring retry budget", "epoch", epoch, "budget", s.retry.MaxRetries)
				s.setBudget(s.retry.MaxRetries)
			}

		case st := <-s.status:
			delete(s.epochs, st.epoch)
			delete(s.aborts, st.epoch)
			delete(s.aborting, st.epoch)
			delete(s.live, st.epoch)
			s.updateHandover()
			s.current = s.epochs[s.latestEpoch()]
			s.proxy.Cleanup(st.epoch)
			switch {
			case errors.Is(st.err, ErrAborted):
				s.log.Info("epoch aborted", "epoch", st.epoch)
			case st.err != nil:
				s.log.Warn("epoch terminated with an error", "epoch", st.epoch, "err", st.err)
				// A failing epoch may have broken the hot-restart chain: take every epoch
				// down and start over from epoch 0.
				s.abortAll()
				if s.restartAt.IsZero() {
					if s.budget <= 0 {
						s.log.Error("permanent error: budget exhausted trying to fulfill the desired configuration; giving up on the proxy",
							"retries", s.retry.MaxRetries, "lastEpoch", st.epoch, "err", st.err)
						s.shutdown()
						return fmt.Errorf("%w after %d retries: last error: %v", ErrBudgetExhausted, s.retry.MaxRetries, st.err)
					}
					delay := s.retry.InitialInterval << uint(s.retry.MaxRetries-s.budget)
					s.restartAt = time.Now().Add(delay)
					s.setBudget(s.budget - 1)
					timer.Reset(delay)
					s.log.Info("scheduled proxy restart", "epoch", st.epoch, "delay", delay, "budget", s.budget)
				}
			default:
				s.log.Info("epoch exited normally", "epoch", st.epoch)
				if len(s.epochs) == 0 && s.restartAt.IsZero() && !s.restartPending {
					return ErrProxyExited
				}
			}
			if s.restartPending && len(s.aborting) == 0 {
				s.restartPending = false
				s.reconcile("retry")
			}

		case <-timer.C:
			s.restartAt = time.Time{}
			if len(s.aborting) > 0 {
				// The aborted epochs must be gone before epoch 0 starts again.
				s.restartPending = true
				continue
			}
			s.reconcile("retry")

		case <-ctx.Done():
			s.log.Info("stopping proxy supervisor", "epochs", len(s.epochs))
			s.shutdown()
			return nil
		}
	}
}

func (s *Supervisor) setBudget(b int) {
	s.budget = b
	s.mBudget.Set(float64(b))
}

func (s *Supervisor) reconcile(reason string) {
	s.restartAt = time.Time{}
	if s.desired == s.current && len(s.epochs) > 0 {
		s.log.Info("desired configuration is already applied")
		return
	}
	epoch := s.latestEpoch() + 1
	abort, cancel := context.WithCancel(context.Background())
	s.epochs[epoch] = s.desired
	s.aborts[epoch] = cancel
	s.current = s.desired
	s.mEpoch.Set(float64(epoch))
	s.mRestarts.WithLabelValues(reason).Inc()
	s.updateHandover()
	s.log.Info("epoch starting", "epoch", epoch, "reason", reason, "budget", s.budget)
	cfg := s.desired
	go func() {
		err := s.proxy.Run(abort, cfg, epoch, func() {
			select {
			case s.ready <- epoch:
			default:
			}
		})
		cancel()
		s.status <- exitStatus{epoch: epoch, err: err}
	}()
}

func (s *Supervisor) latestEpoch() int {
	latest := -1
	for e := range s.epochs {
		if e > latest {
			latest = e
		}
	}
	return latest
}

func (s *Supervisor) abortAll() {
	for e, cancel := range s.aborts {
		if !s.aborting[e] {
			s.aborting[e] = true
			cancel()
		}
	}
	s.updateHandover()
}

// shutdown aborts every epoch and waits for each to report, so no process and no
// goroutine outlives Run.
func (s *Supervisor) shutdown() {
	s.abortAll()
	for len(s.epochs) > 0 {
		st := <-s.status
		delete(s.epochs, st.epoch)
		delete(s.aborts, st.epoch)
		delete(s.aborting, st.epoch)
		delete(s.live, st.epoch)
		s.updateHandover()
		s.proxy.Cleanup(st.epoch)
		s.log.Info("epoch stopped", "epoch", st.epoch, "err", st.err)
	}
	s.current = ""
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}
