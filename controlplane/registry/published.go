package registry

import (
	"slices"
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// Published is the registry of a source that publishes services and endpoints (Kubernetes):
// it holds what the source said last and tells its handlers what changed, nothing when a
// source says again what it said (an informer's relist).
type Published struct {
	name string

	mu        sync.RWMutex
	services  map[string]*model.Service
	sorted    []*model.Service // by host; replaced, never changed in place
	endpoints map[string][]*model.Endpoint
	handlers  []Handler
}

// NewPublished returns an empty registry named after its source.
func NewPublished(name string) *Published {
	return &Published{name: name, services: map[string]*model.Service{}, endpoints: map[string][]*model.Endpoint{}}
}

// Name implements Registry.
func (p *Published) Name() string { return p.name }

// AddHandler implements Registry.
func (p *Published) AddHandler(h Handler) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.handlers = append(p.handlers, h)
}

// Services implements Registry.
func (p *Published) Services() []*model.Service {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.sorted
}

// Endpoints implements Registry.
func (p *Published) Endpoints(host string) []*model.Endpoint {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.endpoints[host]
}

// SetServices applies services added or changed and hosts gone; the hosts whose service
// changed are a full change.
func (p *Published) SetServices(updated []*model.Service, deleted []string) {
	p.mu.Lock()
	changed := map[string]struct{}{}
	for _, s := range updated {
		if !model.ServiceEqual(p.services[s.Hostname], s) {
			p.services[s.Hostname] = s
			changed[s.Hostname] = struct{}{}
		}
	}
	for _, h := range deleted {
		if _, ok := p.services[h]; ok {
			delete(p.services, h)
			changed[h] = struct{}{}
		}
	}
	if len(changed) > 0 {
		// A new slice: the one published before may be held by a snapshot.
		sorted := slices.Clone(p.sorted)
		if len(changed) > len(sorted)/16 {
			sorted = sorted[:0]
			for _, s := range p.services {
				sorted = append(sorted, s)
			}
			slices.SortFunc(sorted, model.CompareHosts)
		} else {
			for h := range changed {
				sorted = model.PatchServices(sorted, h, p.services[h])
			}
		}
		p.sorted = sorted
	}
	handlers := p.handlers
	p.mu.Unlock()
	if len(changed) > 0 {
		notify(handlers, Event{Full: true, Hosts: changed})
	}
}

// SetEndpoints replaces the endpoints of host (none: an empty list): an endpoints-only
// change when they differ.
func (p *Published) SetEndpoints(host string, eps []*model.Endpoint) {
	p.mu.Lock()
	if model.EndpointsEqual(p.endpoints[host], eps) {
		p.mu.Unlock()
		return
	}
	if len(eps) == 0 {
		delete(p.endpoints, host)
	} else {
		p.endpoints[host] = eps
	}
	handlers := p.handlers
	p.mu.Unlock()
	notify(handlers, Event{Hosts: map[string]struct{}{host: {}}})
}
