package host

import (
	"container/heap"
	"sync"
	"time"
)

// Clock is the host's source of time and timers. Tick periods, HTTP call timeouts, the
// proxy_get_current_time_nanoseconds call and WASI clock_time_get all read it, so a test
// can drive a plugin entirely in virtual time.
type Clock interface {
	Now() time.Time
	// AfterFunc runs f once, d from now. stop prevents f from running if it has not yet
	// started and reports whether it did so.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// SystemClock is the wall clock; its timers are time.AfterFunc timers, stopped by the
// plugin when it closes.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// ManualClock is a Clock that only moves when told to. Advance fires the timers that fall
// due, in order of their due time, on the caller's goroutine, with Now() reading each
// timer's due time while it runs, so periodic work that re-arms itself lands on exact
// multiples of its period. Safe for concurrent use; Advance must not be called from inside a
// timer function or a guest callback.
type ManualClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers timerHeap
	adv    sync.Mutex // serialises Advance calls so timers fire in order
}

// NewManualClock starts a manual clock at start.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start}
}

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &manualTimer{due: c.now.Add(d), seq: c.seq, f: f, index: -1}
	heap.Push(&c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if t.index < 0 {
			return false
		}
		heap.Remove(&c.timers, t.index)
		return true
	}
}

// Advance moves the clock forward by d, firing every timer that falls due (including
// timers scheduled by the timers it fires) in due-time order.
func (c *ManualClock) Advance(d time.Duration) {
	c.adv.Lock()
	defer c.adv.Unlock()
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	for c.fireNext(target) {
	}
	c.mu.Lock()
	if c.now.Before(target) {
		c.now = target
	}
	c.mu.Unlock()
}

// AdvanceToNext moves the clock to the earliest pending timer and fires the timers due then.
// It reports false, without moving, when no timer is pending.
func (c *ManualClock) AdvanceToNext() bool {
	c.mu.Lock()
	if len(c.timers) == 0 {
		c.mu.Unlock()
		return false
	}
	due := c.timers[0].due
	d := due.Sub(c.now)
	c.mu.Unlock()
	if d < 0 {
		d = 0
	}
	c.Advance(d)
	return true
}

// NextDue returns the due time of the earliest pending timer.
func (c *ManualClock) NextDue() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return time.Time{}, false
	}
	return c.timers[0].due, true
}

// Pending is the number of timers not yet fired.
func (c *ManualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

func (c *ManualClock) fireNext(target time.Time) bool {
	c.mu.Lock()
	if len(c.timers) == 0 || c.timers[0].due.After(target) {
		c.mu.Unlock()
		return false
	}
	t := heap.Pop(&c.timers).(*manualTimer)
	if t.due.After(c.now) {
		c.now = t.due
	}
	c.mu.Unlock()
	t.f()
	return true
}

type manualTimer struct {
	due   time.Time
	seq   uint64
	f     func()
	index int
}

type timerHeap []*manualTimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].due.Equal(h[j].due) {
		return h[i].seq < h[j].seq
	}
	return h[i].due.Before(h[j].due)
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *timerHeap) Push(x any) {
	t := x.(*manualTimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.index = -1
	*h = old[:len(old)-1]
	return t
}
