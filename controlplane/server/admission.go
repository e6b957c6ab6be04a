package server

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// initialSyncHold is the longest a connection counts against ConnectInFlight: a proxy that
// has not been sent its initial config by then (it never asked for listeners, or its
// stream is stuck) no longer holds back the ones waiting behind it.
const initialSyncHold = 10 * time.Second

// capacityGate admits new connections by what the server is doing rather than by the
// clock: at most limit connections at a time between admission and the sending of their
// initial clusters and listeners (the initial pushes in flight, bounded like pushes by the
// push throttle); the others wait, their streams open,
// in arrival order. A connection is refused only when queue connections already wait or
// its wait would pass the caller's deadline.
type capacityGate struct {
	limit, queue int

	mu       sync.Mutex
	inFlight int
	waiting  []chan struct{}
}

func newCapacityGate(limit, queue int) *capacityGate {
	return &capacityGate{limit: limit, queue: queue}
}

var errQueueFull = status.Error(codes.ResourceExhausted, "too many connections waiting for admission; retry later")

// acquire waits for a slot, first come first served, up to maxWait (0: no bound) or until
// ctx ends; the slot is held until release is called (release is idempotent).
func (g *capacityGate) acquire(ctx context.Context, maxWait time.Duration) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	g.mu.Lock()
	if g.inFlight < g.limit && len(g.waiting) == 0 {
		g.inFlight++
		g.mu.Unlock()
		return g.releaser(), nil
	}
	if g.queue > 0 && len(g.waiting) >= g.queue {
		g.mu.Unlock()
		return nil, errQueueFull
	}
	turn := make(chan struct{})
	g.waiting = append(g.waiting, turn)
	g.mu.Unlock()

	var expired <-chan time.Time
	if maxWait > 0 {
		t := time.NewTimer(maxWait)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-turn:
		return g.releaser(), nil
	case <-expired:
		err = status.Errorf(codes.ResourceExhausted, "not admitted within %v (the server is busy with other proxies' initial config); retry later", maxWait.Round(time.Millisecond))
	case <-ctx.Done():
		err = status.FromContextError(ctx.Err()).Err()
	}
	if !g.leave(turn) {
		// The slot was handed over as the wait ended: pass it on.
		g.releaser()()
	}
	return nil, err
}

// leave takes a waiter out of the queue; false if it had been given a slot already.
func (g *capacityGate) leave(turn chan struct{}) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, w := range g.waiting {
		if w == turn {
			g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// releaser frees a slot once: it goes to the longest waiting connection, if any.
func (g *capacityGate) releaser() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if len(g.waiting) > 0 {
				close(g.waiting[0])
				g.waiting = g.waiting[1:]
				return
			}
			g.inFlight--
		})
	}
}

// Waiting is the number of connections waiting for admission.
func (s *Server) Waiting() int {
	if s.gate == nil {
		return 0
	}
	s.gate.mu.Lock()
	defer s.gate.mu.Unlock()
	return len(s.gate.waiting)
}

// admit holds a new stream until it may be served: first the optional rate cap
// (ConnectRate), then the capacity gate (ConnectInFlight), both within ConnectWait. The
// returned release frees the capacity slot.
func (s *Server) admit(ctx context.Context) (release func(), err error) {
	start := time.Now()
	if wait := s.admitter.reserve(); wait > 0 {
		if s.opts.ConnectWait > 0 && wait > s.opts.ConnectWait {
			s.admitter.cancel()
			s.metrics.ConnectionsRejected.Inc()
			return nil, status.Error(codes.ResourceExhausted, "too many new connections; retry later")
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	left := time.Duration(0)
	if s.opts.ConnectWait > 0 {
		left = max(s.opts.ConnectWait-time.Since(start), time.Nanosecond)
	}
	release, err = s.gate.acquire(ctx, left)
	if err != nil && status.Code(err) == codes.ResourceExhausted {
		s.metrics.ConnectionsRejected.Inc()
	}
	return release, err
}

// holdAdmission makes an admitted connection count against ConnectInFlight until its
// initial clusters and listeners are sent, it closes, or initialSyncHold passes.
func (c *Connection) holdAdmission(release func()) {
	t := time.AfterFunc(initialSyncHold, release)
	c.admitted = func() {
		t.Stop()
		release()
	}
}

// initialSent reports whether the connection's clusters and listeners have been sent
// (caller holds c.mu): the server's part of the initial config is done; what the proxy asks
// next (endpoints, routes) follows at the pace its admission set.
func (c *Connection) initialSent() bool {
	for _, typ := range []string{xds.ClusterType, xds.ListenerType} {
		if w := c.watches[typ]; w == nil || w.sent == 0 {
			return false
		}
	}
	return true
}

// initialDone frees the admission slot once the initial clusters and listeners are sent
// (caller holds c.mu).
func (c *Connection) initialDone() {
	if c.admitted != nil && c.initialSent() {
		c.freeAdmission()
	}
}

// freeAdmission frees the admission slot if still held (caller holds c.mu).
func (c *Connection) freeAdmission() {
	if c.admitted != nil {
		c.admitted()
		c.admitted = nil
	}
}
