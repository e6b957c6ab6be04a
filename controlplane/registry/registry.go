// Package registry is the service registry: services and their endpoints from ServiceEntry
// and WorkloadEntry configs and from proxies that connect with workload metadata
// (auto-registration), behind an interface so other registries (Kubernetes) plug in, and an
// aggregate over several registries.
package registry

import (
	"slices"
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// Event says what a registry changed. Full means service definitions changed (a full push);
// otherwise only the endpoints of Hosts changed.
type Event struct {
	Full  bool
	Hosts map[string]struct{}
}

// Handler is called after a registry has applied a change.
type Handler func(Event)

// Registry is a source of services and endpoints. Returned slices and values are immutable:
// a change publishes new ones, so a push snapshot can hold them without copying.
type Registry interface {
	Name() string
	// Services returns the registry's services, sorted by host.
	Services() []*model.Service
	// Endpoints returns the endpoints of host across its ports, sorted.
	Endpoints(host string) []*model.Endpoint
	AddHandler(Handler)
}

// Aggregate joins registries; for a host defined by several, the first registry wins.
type Aggregate struct {
	mu   sync.RWMutex
	regs []Registry
}

// NewAggregate returns an aggregate over regs, in priority order.
func NewAggregate(regs ...Registry) *Aggregate { return &Aggregate{regs: regs} }

// Add appends a registry with the lowest priority.
func (a *Aggregate) Add(r Registry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.regs = append(a.regs, r)
}

// Name implements Registry.
func (a *Aggregate) Name() string { return "aggregate" }

// Services returns every registry's services, sorted by host, first registry winning.
func (a *Aggregate) Services() []*model.Service {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if len(a.regs) == 1 {
		return a.regs[0].Services() // sorted already
	}
	seen := map[string]bool{}
	var out []*model.Service
	for _, r := range a.regs {
		for _, s := range r.Services() {
			if !seen[s.Hostname] {
				seen[s.Hostname] = true
				out = append(out, s)
			}
		}
	}
	slices.SortFunc(out, model.CompareHosts)
	return out
}

// Endpoints returns the endpoints from the first registry that has any for host.
func (a *Aggregate) Endpoints(host string) []*model.Endpoint {
	a.mu.RLock()
	defer a.mu.RUnlock()
	for _, r := range a.regs {
		if eps := r.Endpoints(host); len(eps) > 0 {
			return eps
		}
	}
	return nil
}

// AddHandler registers h on every registry.
func (a *Aggregate) AddHandler(h Handler) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	for _, r := range a.regs {
		r.AddHandler(h)
	}
}
