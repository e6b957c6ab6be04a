// Package upstream is meshproxy's cluster manager: clusters from the bootstrap or CDS,
// their endpoints (static, DNS or EDS) grouped by priority, load balancing over the healthy
// hosts, and a connection pool per cluster (HTTP/1.1 keep-alive or h2c) with Envoy's
// cluster statistics.
//
// Policies that are not part of the core live in their own files and plug in through the
// Manager's registries: a load balancer per lb_policy (lbpolicies.go), and the Hooks a
// cluster consults around each request (circuit breakers, outlier detection).
package upstream

import (
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// Host is one upstream endpoint of a cluster.
type Host struct {
	// Address is "ip:port" (or "name:port" for DNS clusters resolved at connect time).
	Address  string
	Hostname string
	Weight   uint32
	Priority uint32
	Locality *corev3.Locality
	// LocalityWeight is the weight of the host's locality (0 when unset).
	LocalityWeight uint32
	Metadata       *corev3.Metadata
	Health         corev3.HealthStatus

	// ActiveRequests is the number of requests in flight to the host (least request LB).
	ActiveRequests atomic.Int64
	// ejected is set by outlier detection.
	ejected atomic.Bool
}

// Healthy reports whether the host may take traffic: its EDS health status is
// UNKNOWN or HEALTHY (DEGRADED hosts are used only when nothing better is left, which
// this proxy treats as healthy) and outlier detection has not ejected it.
func (h *Host) Healthy() bool {
	if h.ejected.Load() {
		return false
	}
	switch h.Health {
	case corev3.HealthStatus_UNKNOWN, corev3.HealthStatus_HEALTHY, corev3.HealthStatus_DEGRADED:
		return true
	}
	return false
}

// Ejected reports whether outlier detection ejected the host.
func (h *Host) Ejected() bool { return h.ejected.Load() }

// SetEjected is outlier detection's switch.
func (h *Host) SetEjected(v bool) { h.ejected.Store(v) }

// Excluded reports whether EDS marked the host as not to be used at all (DRAINING or
// TIMEOUT/UNHEALTHY still count towards membership_total, as in Envoy).
func (h *Host) Excluded() bool { return h.Health == corev3.HealthStatus_DRAINING }

// HostSet is a cluster's hosts, grouped by priority (index = priority).
type HostSet struct {
	All        []*Host
	Priorities [][]*Host
}

// NewHostSet groups hosts by priority.
func NewHostSet(hosts []*Host) *HostSet {
	s := &HostSet{All: hosts}
	for _, h := range hosts {
		for int(h.Priority) >= len(s.Priorities) {
			s.Priorities = append(s.Priorities, nil)
		}
		s.Priorities[h.Priority] = append(s.Priorities[h.Priority], h)
	}
	return s
}

// Healthy counts the healthy hosts.
func (s *HostSet) Healthy() int {
	n := 0
	for _, h := range s.All {
		if h.Healthy() {
			n++
		}
	}
	return n
}

// PanicThreshold is Envoy's default healthy panic threshold (percent): below it the load
// balancer ignores health and uses every host of the priority.
const PanicThreshold = 50

// Candidates returns the hosts a load balancer should choose from, following Envoy's
// priority and panic rules in a simplified form: the healthy hosts of the first priority
// that is healthy enough (with Envoy's 1.4 overprovisioning factor), else of the first
// priority that has any; when the healthy share of the whole cluster is below the panic
// threshold (including no healthy host at all) health is ignored and every usable host of
// the first non-empty priority is a candidate, as in Envoy's panic mode. Nil means the
// cluster has no hosts (UH).
func (s *HostSet) Candidates() (hosts []*Host, panic bool) {
	total, healthyTotal := 0, 0
	var firstHealthy []*Host
	for _, p := range s.Priorities {
		var healthy []*Host
		for _, h := range p {
			if h.Healthy() {
				healthy = append(healthy, h)
			}
		}
		total += len(p)
		healthyTotal += len(healthy)
		if len(healthy) > 0 && len(healthy)*140 >= 100*len(p) {
			return healthy, false
		}
		if firstHealthy == nil && len(healthy) > 0 {
			firstHealthy = healthy
		}
	}
	if total == 0 {
		return nil, false
	}
	if healthyTotal*100 >= PanicThreshold*total && firstHealthy != nil {
		return firstHealthy, false
	}
	for _, p := range s.Priorities {
		if u := usable(p); len(u) > 0 {
			return u, true
		}
	}
	return nil, true
}

func usable(hs []*Host) []*Host {
	out := make([]*Host, 0, len(hs))
	for _, h := range hs {
		if !h.Excluded() {
			out = append(out, h)
		}
	}
	return out
}
