// Package pusher decides what to send: it debounces change requests, builds the snapshot of
// each push from the mesh state, finds the proxies a change concerns (Istio's
// ProxyNeedsPush) and generates each proxy's resources, shared between proxies that would get
// the same. How it is sent (streams, nonces, ACK/NACK, queues, timeouts) is package server's:
// the server registers each connection as a Watcher and is handed the pushes that concern it.
package pusher

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// ConfigStore lists the configs in force, sorted by key (config.CompareKeys).
type ConfigStore interface {
	List() []*config.Config
}

// Deps are what the pusher builds snapshots from.
type Deps struct {
	Registry registry.Registry
	Configs  ConfigStore
	Mesh     func() *meshconfig.MeshConfig
	// Options are given to every snapshot built.
	Options push.Options
	// OnSnapshot, when set, sees every snapshot before it is used (discovery attaches the
	// reporting of configuration that could not be applied).
	OnSnapshot func(*xds.Snapshot)
}

// Status describes the latest push, for /debug/push_status.
type Status struct {
	Version   string         `json:"version"`
	Full      bool           `json:"full"`
	Reasons   map[string]int `json:"reasons"`
	Start     time.Time      `json:"start"`
	BuiltAt   time.Time      `json:"builtAt"`
	BuildTime string         `json:"buildTime"`
	Services  int            `json:"services"`
	Configs   int            `json:"configs"`
}

// Pusher turns changes into pushes. Create with New, then Run.
type Pusher struct {
	log      *slog.Logger
	metrics  *metrics.Metrics
	debounce push.DebounceOptions
	deps     Deps

	updates chan *push.Request
	subs    *subscriptions
	index   *watchIndex

	snapshot atomic.Pointer[xds.Snapshot]
	ready    atomic.Bool
	version  atomic.Uint64
	// unsettled counts the changes handed to ConfigUpdate, by their reasons (which merging
	// adds up), that are not yet delivered to the watchers they concern.
	unsettled atomic.Int64

	mu     sync.Mutex
	status Status

	stop     chan struct{} // closed when Run's context ends
	stopOnce sync.Once
}

// New returns a pusher building from deps.
func New(log *slog.Logger, m *metrics.Metrics, debounce push.DebounceOptions, deps Deps) *Pusher {
	return &Pusher{log: log.With("scope", "push"), metrics: m, debounce: debounce, deps: deps,
		updates: make(chan *push.Request, 1024), subs: newSubscriptions(), index: newWatchIndex(), stop: make(chan struct{})}
}

// ConfigUpdate hands a change to the debouncer. It never blocks a source for long: the
// debouncer drains the channel continuously.
func (p *Pusher) ConfigUpdate(r *push.Request) {
	triggers := 0
	for reason, n := range r.Reasons {
		p.metrics.PushTriggers.WithLabelValues(reason).Add(float64(n))
		triggers += n
	}
	p.unsettled.Add(int64(triggers))
	if r.Full {
		p.metrics.InboundUpdates.WithLabelValues("config").Inc()
	} else {
		p.metrics.InboundUpdates.WithLabelValues("eds").Inc()
	}
	select {
	case p.updates <- r:
	case <-p.stop:
		p.unsettled.Add(-int64(triggers))
	}
}

// Snapshot returns the snapshot in force (nil before the first build).
func (p *Pusher) Snapshot() *xds.Snapshot { return p.snapshot.Load() }

// Ready reports whether the first snapshot has been built.
func (p *Pusher) Ready() bool { return p.ready.Load() }

// Settled reports whether every change handed in so far has been delivered to every
// watcher it concerns (none waits in the debouncer or is being built). Tests check with it,
// and the server's queue, that nothing else followed a change.
func (p *Pusher) Settled() bool { return p.unsettled.Load() == 0 }

// Status returns the latest push's status.
func (p *Pusher) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// Run builds the initial snapshot and runs the debouncer until ctx ends.
func (p *Pusher) Run(ctx context.Context) {
	p.build(push.NewFull(push.ReasonUnknown))
	p.ready.Store(true)
	go func() {
		<-ctx.Done()
		p.stopOnce.Do(func() { close(p.stop) })
	}()
	push.Debounce(ctx, p.updates, p.debounce, p.push, func(d time.Duration) { p.metrics.DebounceTime.Observe(d.Seconds()) })
}

// build makes the snapshot for r and installs it.
func (p *Pusher) build(r *push.Request) *xds.Snapshot {
	start := time.Now()
	version := fmt.Sprintf("%s/%d", start.UTC().Format("2006-01-02T15:04:05Z"), p.version.Add(1))
	cur := p.snapshot.Load()
	full := r.Full || cur == nil
	if !full {
		// Endpoints of DNS services live inside their clusters: they need CDS.
		for h := range r.EDSHosts {
			if svc := cur.Service(h); svc != nil && svc.Resolution != model.ClientSideLB {
				full = true
				break
			}
			// With mTLS, clusters carry their endpoints' identities as SANs: a change of
			// those needs CDS too (istiod's EDS update is a full push when service accounts
			// change).
			if cur.Options.MTLS && xds.IdentitiesChanged(cur.Snapshot, p.deps.Registry, h) {
				full = true
				break
			}
		}
	}
	var snap *xds.Snapshot
	if full {
		var configs []*config.Config
		if p.deps.Configs != nil {
			configs = p.deps.Configs.List()
		}
		var prevIx *config.Index
		if cur != nil {
			prevIx = cur.Configs
		}
		if ix := config.Reindex(prevIx, configs); cur != nil && servicesOnly(r) {
			// The changed hosts say what changed: the rest of the snapshot is shared.
			snap = cur.WithServices(version, ix, p.deps.Registry, r.EDSHosts)
		} else {
			b := push.Build(version, p.deps.Mesh(), ix, p.deps.Registry)
			b.Options = p.deps.Options
			snap = xds.NewSnapshot(b)
		}
	} else {
		snap = cur.WithEndpoints(version, p.deps.Registry, r.EDSHosts)
	}
	if p.deps.OnSnapshot != nil {
		p.deps.OnSnapshot(snap)
	}
	p.snapshot.Store(snap)
	elapsed := time.Since(start)
	p.metrics.PushContextInitTime.Observe(elapsed.Seconds())
	p.metrics.Services.Set(float64(len(snap.Services)))
	p.mu.Lock()
	p.status = Status{Version: version, Full: full, Reasons: r.Reasons, Start: r.Start, BuiltAt: time.Now(), BuildTime: elapsed.String(),
		Services: len(snap.Services), Configs: snap.Configs.Len()}
	p.mu.Unlock()
	if full && !r.Full {
		r.Full = true
	}
	return snap
}

// push is the debouncer's callback: build, then hand the event to every watcher it
// concerns. It returns once all have it, which frees the debouncer for the next push.
func (p *Pusher) push(_ context.Context, r *push.Request) {
	prev := p.snapshot.Load()
	snap := p.build(r)
	p.log.Debug("push", "version", snap.Version, "request", r.String())
	ev := &Event{snap: snap, req: r, queued: time.Now()}
	for _, w := range p.index.concerned(ev, prev) {
		w.target.Push(ev)
	}
	triggers := 0
	for _, n := range r.Reasons {
		triggers += n
	}
	p.unsettled.Add(-int64(triggers))
}

// Current is an event that brings a watcher up to the snapshot in force (a full push), for
// a connection whose updates were held.
func (p *Pusher) Current(reason string) *Event {
	return &Event{snap: p.Snapshot(), req: push.NewFull(reason), queued: time.Now()}
}

// servicesOnly reports whether a full request changed nothing but services and their
// endpoints (ServiceEntry and WorkloadEntry configs, registry events): no generator reads
// those configs except through the services, so the changed hosts say which proxies it
// concerns.
func servicesOnly(r *push.Request) bool {
	for reason := range r.Reasons {
		switch reason {
		case push.ReasonService, push.ReasonEndpoint:
		case push.ReasonConfig:
			if len(r.ConfigsUpdated) == 0 {
				return false // a config change that does not say which
			}
		default:
			return false
		}
	}
	for k := range r.ConfigsUpdated {
		if k.Kind != config.ServiceEntry && k.Kind != config.WorkloadEntry {
			return false
		}
	}
	return true
}

// View is a proxy's view of the snapshot in force (for debug pages).
func (p *Pusher) View(proxy *model.Proxy) *xds.View {
	return xds.CachedView(p.Snapshot(), proxy, xds.Shape(proxy))
}
