// Package meshstate owns what push snapshots are built from: the configs in force and the
// service registry, kept up to date from the sources' events alone (it is their
// source.Sink; no source is ever read back). Several sources merge here: for one config key
// or workload, the source listed first in New's order wins, and the others' versions wait
// until it lets go. Every change leaves as a push request for the debouncer.
package meshstate

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

// State is the mesh as the sources published it.
type State struct {
	log   *slog.Logger
	order []string // sources by precedence

	// Entries is the registry of ServiceEntries, WorkloadEntries and workloads; Registry
	// aggregates the services the sources publish (Kubernetes), which win for a host they
	// define, and Entries.
	Entries   *registry.ServiceEntries
	Registry  *registry.Aggregate
	published map[string]*registry.Published

	mu        sync.Mutex
	configs   *merged[config.Key, *config.Config]
	sorted    []*config.Config // the configs in force, sorted by key
	workloads *merged[string, *model.Workload]
	synced    map[string]bool
	ready     chan struct{} // closed once every source has synced
	push      func(*push.Request)
}

// New returns an empty state merging the named sources, first wins. push receives every
// change; set it before any source runs.
func New(log *slog.Logger, entries *registry.ServiceEntries, push func(*push.Request), sources ...string) *State {
	s := &State{log: log.With("scope", "meshstate"), order: sources, Entries: entries,
		published: map[string]*registry.Published{},
		configs:   newMerged[config.Key, *config.Config](sources), workloads: newMerged[string, *model.Workload](sources),
		synced: map[string]bool{}, ready: make(chan struct{}), push: push}
	var regs []registry.Registry
	for _, src := range sources {
		s.published[src] = registry.NewPublished(src)
		regs = append(regs, s.published[src])
	}
	s.Registry = registry.NewAggregate(append(regs, entries)...)
	s.Registry.AddHandler(s.registryChanged)
	return s
}

// registryChanged turns a registry's change into a push request: services changed (full, with
// the hosts), or only endpoints.
func (s *State) registryChanged(ev registry.Event) {
	if ev.Full {
		r := push.NewFull(push.ReasonService)
		r.EDSHosts = ev.Hosts
		s.emit(r)
		return
	}
	s.emit(push.NewEDS(ev.Hosts))
}

// emit hands a change to the pusher once every source has synced: until then there is no
// snapshot to change, and the first one is built from the whole state.
func (s *State) emit(r *push.Request) {
	if s.Ready() {
		s.push(r)
	}
}

// Configs implements source.Sink: the configs in force change by precedence, the registry
// applies its kinds' changes (and pushes the services and endpoints they change), and the
// changed keys are pushed.
func (s *State) Configs(from string, ev source.ConfigEvent) {
	s.mu.Lock()
	set := make(map[config.Key]*config.Config, len(ev.Updated))
	for _, c := range ev.Updated {
		set[c.Key()] = c
	}
	changed := s.configs.apply(from, set, ev.Deleted, func(a, b *config.Config) bool { return a == b })
	if len(changed) > 0 {
		keys := make(map[config.Key]struct{}, len(changed))
		for k := range changed {
			keys[k] = struct{}{}
		}
		s.sorted = config.UpdateSorted(s.sorted, s.configs.inForce, keys)
	}
	s.mu.Unlock()
	if len(changed) == 0 {
		return
	}
	s.Entries.Apply(changed)
	keys := make([]config.Key, 0, len(changed))
	for k := range changed {
		keys = append(keys, k)
	}
	// The registry pushed the services and endpoints; the config request covers every other
	// kind.
	s.emit(push.NewFull(push.ReasonConfig, keys...))
}

// Services implements source.Sink: the source's registry holds them (and pushes what
// changed).
func (s *State) Services(from string, ev source.ServiceEvent) {
	s.publishedBy(from).SetServices(ev.Updated, ev.Deleted)
}

// Endpoints implements source.Sink.
func (s *State) Endpoints(from string, ev source.EndpointEvent) {
	s.publishedBy(from).SetEndpoints(ev.Host, ev.Endpoints)
}

func (s *State) publishedBy(from string) *registry.Published {
	p := s.published[from]
	if p == nil {
		panic(fmt.Sprintf("meshstate: unknown source %q", from)) // a wiring mistake, not input
	}
	return p
}

// Workloads implements source.Sink: the workloads in force change by precedence and the
// registry selects among them.
func (s *State) Workloads(from string, ev source.WorkloadEvent) {
	s.mu.Lock()
	set := make(map[string]*model.Workload, len(ev.Updated))
	for _, w := range ev.Updated {
		set[w.Key()] = w
	}
	changed := s.workloads.apply(from, set, ev.Deleted, func(a, b *model.Workload) bool { return a == b || a.Equal(b) })
	s.mu.Unlock()
	for key, w := range changed {
		if w != nil {
			s.Entries.SetWorkload(w)
			continue
		}
		ns, name, _ := strings.Cut(key, "/")
		s.Entries.DeleteWorkload(ns, name)
	}
}

// Synced implements source.Sink.
func (s *State) Synced(from string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.synced[from] {
		return
	}
	s.log.Info("source synced", "source", from)
	s.synced[from] = true
	for _, src := range s.order {
		if src != registry.ProxiesSource && !s.synced[src] {
			return
		}
	}
	close(s.ready)
}

// Ready reports whether every source has published its initial state (the proxies, which
// come and go, are not waited for).
func (s *State) Ready() bool {
	select {
	case <-s.ready:
		return true
	default:
		return false
	}
}

// WaitReady waits until Ready or ctx ends.
func (s *State) WaitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// List returns the configs in force, sorted by key (config.CompareKeys); the list is not
// changed afterwards, a later change makes a new one.
func (s *State) List() []*config.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sorted)
}

// Shadowed lists the configs a source holds that are not in force because a source before
// it holds the same key, with the source that holds it.
func (s *State) Shadowed() map[config.Key]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.configs.shadowed()
}

// merged is one kind of thing several sources publish, by key: what each holds, and what is
// in force (the first source's in order).
type merged[K comparable, V any] struct {
	order    []string
	bySource map[string]map[K]V
	inForce  map[K]V
	from     map[K]string // the source of what is in force
}

func newMerged[K comparable, V any](order []string) *merged[K, V] {
	return &merged[K, V]{order: order, bySource: map[string]map[K]V{}, inForce: map[K]V{}, from: map[K]string{}}
}

// apply records what src set and deleted and returns what changed in force (a zero value:
// nothing in force any more). same tells an unchanged value.
func (m *merged[K, V]) apply(src string, set map[K]V, deleted []K, same func(a, b V) bool) map[K]V {
	held := m.bySource[src]
	if held == nil {
		if !slices.Contains(m.order, src) {
			panic(fmt.Sprintf("meshstate: unknown source %q", src)) // a wiring mistake, not input
		}
		held = map[K]V{}
		m.bySource[src] = held
	}
	touched := make([]K, 0, len(set)+len(deleted))
	for k, v := range set {
		held[k] = v
		touched = append(touched, k)
	}
	for _, k := range deleted {
		delete(held, k)
		touched = append(touched, k)
	}
	changed := map[K]V{}
	for _, k := range touched {
		v, src, ok := m.winner(k)
		old, had := m.inForce[k]
		switch {
		case !ok && had:
			delete(m.inForce, k)
			delete(m.from, k)
			var zero V
			changed[k] = zero
		case ok && (!had || !same(old, v)):
			m.inForce[k], m.from[k] = v, src
			changed[k] = v
		case ok:
			m.from[k] = src
		}
	}
	return changed
}

// winner is the value of the first source in order that holds k.
func (m *merged[K, V]) winner(k K) (V, string, bool) {
	for _, src := range m.order {
		if v, ok := m.bySource[src][k]; ok {
			return v, src, true
		}
	}
	var zero V
	return zero, "", false
}

// shadowed lists the keys some source holds but another, earlier one has in force.
func (m *merged[K, V]) shadowed() map[K]string {
	out := map[K]string{}
	for src, held := range m.bySource {
		for k := range held {
			if m.from[k] != src {
				out[k] = m.from[k]
			}
		}
	}
	return out
}
