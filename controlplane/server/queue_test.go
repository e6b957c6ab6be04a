package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/pusher"
)

// The push queue holds one push per connection, in arrival order: a push for a queued
// connection merges into it; a push for a connection being pushed to waits until that push
// is done, merged with any other that arrives meanwhile; a closed connection's push is
// dropped; once the queue is closed, workers stop and pushes are refused.
func TestPushQueueMergesAndKeepsOrder(t *testing.T) {
	q := newPushQueue()
	a, b, c := &Connection{ID: "a"}, &Connection{ID: "b"}, &Connection{ID: "c"}
	eds := func() *pusher.Event { return pusher.NewEvent(nil, push.NewEDS(map[string]struct{}{"h": {}})) }
	full := func() *pusher.Event { return pusher.NewEvent(nil, push.NewFull(push.ReasonConfig)) }
	next := func() (*Connection, *pusher.Event) {
		t.Helper()
		conn, ev, ok := q.Dequeue()
		require.True(t, ok)
		return conn, ev
	}
	assert.True(t, q.Idle())

	q.Enqueue(a, eds())
	q.Enqueue(b, eds())
	q.Enqueue(a, full()) // merges into a's
	assert.Equal(t, 2, q.Len())
	conn, ev := next()
	assert.Same(t, a, conn)
	assert.True(t, ev.Full(), "a's pushes merged")

	// a is being pushed to: what comes for it waits, merged.
	q.Enqueue(a, full())
	q.Enqueue(a, eds())
	assert.Equal(t, 1, q.Len(), "only b waits")
	assert.False(t, q.Idle())
	conn, ev = next()
	assert.Same(t, b, conn)
	assert.False(t, ev.Full())
	q.MarkDone(b)
	q.MarkDone(a) // a's push that waited is queued now
	conn, ev = next()
	assert.Same(t, a, conn)
	assert.True(t, ev.Full(), "what waited for a is merged")
	q.MarkDone(a)
	assert.True(t, q.Idle())

	// A closed connection's push is dropped, the others keep their order.
	q.Enqueue(a, eds())
	q.Enqueue(b, eds())
	q.Enqueue(c, eds())
	q.Remove(b)
	for _, want := range []*Connection{a, c} {
		conn, _ = next()
		assert.Same(t, want, conn)
		q.MarkDone(conn)
	}
	assert.True(t, q.Idle())

	// Closing wakes a waiting worker and refuses what comes after.
	stopped := make(chan bool)
	go func() { _, _, ok := q.Dequeue(); stopped <- ok }()
	q.Close()
	assert.False(t, <-stopped)
	q.Enqueue(a, eds())
	assert.Zero(t, q.Len())
}

// Admission takes a token per new connection: the burst passes at once, then each waits
// its turn at the rate; a token given back (the connection was refused) is there for the
// next one; time refills tokens at the rate, up to the burst. A rate of zero or less admits
// everything at once.
func TestTokenBucketAdmitsTheBurstThenAtTheRate(t *testing.T) {
	const slack = float64(20 * time.Millisecond)
	b := newTokenBucket(2, 2) // 2 a second, 2 at once
	assert.Zero(t, b.reserve())
	assert.Zero(t, b.reserve())
	assert.InDelta(t, float64(500*time.Millisecond), float64(b.reserve()), slack, "the third waits half a second")
	assert.InDelta(t, float64(time.Second), float64(b.reserve()), slack, "the fourth a second")
	b.cancel()
	assert.InDelta(t, float64(time.Second), float64(b.reserve()), slack, "the token given back is taken again")

	// A second and a half later: three tokens came back, so one is left after this one.
	b.mu.Lock()
	b.last = b.last.Add(-1500 * time.Millisecond)
	b.mu.Unlock()
	assert.Zero(t, b.reserve())
	assert.InDelta(t, float64(500*time.Millisecond), float64(b.reserve()), slack)

	// An hour later: the bucket holds the burst, not an hour of tokens.
	b.mu.Lock()
	b.last = b.last.Add(-time.Hour)
	b.mu.Unlock()
	assert.Zero(t, b.reserve())
	assert.Zero(t, b.reserve())
	assert.Positive(t, b.reserve())

	for _, rate := range []float64{0, -1} {
		free := newTokenBucket(rate, 0)
		for range 3 {
			assert.Zero(t, free.reserve(), "rate %v", rate)
			free.cancel()
		}
	}
}
