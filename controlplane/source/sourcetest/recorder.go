// Package sourcetest helps test sources: Recorder is a source.Sink that keeps every event and
// the state the events add up to, so a test judges a source by what it published alone.
package sourcetest

import (
	"slices"
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

// Recorder records what sources publish.
type Recorder struct {
	mu        sync.Mutex
	configs   map[config.Key]*config.Config
	services  map[string]*model.Service
	endpoints map[string][]*model.Endpoint
	workloads map[string]*model.Workload
	events    []source.ConfigEvent
	synced    map[string]bool
	changed   chan struct{} // closed and replaced on every event
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{configs: map[config.Key]*config.Config{}, services: map[string]*model.Service{},
		endpoints: map[string][]*model.Endpoint{}, workloads: map[string]*model.Workload{},
		synced: map[string]bool{}, changed: make(chan struct{})}
}

func (r *Recorder) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Changed returns a channel closed at the next event.
func (r *Recorder) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// Configs implements source.Sink.
func (r *Recorder) Configs(_ string, ev source.ConfigEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range ev.Updated {
		r.configs[c.Key()] = c
	}
	for _, k := range ev.Deleted {
		delete(r.configs, k)
	}
	r.events = append(r.events, ev)
	r.notify()
}

// Services implements source.Sink.
func (r *Recorder) Services(_ string, ev source.ServiceEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range ev.Updated {
		r.services[s.Hostname] = s
	}
	for _, h := range ev.Deleted {
		delete(r.services, h)
	}
	r.notify()
}

// Endpoints implements source.Sink.
func (r *Recorder) Endpoints(_ string, ev source.EndpointEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(ev.Endpoints) == 0 {
		delete(r.endpoints, ev.Host)
	} else {
		r.endpoints[ev.Host] = ev.Endpoints
	}
	r.notify()
}

// Workloads implements source.Sink.
func (r *Recorder) Workloads(_ string, ev source.WorkloadEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ev.Updated {
		r.workloads[w.Key()] = w
	}
	for _, k := range ev.Deleted {
		delete(r.workloads, k)
	}
	r.notify()
}

// Synced implements source.Sink.
func (r *Recorder) Synced(from string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.synced[from] = true
	r.notify()
}

// IsSynced reports whether from said it synced.
func (r *Recorder) IsSynced(from string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced[from]
}

// List returns the configs the events add up to, sorted by key.
func (r *Recorder) List() []*config.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*config.Config, 0, len(r.configs))
	for _, c := range r.configs {
		out = append(out, c)
	}
	config.SortConfigs(out)
	return out
}

// Get returns the config the events left in force for k, or nil.
func (r *Recorder) Get(k config.Key) *config.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.configs[k]
}

// ConfigEvents returns the config events so far.
func (r *Recorder) ConfigEvents() []source.ConfigEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Service returns the service the events left for host, or nil.
func (r *Recorder) Service(host string) *model.Service {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.services[host]
}

// HostEndpoints returns the endpoints the events left for host.
func (r *Recorder) HostEndpoints(host string) []*model.Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.endpoints[host]
}

// Workload returns the workload the events left for key (namespace/name), or nil.
func (r *Recorder) Workload(key string) *model.Workload {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.workloads[key]
}
