// Package push is the control plane's push pipeline: change requests that say what changed,
// the debouncer that merges them (PILOT_DEBOUNCE_AFTER / PILOT_DEBOUNCE_MAX, one push in
// flight), and the immutable snapshot every generator reads instead of the live stores.
package push

import (
	"sort"
	"strings"
	"time"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// Reasons a push was triggered, Istio's pilot_push_triggers labels.
const (
	ReasonConfig     = "config"
	ReasonEndpoint   = "endpoint"
	ReasonService    = "service"
	ReasonMesh       = "global"
	ReasonProxy      = "proxyrequest"
	ReasonUnknown    = "unknown"
	ReasonDebugForce = "debug"
	ReasonReconnect  = "reconnect"
)

// Request says what changed. A full request rebuilds every resource type; an endpoints-only
// request (Full false) names the hosts whose endpoints changed and pushes only EDS.
type Request struct {
	Full           bool
	ConfigsUpdated map[config.Key]struct{}
	EDSHosts       map[string]struct{}
	Reasons        map[string]int
	// Start is when the first merged change arrived; convergence is measured from it.
	Start time.Time
}

// NewFull returns a full push request.
func NewFull(reason string, keys ...config.Key) *Request {
	r := &Request{Full: true, Reasons: map[string]int{reason: 1}, Start: time.Now(), ConfigsUpdated: map[config.Key]struct{}{}}
	for _, k := range keys {
		r.ConfigsUpdated[k] = struct{}{}
	}
	return r
}

// NewEDS returns an endpoints-only request for hosts.
func NewEDS(hosts map[string]struct{}) *Request {
	h := make(map[string]struct{}, len(hosts))
	for k := range hosts {
		h[k] = struct{}{}
	}
	return &Request{EDSHosts: h, Reasons: map[string]int{ReasonEndpoint: 1}, Start: time.Now()}
}

// Merge combines two requests: full wins, sets are joined, the earlier start is kept. It
// returns a new request and modifies neither input.
func (r *Request) Merge(o *Request) *Request {
	if r == nil {
		return o
	}
	if o == nil {
		return r
	}
	m := &Request{Full: r.Full || o.Full, Start: r.Start, Reasons: map[string]int{}}
	if o.Start.Before(m.Start) {
		m.Start = o.Start
	}
	for _, src := range []*Request{r, o} {
		for k, v := range src.Reasons {
			m.Reasons[k] += v
		}
		if len(src.ConfigsUpdated) > 0 && m.ConfigsUpdated == nil {
			m.ConfigsUpdated = map[config.Key]struct{}{}
		}
		for k := range src.ConfigsUpdated {
			m.ConfigsUpdated[k] = struct{}{}
		}
		if len(src.EDSHosts) > 0 && m.EDSHosts == nil {
			m.EDSHosts = map[string]struct{}{}
		}
		for k := range src.EDSHosts {
			m.EDSHosts[k] = struct{}{}
		}
	}
	return m
}

// String summarises the request for logs.
func (r *Request) String() string {
	var reasons []string
	for k := range r.Reasons {
		reasons = append(reasons, k)
	}
	sort.Strings(reasons)
	kind := "eds"
	if r.Full {
		kind = "full"
	}
	return kind + "(" + strings.Join(reasons, ",") + ")"
}
