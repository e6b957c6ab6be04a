package server

import (
	"sync"
	"time"

	"github.com/wasmesh/wasmesh/controlplane/pusher"
)

// pushQueue holds at most one pending push per connection, in arrival order: a newer push
// for a queued connection merges into it, and a push for a connection being pushed to waits
// until that push is done (Istio's PushQueue).
type pushQueue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	order      []*Connection
	pending    map[*Connection]*pusher.Event
	processing map[*Connection]*pusher.Event // value: a push that arrived meanwhile, or nil
	closed     bool
}

func newPushQueue() *pushQueue {
	q := &pushQueue{pending: map[*Connection]*pusher.Event{}, processing: map[*Connection]*pusher.Event{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// Enqueue adds or merges a push for c.
func (q *pushQueue) Enqueue(c *Connection, ev *pusher.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if later, busy := q.processing[c]; busy {
		if later != nil {
			ev = later.Merge(ev)
		}
		q.processing[c] = ev
		return
	}
	if p, ok := q.pending[c]; ok {
		q.pending[c] = p.Merge(ev)
		return
	}
	q.pending[c] = ev
	q.order = append(q.order, c)
	q.cond.Signal()
}

// Dequeue blocks for the next connection to push; ok is false once the queue is closed.
func (q *pushQueue) Dequeue() (*Connection, *pusher.Event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.order) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return nil, nil, false
	}
	c := q.order[0]
	q.order[0] = nil
	q.order = q.order[1:]
	ev := q.pending[c]
	delete(q.pending, c)
	q.processing[c] = nil
	return c, ev, true
}

// MarkDone finishes a push to c, requeueing a push that arrived meanwhile.
func (q *pushQueue) MarkDone(c *Connection) {
	q.mu.Lock()
	defer q.mu.Unlock()
	later := q.processing[c]
	delete(q.processing, c)
	if later != nil && !q.closed {
		q.pending[c] = later
		q.order = append(q.order, c)
		q.cond.Signal()
	}
}

// Remove drops a closed connection's pending push.
func (q *pushQueue) Remove(c *Connection) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.pending[c]; ok {
		delete(q.pending, c)
		for i, o := range q.order {
			if o == c {
				q.order = append(q.order[:i], q.order[i+1:]...)
				break
			}
		}
	}
}

// Len is the number of connections waiting for a push.
func (q *pushQueue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.order)
}

// Idle reports whether no connection waits for a push or is being pushed to.
func (q *pushQueue) Idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.order) == 0 && len(q.processing) == 0
}

// Close wakes every worker and refuses further pushes.
func (q *pushQueue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.cond.Broadcast()
}

// tokenBucket admits new connections at a steady rate with a burst.
type tokenBucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newTokenBucket(rate float64, burst int) *tokenBucket {
	return &tokenBucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

// reserve takes a token, returning how long the caller must wait before using it (0: now).
// A rate of zero or less admits everything at once.
func (b *tokenBucket) reserve() time.Duration {
	if b.rate <= 0 {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.tokens += now.Sub(b.last).Seconds() * b.rate
	if b.tokens > b.burst {
		b.tokens = b.burst
	}
	b.last = now
	b.tokens--
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// cancel returns a token taken by reserve that was not used.
func (b *tokenBucket) cancel() {
	if b.rate <= 0 {
		return
	}
	b.mu.Lock()
	b.tokens++
	b.mu.Unlock()
}
