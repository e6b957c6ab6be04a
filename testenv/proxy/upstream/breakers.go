package upstream

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// Envoy's default circuit breaker thresholds.
const (
	defaultMaxConnections     = 1024
	defaultMaxPendingRequests = 1024
	defaultMaxRequests        = 1024
	defaultMaxRetries         = 3
)

// ErrOverflow is a request refused by a circuit breaker (Envoy's UO, reset reason
// "overflow").
var ErrOverflow = errors.New("overflow")

// resource is one circuit breaker limit with its gauges
// (circuit_breakers.<priority>.<x>_open and, with track_remaining, remaining_<x>).
type resource struct {
	max       int64
	cur       atomic.Int64
	open      *stats.Gauge
	remaining *stats.Gauge
}

func newResource(sc stats.Scope, prefix string, max uint32, openName, remainingName string, track bool) *resource {
	r := &resource{max: int64(max), open: sc.Gauge(prefix + openName)}
	if track {
		r.remaining = sc.Gauge(prefix + remainingName)
	}
	r.publish(0)
	return r
}

func (r *resource) publish(n int64) {
	if n >= r.max {
		r.open.Set(1)
	} else {
		r.open.Set(0)
	}
	if r.remaining != nil {
		r.remaining.Set(max(r.max-n, 0))
	}
}

// tryInc takes one unit if the limit allows it.
func (r *resource) tryInc() bool {
	for {
		n := r.cur.Load()
		if n >= r.max {
			return false
		}
		if r.cur.CompareAndSwap(n, n+1) {
			r.publish(n + 1)
			return true
		}
	}
}

func (r *resource) dec() { r.publish(r.cur.Add(-1)) }

// Breakers are the circuit breakers of one routing priority of a cluster. The
// connection limit is modelled the way Envoy's HTTP/1.1 pool behaves: every request in
// flight holds a connection, a request that finds max_connections in use waits as a pending
// request (upstream_cx_overflow), and one that finds max_pending_requests waiting, or
// max_requests active, is refused with 503 UO (upstream_rq_pending_overflow).
type Breakers struct {
	cx, pending, rq, retries *resource
	st                       *ClusterStats

	mu      sync.Mutex
	waiters []chan struct{}
}

func newBreakers(t *clusterv3.CircuitBreakers_Thresholds, name string, sc stats.Scope, st *ClusterStats) *Breakers {
	maxOf := func(v interface{ GetValue() uint32 }, isNil bool, d uint32) uint32 {
		if isNil {
			return d
		}
		return v.GetValue()
	}
	prefix := "circuit_breakers." + name + "."
	track := t.GetTrackRemaining()
	return &Breakers{st: st,
		cx:      newResource(sc, prefix, maxOf(t.GetMaxConnections(), t.GetMaxConnections() == nil, defaultMaxConnections), "cx_open", "remaining_cx", track),
		pending: newResource(sc, prefix, maxOf(t.GetMaxPendingRequests(), t.GetMaxPendingRequests() == nil, defaultMaxPendingRequests), "rq_pending_open", "remaining_pending", track),
		rq:      newResource(sc, prefix, maxOf(t.GetMaxRequests(), t.GetMaxRequests() == nil, defaultMaxRequests), "rq_open", "remaining_rq", track),
		retries: newResource(sc, prefix, maxOf(t.GetMaxRetries(), t.GetMaxRetries() == nil, defaultMaxRetries), "rq_retry_open", "remaining_retries", track),
	}
}

// breakersFor builds the DEFAULT and HIGH priority breakers of a cluster.
func breakersFor(cfg *clusterv3.Cluster, sc stats.Scope, st *ClusterStats) [2]*Breakers {
	var th [2]*clusterv3.CircuitBreakers_Thresholds
	for _, t := range cfg.GetCircuitBreakers().GetThresholds() {
		th[t.GetPriority()] = t
	}
	var out [2]*Breakers
	for p, name := range []string{"default", "high"} {
		t := th[p]
		if t == nil {
			t = &clusterv3.CircuitBreakers_Thresholds{Priority: corev3.RoutingPriority(p)}
		}
		out[p] = newBreakers(t, name, sc, st)
	}
	return out
}

// Acquire admits one upstream request (one attempt). For HTTP/1.1 upstreams it also takes a
// connection slot, waiting as a pending request while all max_connections are in use;
// the wait ends with ctx (upstream_rq_cancelled). The returned release must be called once
// the request is done with its connection. ErrOverflow means a breaker refused it.
func (b *Breakers) Acquire(ctx context.Context, http2 bool) (func(), error) {
	if !b.rq.tryInc() {
		b.st.UpstreamRqPendingOverflow.Inc()
		return nil, ErrOverflow
	}
	if http2 {
		return b.rq.dec, nil
	}
	b.mu.Lock()
	if len(b.waiters) == 0 && b.cx.tryInc() {
		b.mu.Unlock()
		return b.releaseSlot, nil
	}
	b.st.UpstreamCxOverflow.Inc()
	if !b.pending.tryInc() {
		b.mu.Unlock()
		b.rq.dec()
		b.st.UpstreamRqPendingOverflow.Inc()
		return nil, ErrOverflow
	}
	ch := make(chan struct{})
	b.waiters = append(b.waiters, ch)
	b.mu.Unlock()
	b.st.UpstreamRqPendingTotal.Inc()
	b.st.UpstreamRqPendingActive.Inc()
	defer b.st.UpstreamRqPendingActive.Dec()
	select {
	case <-ch:
		b.pending.dec()
		return b.releaseSlot, nil
	case <-ctx.Done():
		b.mu.Lock()
		handed := true
		for i, w := range b.waiters {
			if w == ch {
				b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
				handed = false
				break
			}
		}
		b.mu.Unlock()
		if handed {
			b.releaseSlot0()
		}
		b.pending.dec()
		b.rq.dec()
		b.st.UpstreamRqCancelled.Inc()
		return nil, ctx.Err()
	}
}

func (b *Breakers) releaseSlot() {
	b.releaseSlot0()
	b.rq.dec()
}

// releaseSlot0 hands a connection slot to the first waiter, or frees it.
func (b *Breakers) releaseSlot0() {
	b.mu.Lock()
	if len(b.waiters) > 0 {
		ch := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.mu.Unlock()
		close(ch)
		return
	}
	b.cx.dec()
	b.mu.Unlock()
}

// TryRetry takes one of max_retries; release it with ReleaseRetry when the retry ends.
func (b *Breakers) TryRetry() bool { return b.retries.tryInc() }

// ReleaseRetry gives a retry back.
func (b *Breakers) ReleaseRetry() { b.retries.dec() }

// TryConnection takes one of max_connections for a TCP proxy connection (Envoy's tcp_proxy
// checks the breaker before connecting and refuses the connection when it is open).
func (b *Breakers) TryConnection() (release func(), ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.cx.tryInc() {
		b.st.UpstreamCxOverflow.Inc()
		return nil, false
	}
	return b.releaseSlot0, true
}
