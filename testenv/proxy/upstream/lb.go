package upstream

import (
	"net/http"
	"sync/atomic"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
)

// LBContext is what a load balancer may look at for one request.
type LBContext struct {
	// Request is the downstream request (hash policies read headers from it).
	Request *http.Request
	// Hash is the request hash computed by the route's hash policy, when HasHash.
	Hash    uint64
	HasHash bool
	// Attempted are hosts already tried by earlier attempts of the same request (retry host
	// predicates avoid them when they can).
	Attempted []*Host
}

// LoadBalancer chooses a host among candidates (never empty).
type LoadBalancer interface {
	Choose(candidates []*Host, ctx *LBContext) *Host
}

// LBFactory builds a load balancer for a cluster. It is called when the cluster is
// created or updated, not when its hosts change: a balancer sees the current candidates on
// every Choose.
type LBFactory func(c *clusterv3.Cluster) (LoadBalancer, error)

// roundRobin is Envoy's ROUND_ROBIN: hosts in turn, weighted by repetition when weights
// differ.
type roundRobin struct {
	next atomic.Uint64
}

func newRoundRobin(*clusterv3.Cluster) (LoadBalancer, error) { return &roundRobin{}, nil }

func (r *roundRobin) Choose(candidates []*Host, _ *LBContext) *Host {
	n := r.next.Add(1) - 1
	weighted := false
	var total uint64
	for _, h := range candidates {
		w := uint64(max(h.Weight, 1))
		total += w
		if w != 1 {
			weighted = true
		}
	}
	if !weighted {
		return candidates[n%uint64(len(candidates))]
	}
	slot := n % total
	for _, h := range candidates {
		w := uint64(max(h.Weight, 1))
		if slot < w {
			return h
		}
		slot -= w
	}
	return candidates[0]
}
