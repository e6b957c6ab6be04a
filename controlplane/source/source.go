// Package source is how config and service sources reach the control plane: a source (the
// config directory, Kubernetes) publishes typed events that carry what changed to a Sink,
// and is never read back. The Sink (package meshstate) owns the indexes snapshots are built
// from and updates them from these events alone.
package source

import (
	"context"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
)

// ConfigEvent is a change of the configs a source holds in force: the configs added or
// changed (Updated, each a whole new version) and the keys no longer in force (Deleted).
// A source's first event after it starts (or after Reset) carries everything it holds.
type ConfigEvent struct {
	Updated []*config.Config
	Deleted []config.Key
}

// ServiceEvent is a change of the services a service registry source holds (Kubernetes
// Services): the services added or changed, and the hostnames gone.
type ServiceEvent struct {
	Updated []*model.Service
	Deleted []string
}

// EndpointEvent replaces the endpoints a source holds for one host (an empty list: none).
type EndpointEvent struct {
	Host      string
	Endpoints []*model.Endpoint
}

// WorkloadEvent is a change of the workloads a source holds (Kubernetes pods, proxies that
// connect): those added or changed, and the keys (namespace/name) of those gone. A
// ServiceEntry's workloadSelector selects among them.
type WorkloadEvent struct {
	Updated []*model.Workload
	Deleted []string
}

// Sink receives what sources publish. Every call names the source (Source.Name), so the
// sink can merge several sources by a documented precedence and drop everything of a source
// that resets. Calls from one source are made one at a time, in the order of its changes.
type Sink interface {
	Configs(from string, ev ConfigEvent)
	Services(from string, ev ServiceEvent)
	Endpoints(from string, ev EndpointEvent)
	Workloads(from string, ev WorkloadEvent)
	// Synced says the source has published its initial state (the directory read, every
	// informer listed); the control plane is ready once every source has.
	Synced(from string)
}

// Source publishes to a Sink until its context ends.
type Source interface {
	// Name identifies the source in events, debug pages and logs ("configDir", "kubernetes").
	Name() string
	// Run publishes the source's state, then every change, until ctx ends. An error means
	// the source cannot serve at all (its directory is not one); transient failures (an API
	// server away) are retried inside and reported by the source.
	Run(ctx context.Context, sink Sink) error
}
