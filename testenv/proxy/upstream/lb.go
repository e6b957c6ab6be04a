package upstream

import (
	"net/http"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// LBContext is what a load balancer may look at for one request.
type LBContext struct {
	// Request is the downstream request (hash policies read headers from it).
	Request *http.Request
	// Hash is the request hash computed by the route's hash policy, when HasHash.
	Hash    uint64
	HasHash bool
	// Attempted are hosts already tried by earlier attempts of the same request.
	Attempted []*Host
	// AvoidAttempted is the previous_hosts retry host predicate: a host in Attempted is
	// rejected and chosen again, up to HostSelectionAttempts times (Envoy's
	// host_selection_retry_max_attempts, default 1).
	AvoidAttempted        bool
	HostSelectionAttempts int
	// attempt is the selection attempt (0 first); hash balancers move along their ring
	// or table with it.
	attempt int
}

// Attempt is the current host selection attempt (0 for the first choice).
func (c *LBContext) Attempt() int {
	if c == nil {
		return 0
	}
	return c.attempt
}

func (c *LBContext) rejects(h *Host) bool {
	if c == nil || !c.AvoidAttempted {
		return false
	}
	for _, a := range c.Attempted {
		if a.Address == h.Address {
			return true
		}
	}
	return false
}

// LoadBalancer chooses a host among candidates (never empty).
type LoadBalancer interface {
	Choose(c *Candidates, ctx *LBContext) *Host
}

// LBFactory builds a load balancer for a cluster. It is called when the cluster is
// created or updated, not when its hosts change: a balancer sees the current candidates on
// every Choose. sc is the cluster's stats scope, for balancers with their own gauges.
type LBFactory func(c *clusterv3.Cluster, sc stats.Scope) (LoadBalancer, error)
