package upstream

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// Result is how an upstream attempt ended, as outlier detection sees it.
type Result int

// Attempt outcomes reported by the router besides HTTP status codes.
const (
	// LocalOriginConnectFailed is a connection failure or a reset before a response.
	LocalOriginConnectFailed Result = iota + 1
	// LocalOriginTimeout is a (per try or route) timeout before a response.
	LocalOriginTimeout
	// LocalOriginConnectSuccess is a connection established (split mode only).
	LocalOriginConnectSuccess
)

// Envoy's outlier detection defaults.
const (
	defaultConsecutive5xx        = 5
	defaultConsecutiveGateway    = 5
	defaultConsecutiveLocal      = 5
	defaultOutlierInterval       = 10 * time.Second
	defaultBaseEjectionTime      = 30 * time.Second
	defaultMaxEjectionTime       = 300 * time.Second
	defaultMaxEjectionPercent    = 10
	defaultEnforcing5xx          = 100
	defaultEnforcingGateway      = 0
	defaultEnforcingLocalFailure = 100
)

// outlierHost is one host's outlier detection state.
type outlierHost struct {
	mu                              sync.Mutex
	cons5xx, consGateway, consLocal uint32
	ejectedAt                       time.Time
	// backoff is the ejection time multiplier: incremented by each ejection, decremented at
	// each interval the host spends un-ejected.
	backoff uint32
}

type ejectionKind int

const (
	kind5xx ejectionKind = iota
	kindGateway
	kindLocal
)

var kindNames = [...]string{"consecutive_5xx", "consecutive_gateway_failure", "consecutive_local_origin_failure"}

// outlierDetector is Envoy's outlier detector for the consecutive error types
// (consecutive_5xx, consecutive_gateway_failure, consecutive_local_origin_failure with
// split_external_local_origin_errors): ejection inline when a counter reaches its
// threshold, enforced with the enforcing_* percentage, limited by max_ejection_percent
// (always allowing one), for base_ejection_time times the host's ejection count (capped at
// max_ejection_time), un-ejected by the interval timer.
type outlierDetector struct {
	c                              *Cluster
	thresholds, enforcing          [3]uint32
	split                          bool
	interval, base, maxEjection    time.Duration
	maxPercent                     uint32
	active                         *stats.Gauge
	enforcedTotal, overflow, total *stats.Counter
	enforced, detected             [3]*stats.Counter
	legacy5xx                      *stats.Counter
	mu                             sync.Mutex
	ejectedHosts                   map[*hostState]bool
}

func u32(v interface{ GetValue() uint32 }, isNil bool, d uint32) uint32 {
	if isNil {
		return d
	}
	return v.GetValue()
}

func newOutlierDetector(c *Cluster, od *clusterv3.OutlierDetection, sc stats.Scope) (*outlierDetector, error) {
	d := &outlierDetector{c: c, ejectedHosts: map[*hostState]bool{}}
	d.thresholds = [3]uint32{
		u32(od.GetConsecutive_5Xx(), od.GetConsecutive_5Xx() == nil, defaultConsecutive5xx),
		u32(od.GetConsecutiveGatewayFailure(), od.GetConsecutiveGatewayFailure() == nil, defaultConsecutiveGateway),
		u32(od.GetConsecutiveLocalOriginFailure(), od.GetConsecutiveLocalOriginFailure() == nil, defaultConsecutiveLocal),
	}
	d.enforcing = [3]uint32{
		u32(od.GetEnforcingConsecutive_5Xx(), od.GetEnforcingConsecutive_5Xx() == nil, defaultEnforcing5xx),
		u32(od.GetEnforcingConsecutiveGatewayFailure(), od.GetEnforcingConsecutiveGatewayFailure() == nil, defaultEnforcingGateway),
		u32(od.GetEnforcingConsecutiveLocalOriginFailure(), od.GetEnforcingConsecutiveLocalOriginFailure() == nil, defaultEnforcingLocalFailure),
	}
	d.split = od.GetSplitExternalLocalOriginErrors()
	d.interval, d.base, d.maxEjection = defaultOutlierInterval, defaultBaseEjectionTime, defaultMaxEjectionTime
	if v := od.GetInterval(); v != nil {
		d.interval = v.AsDuration()
	}
	if v := od.GetBaseEjectionTime(); v != nil {
		d.base = v.AsDuration()
	}
	if v := od.GetMaxEjectionTime(); v != nil {
		d.maxEjection = v.AsDuration()
	}
	if d.interval <= 0 {
		return nil, fmt.Errorf("outlier_detection.interval must be positive")
	}
	if od.GetMaxEjectionTime() == nil && d.base > d.maxEjection {
		// Envoy: the default max_ejection_time never shortens a longer base_ejection_time.
		d.maxEjection = d.base
	}
	if d.base > d.maxEjection {
		return nil, fmt.Errorf("outlier_detection.base_ejection_time (%s) must not exceed max_ejection_time (%s)", d.base, d.maxEjection)
	}
	d.maxPercent = u32(od.GetMaxEjectionPercent(), od.GetMaxEjectionPercent() == nil, defaultMaxEjectionPercent)
	osc := sc.Scope("outlier_detection")
	d.active = osc.Gauge("ejections_active")
	d.enforcedTotal = osc.Counter("ejections_enforced_total")
	d.overflow = osc.Counter("ejections_overflow")
	d.total = osc.Counter("ejections_total")
	d.legacy5xx = osc.Counter("ejections_consecutive_5xx")
	for k, n := range kindNames {
		d.enforced[k] = osc.Counter("ejections_enforced_" + n)
		d.detected[k] = osc.Counter("ejections_detected_" + n)
	}
	return d, nil
}

// putHTTPCode records a response status from host h.
func (d *outlierDetector) putHTTPCode(h *Host, code int) {
	st := h.state()
	o := &st.od
	o.mu.Lock()
	var fire []ejectionKind
	if code >= 500 && code < 600 {
		if code == 502 || code == 503 || code == 504 {
			o.consGateway++
			if o.consGateway == d.thresholds[kindGateway] {
				fire = append(fire, kindGateway)
				o.consGateway = 0
			}
		} else {
			o.consGateway = 0
		}
		o.cons5xx++
		if o.cons5xx == d.thresholds[kind5xx] {
			fire = append(fire, kind5xx)
			o.cons5xx = 0
		}
	} else {
		o.cons5xx, o.consGateway = 0, 0
	}
	o.mu.Unlock()
	for _, k := range fire {
		d.eject(st, k)
	}
}

// putResult records a locally originated outcome. Without split mode failures count as
// Envoy maps them: a connection failure as 503, a timeout as 504.
func (d *outlierDetector) putResult(h *Host, r Result) {
	if !d.split {
		switch r {
		case LocalOriginConnectFailed:
			d.putHTTPCode(h, 503)
		case LocalOriginTimeout:
			d.putHTTPCode(h, 504)
		}
		return
	}
	st := h.state()
	o := &st.od
	o.mu.Lock()
	fire := false
	switch r {
	case LocalOriginConnectSuccess:
		o.consLocal = 0
	case LocalOriginConnectFailed, LocalOriginTimeout:
		o.consLocal++
		if o.consLocal == d.thresholds[kindLocal] {
			fire = true
			o.consLocal = 0
		}
	}
	o.mu.Unlock()
	if fire {
		d.eject(st, kindLocal)
	}
}

func (d *outlierDetector) eject(st *hostState, k ejectionKind) {
	d.mu.Lock()
	if st.ejected.Load() {
		d.mu.Unlock()
		return
	}
	d.detected[k].Inc()
	d.total.Inc()
	if k == kind5xx {
		d.legacy5xx.Inc()
	}
	if rand.Uint32N(100) >= d.enforcing[k] {
		d.mu.Unlock()
		return
	}
	total := len(d.c.Hosts().All)
	active := len(d.ejectedHosts)
	if active > 0 && total > 0 && uint32(100*(active+1)/total) > d.maxPercent {
		d.overflow.Inc()
		d.mu.Unlock()
		return
	}
	st.od.mu.Lock()
	st.od.ejectedAt = time.Now()
	if time.Duration(st.od.backoff)*d.base < d.maxEjection {
		st.od.backoff++
	}
	st.od.mu.Unlock()
	st.ejected.Store(true)
	d.ejectedHosts[st] = true
	d.active.Set(int64(len(d.ejectedHosts)))
	d.enforcedTotal.Inc()
	d.enforced[k].Inc()
	d.mu.Unlock()
	d.c.HealthChanged()
}

// run is the interval timer: ejected hosts whose time is up come back, and hosts that stay
// un-ejected work their ejection multiplier down.
func (d *outlierDetector) run(ctx context.Context) {
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			d.tick(now)
		}
	}
}

func (d *outlierDetector) tick(now time.Time) {
	changed := false
	current := map[*hostState]bool{}
	for _, h := range d.c.Hosts().All {
		st := h.state()
		current[st] = true
		st.od.mu.Lock()
		if st.ejected.Load() {
			dur := min(time.Duration(st.od.backoff)*d.base, d.maxEjection)
			if !now.Before(st.od.ejectedAt.Add(dur)) {
				st.ejected.Store(false)
				changed = true
			}
		} else if st.od.backoff > 0 {
			st.od.backoff--
		}
		st.od.mu.Unlock()
	}
	d.mu.Lock()
	for st := range d.ejectedHosts {
		// Un-ejected, or gone from the cluster.
		if !st.ejected.Load() || !current[st] {
			delete(d.ejectedHosts, st)
		}
	}
	d.active.Set(int64(len(d.ejectedHosts)))
	d.mu.Unlock()
	if changed {
		d.c.HealthChanged()
	}
}
