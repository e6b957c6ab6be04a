// Package upstream is meshproxy's cluster manager: clusters from the bootstrap or CDS,
// their endpoints (static, DNS or EDS) grouped by priority and locality, load balancing
// over the healthy hosts with Envoy's priority, panic and locality rules, circuit breakers,
// outlier detection, and a connection pool per cluster (HTTP/1.1 keep-alive or h2c) with
// Envoy's cluster statistics.
//
// Load balancers live in lbpolicies.go (one per lb_policy), circuit breakers in
// breakers.go and outlier detection in outlier.go.
package upstream

import (
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// Host is one upstream endpoint of a cluster. A Host value is replaced when EDS sends
// the endpoint again; the state that must survive that (requests in flight, outlier
// detection) lives in a hostState shared by every Host value of the same address.
type Host struct {
	// Address is "ip:port" (or "name:port" for DNS clusters resolved at connect time), or
	// the socket path of a pipe address (Network "unix"; a leading '@' is Linux's abstract
	// namespace, as in Envoy).
	Address string
	// Network is "" for TCP, "unix" for a pipe address.
	Network  string
	Hostname string
	Weight   uint32
	Priority uint32
	Locality *corev3.Locality
	// LocalityWeight is the weight of the host's locality (0 when unset).
	LocalityWeight uint32
	Metadata       *corev3.Metadata
	Health         corev3.HealthStatus

	st *hostState
}

// hostState is what a host keeps across endpoint updates.
type hostState struct {
	active  atomic.Int64
	ejected atomic.Bool
	od      outlierHost
}

func (h *Host) state() *hostState {
	if h.st == nil {
		// Hosts built outside a cluster (ORIGINAL_DST, tests) get their state on first use;
		// such hosts are used by one request at a time.
		h.st = &hostState{}
	}
	return h.st
}

// DialNetwork is the network to dial the host's address on ("tcp" or "unix").
func (h *Host) DialNetwork() string {
	if h.Network == "" {
		return "tcp"
	}
	return h.Network
}

// ActiveRequests is the number of requests in flight to the host (least request LB,
// /clusters rq_active).
func (h *Host) ActiveRequests() int64 { return h.state().active.Load() }

// RequestStarted and RequestFinished count a request in flight to the host.
func (h *Host) RequestStarted()  { h.state().active.Add(1) }
func (h *Host) RequestFinished() { h.state().active.Add(-1) }

// Healthy reports whether the host may take traffic: its EDS health status is
// UNKNOWN or HEALTHY (DEGRADED hosts are used only when nothing better is left, which
// this proxy treats as healthy) and outlier detection has not ejected it.
func (h *Host) Healthy() bool {
	if h.state().ejected.Load() {
		return false
	}
	switch h.Health {
	case corev3.HealthStatus_UNKNOWN, corev3.HealthStatus_HEALTHY, corev3.HealthStatus_DEGRADED:
		return true
	}
	return false
}

// Ejected reports whether outlier detection ejected the host.
func (h *Host) Ejected() bool { return h.state().ejected.Load() }

// Excluded reports whether EDS marked the host as not to be used at all, even in panic
// (DRAINING; TIMEOUT/UNHEALTHY hosts still count towards membership_total, as in Envoy).
func (h *Host) Excluded() bool { return h.Health == corev3.HealthStatus_DRAINING }

// HostSet is a cluster's hosts, grouped by priority (index = priority).
type HostSet struct {
	All        []*Host
	Priorities [][]*Host
	// OverprovisioningFactor is the ClusterLoadAssignment's policy.overprovisioning_factor
	// in percent (Envoy's default 140).
	OverprovisioningFactor uint32
}

// DefaultOverprovisioningFactor is Envoy's default overprovisioning factor (1.4).
const DefaultOverprovisioningFactor = 140

// NewHostSet groups hosts by priority.
func NewHostSet(hosts []*Host) *HostSet {
	s := &HostSet{All: hosts, OverprovisioningFactor: DefaultOverprovisioningFactor}
	for _, h := range hosts {
		for int(h.Priority) >= len(s.Priorities) {
			s.Priorities = append(s.Priorities, nil)
		}
		s.Priorities[h.Priority] = append(s.Priorities[h.Priority], h)
	}
	return s
}

// adopt carries the per-address state of old into the hosts of s, so that an EDS update
// keeps requests in flight, ejections and outlier counters.
func (s *HostSet) adopt(old *HostSet) {
	prev := map[string]*hostState{}
	if old != nil {
		for _, h := range old.All {
			if h.st != nil {
				prev[h.Address] = h.st
			}
		}
	}
	for _, h := range s.All {
		if st := prev[h.Address]; st != nil {
			h.st = st
		} else if h.st == nil {
			h.st = &hostState{}
		}
	}
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

// PanicThreshold is Envoy's default healthy panic threshold (percent).
const PanicThreshold = 50
