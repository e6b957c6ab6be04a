package registry

import (
	"log/slog"
	"sync"
	"time"

	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

// ProxiesSource is the name the workloads of connected proxies are published under.
const ProxiesSource = "proxies"

// DefaultGracePeriod is how long a disconnected proxy stays registered, Istio's
// PILOT_WORKLOAD_ENTRY_GRACE_PERIOD default.
const DefaultGracePeriod = 10 * time.Second

// AutoRegistration publishes the workloads of proxies that connect with workload metadata
// (ServiceEntries select them as endpoints), and withdraws them a grace period after their
// last connection closes; a reconnect within the grace period keeps the registration. It is
// the source of workloads named ProxiesSource; what it publishes is published under its
// lock, one change at a time, in order.
type AutoRegistration struct {
	sink    source.Sink
	grace   time.Duration
	log     *slog.Logger
	metrics *metrics.Metrics

	mu      sync.Mutex
	conns   map[string]int             // open connections per workload key
	timers  map[string]*removal        // pending removals
	current map[string]*model.Workload // registered workloads, with their health
	health  map[string]model.Health    // last health reported by each workload's agent
	closed  bool
}

// NewAutoRegistration publishes to sink.
func NewAutoRegistration(sink source.Sink, grace time.Duration, log *slog.Logger, m *metrics.Metrics) *AutoRegistration {
	return &AutoRegistration{sink: sink, grace: grace, log: log.With("scope", "autoregistration"), metrics: m,
		conns: map[string]int{}, timers: map[string]*removal{}, current: map[string]*model.Workload{}, health: map[string]model.Health{}}
}

// Connect registers (or refreshes) a workload for a new connection. Its health is the last
// one its agent reported; without a report it is unhealthy when startUnhealthy (its agent
// will report), healthy otherwise.
func (a *AutoRegistration) Connect(w *model.Workload, startUnhealthy bool) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	key := w.Key()
	reg := *w
	reg.Health = model.Healthy
	if h, ok := a.health[key]; ok {
		reg.Health = h
	} else if startUnhealthy {
		reg.Health = model.Unhealthy
	}
	w = &reg
	a.current[key] = w
	a.conns[key]++
	if t := a.timers[key]; t != nil {
		t.timer.Stop()
		delete(a.timers, key)
	}
	defer a.mu.Unlock()
	a.log.Debug("workload registered", "workload", key, "ip", w.IPs)
	a.metrics.AutoRegistrations.Inc()
	a.sink.Workloads(ProxiesSource, source.WorkloadEvent{Updated: []*model.Workload{w}})
}

// Disconnect records a closed connection; after the grace period with no connection the
// workload is removed.
func (a *AutoRegistration) Disconnect(w *model.Workload) {
	key := w.Key()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.conns[key] == 0 {
		return
	}
	a.conns[key]--
	if a.conns[key] > 0 {
		return
	}
	delete(a.conns, key)
	// The timer is stored under the lock its callback takes, so the callback sees it.
	r := &removal{}
	r.timer = time.AfterFunc(a.grace, func() { a.expire(w, r) })
	a.timers[key] = r
}

// removal is one scheduled unregistration; its identity tells a stale timer from the
// current one.
type removal struct{ timer *time.Timer }

func (a *AutoRegistration) expire(w *model.Workload, t *removal) {
	key := w.Key()
	a.mu.Lock()
	if a.closed || a.timers[key] != t || a.conns[key] > 0 {
		a.mu.Unlock()
		return
	}
	delete(a.timers, key)
	delete(a.current, key)
	delete(a.health, key)
	defer a.mu.Unlock()
	a.log.Info("workload unregistered after grace period", "workload", key)
	a.metrics.AutoUnregistrations.Inc()
	a.sink.Workloads(ProxiesSource, source.WorkloadEvent{Deleted: []string{key}})
}

// SetHealth records a health report from a workload's agent; a registered workload's
// endpoints change health (an endpoints-only push).
func (a *AutoRegistration) SetHealth(namespace, name string, healthy bool, reason string) {
	key := namespace + "/" + name
	h := model.Healthy
	if !healthy {
		h = model.Unhealthy
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.health[key] = h
	w := a.current[key]
	if w == nil || w.Health == h {
		a.mu.Unlock()
		return
	}
	upd := *w
	upd.Health = h
	a.current[key] = &upd
	defer a.mu.Unlock()
	a.log.Info("workload health", "workload", key, "healthy", healthy, "reason", reason)
	a.sink.Workloads(ProxiesSource, source.WorkloadEvent{Updated: []*model.Workload{&upd}})
}

// Close stops pending removals (the registry is being shut down).
func (a *AutoRegistration) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	for _, t := range a.timers {
		t.timer.Stop()
	}
	a.timers = map[string]*removal{}
}
