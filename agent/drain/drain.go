// Package drain decides when a terminating sidecar may stop its proxy (seed 004): it
// drains the inbound listeners, then waits either a fixed terminationDrainDuration or,
// with EXIT_ON_ZERO_ACTIVE_CONNECTIONS, MINIMUM_DRAIN_DURATION and then until the proxy
// reports no active downstream connection. Outbound listeners keep working meanwhile.
package drain

import (
	"context"
	"log/slog"
	"time"

	"github.com/wasmesh/wasmesh/agent/admin"
)

// Policy is the termination policy.
type Policy struct {
	ExitOnZeroActiveConnections bool
	// TerminationDrainDuration is the fixed wait (ProxyConfig, default 5s).
	TerminationDrainDuration time.Duration
	// MinimumDrainDuration is the wait before polling connections (default 5s).
	MinimumDrainDuration time.Duration
	// PollInterval is the connection poll period (1s in Istio).
	PollInterval time.Duration
}

// DefaultPolicy is Istio's.
func DefaultPolicy() Policy {
	return Policy{TerminationDrainDuration: 5 * time.Second, MinimumDrainDuration: 5 * time.Second, PollInterval: time.Second}
}

// Run drains and returns when the proxy may be stopped, or when ctx ends (the
// kubelet's grace period is over).
func Run(ctx context.Context, a *admin.Client, p Policy, log *slog.Logger) {
	log = log.With("scope", "drain")
	log.Info("draining inbound listeners")
	if err := a.DrainListeners(ctx); err != nil {
		log.Warn("drain listeners failed", "err", err)
	}
	if !p.ExitOnZeroActiveConnections {
		log.Info("graceful termination period starting", "duration", p.TerminationDrainDuration)
		wait(ctx, p.TerminationDrainDuration)
		log.Info("graceful termination period complete")
		return
	}
	log.Info("draining, then waiting for active connections to end", "minimum", p.MinimumDrainDuration)
	if !wait(ctx, p.MinimumDrainDuration) {
		return
	}
	poll := p.PollInterval
	if poll <= 0 {
		poll = time.Second
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		n, err := a.ActiveConnections(ctx)
		switch {
		case err != nil:
			log.Error("cannot read active connections; stopping the proxy", "err", err)
			return
		case n == -1:
			log.Info("downstream_cx_active is not available (no connection yet, or stats filtered); not waiting")
			return
		case n == 0:
			log.Info("no more active connections")
			return
		}
		log.Info("active connections remain", "count", n)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// wait returns false if ctx ended first.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
