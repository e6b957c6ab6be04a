package push

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// The debouncer's tests drive its clock by hand: time moves only in advance, so what a
// test sees at each step does not depend on the scheduler.

// fakeClock is a clock whose time moves only when a test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at      time.Time
	c       chan time.Time // unbuffered: a delivered tick has been received
	stopped chan struct{}
	once    sync.Once
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }
func (t *fakeTimer) Stop()               { t.once.Do(func() { close(t.stopped) }) }

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) NewTimer(d time.Duration) timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{at: f.now.Add(d), c: make(chan time.Time), stopped: make(chan struct{})}
	f.timers = append(f.timers, t)
	return t
}

// due takes the earliest timer that fires by until, moving the time to when it fires.
func (f *fakeClock) due(until time.Time) *fakeTimer {
	f.mu.Lock()
	defer f.mu.Unlock()
	best := -1
	for i, t := range f.timers {
		if !t.at.After(until) && (best < 0 || t.at.Before(f.timers[best].at)) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	t := f.timers[best]
	f.timers = slices.Delete(f.timers, best, best+1)
	if t.at.After(f.now) {
		f.now = t.at
	}
	return t
}

func (f *fakeClock) set(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = now
}

// debouncer runs Debounce on a fake clock and records what it pushes.
type debouncer struct {
	t       *testing.T
	clock   *fakeClock
	start   time.Time
	in      chan *Request
	pushed  chan *Request
	release chan struct{} // nil: pushes return at once
	stop    func()

	mu       sync.Mutex
	waited   []time.Duration // what the debounced callback was told, one per debounced push
	inFlight atomic.Int32
	maxIn    atomic.Int32 // most pushes seen in flight at once
}

func newDebouncer(t *testing.T, opts DebounceOptions, blocking bool) *debouncer {
	d := &debouncer{t: t, clock: &fakeClock{now: time.Unix(1000, 0)}, in: make(chan *Request), pushed: make(chan *Request, 64)}
	d.start = d.clock.now
	if blocking {
		d.release = make(chan struct{})
	}
	opts.clock = d.clock
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Debounce(ctx, d.in, opts, d.push, func(w time.Duration) {
			d.mu.Lock()
			d.waited = append(d.waited, w)
			d.mu.Unlock()
		})
	}()
	var once sync.Once
	d.stop = func() {
		once.Do(func() {
			if d.release != nil {
				close(d.release)
			}
			cancel()
			<-done
		})
	}
	t.Cleanup(d.stop)
	return d
}

func (d *debouncer) push(_ context.Context, r *Request) {
	n := d.inFlight.Add(1)
	for {
		m := d.maxIn.Load()
		if n <= m || d.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	d.pushed <- r
	if d.release != nil {
		<-d.release
	}
	d.inFlight.Add(-1)
}

// send hands r to the debouncer and returns once it has been taken in: the nil request
// that follows (which Debounce skips) is received only when the loop is back in its select.
func (d *debouncer) send(r *Request) {
	d.in <- r
	d.in <- nil
}

// advance moves the clock by dt, firing every timer due on the way at its own time and
// returning only when the debouncer has handled each tick.
func (d *debouncer) advance(dt time.Duration) {
	until := d.clock.Now().Add(dt)
	for {
		t := d.clock.due(until)
		if t == nil {
			break
		}
		select {
		case t.c <- t.at:
			d.in <- nil
		case <-t.stopped:
		}
	}
	d.clock.set(until)
}

// at is the fake time elapsed since the debouncer started.
func (d *debouncer) at() time.Duration { return d.clock.Now().Sub(d.start) }

// waits returns what the debounced callback was told so far; Debounce calls it in its loop,
// before the push starts, so after send or advance it is exact.
func (d *debouncer) waits() []time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.waited)
}

// next returns the next push.
func (d *debouncer) next() *Request {
	d.t.Helper()
	select {
	case r := <-d.pushed:
		return r
	case <-time.After(10 * time.Second):
		d.t.Fatalf("no push by %v", d.at())
		return nil
	}
}

// finish stops the debouncer (releasing any push in flight) and returns the pushes not yet
// taken with next: Debounce returns only after its push in flight, so the list is complete.
func (d *debouncer) finish() []*Request {
	d.stop()
	var rest []*Request
	for {
		select {
		case r := <-d.pushed:
			rest = append(rest, r)
		default:
			return rest
		}
	}
}

func key(name string) config.Key {
	return config.Key{Kind: config.ServiceEntry, Namespace: "a", Name: name}
}

func keys(r *Request) []string {
	var out []string
	for k := range r.ConfigsUpdated {
		out = append(out, k.Name)
	}
	slices.Sort(out)
	return out
}

func hosts(r *Request) []string {
	var out []string
	for h := range r.EDSHosts {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

func eds(hs ...string) *Request {
	m := map[string]struct{}{}
	for _, h := range hs {
		m[h] = struct{}{}
	}
	return NewEDS(m)
}

// The defaults are istiod's: a 100 ms quiet period, pushes held at most 10 s, endpoints
// changes debounced too.
func TestDefaultDebounceIsIstios(t *testing.T) {
	assert.Equal(t, DebounceOptions{After: 100 * time.Millisecond, Max: 10 * time.Second, EnableEDS: true}, DefaultDebounce())
}

// Each change restarts the quiet period: changes 60 ms apart with a 100 ms quiet period are
// held until 100 ms after the last one, and then pushed as one.
func TestDebounceQuietPeriodRestartsWithEachChange(t *testing.T) {
	d := newDebouncer(t, DebounceOptions{After: 100 * time.Millisecond, Max: time.Second, EnableEDS: true}, false)
	d.send(NewFull(ReasonConfig, key("c0")))
	for _, name := range []string{"c1", "c2", "c3"} {
		d.advance(60 * time.Millisecond)
		require.Empty(t, d.waits(), "pushed at %v, %v after the last change", d.at(), 60*time.Millisecond)
		d.send(NewFull(ReasonConfig, key(name)))
	}
	// The last change came at 180 ms.
	d.advance(99 * time.Millisecond)
	require.Empty(t, d.waits(), "pushed at %v, before the quiet period after the last change ended", d.at())
	d.advance(time.Millisecond)
	require.Equal(t, []time.Duration{280 * time.Millisecond}, d.waits())
	r := d.next()
	assert.Equal(t, []string{"c0", "c1", "c2", "c3"}, keys(r))
	assert.Equal(t, map[string]int{ReasonConfig: 4}, r.Reasons)
	assert.Empty(t, d.finish(), "one push for the burst")
}

// Changes that never leave a quiet period are pushed when the first of them has waited Max.
func TestDebounceMaxForcesPushUnderContinuousChanges(t *testing.T) {
	d := newDebouncer(t, DebounceOptions{After: 100 * time.Millisecond, Max: 300 * time.Millisecond, EnableEDS: true}, true)
	// A change every 60 ms, from 0 to 240 ms: the quiet period never ends.
	for i := range 5 {
		if i > 0 {
			d.advance(60 * time.Millisecond)
		}
		require.Empty(t, d.waits(), "pushed at %v while changes kept coming", d.at())
		d.send(NewFull(ReasonConfig, key("c"+string(rune('0'+i)))))
	}
	d.advance(59 * time.Millisecond)
	require.Empty(t, d.waits(), "pushed at %v, before the cap", d.at())
	d.advance(time.Millisecond)
	require.Equal(t, []time.Duration{300 * time.Millisecond}, d.waits(), "the cap forces the push at 300 ms")
	assert.Equal(t, []string{"c0", "c1", "c2", "c3", "c4"}, keys(d.next()))
	assert.Len(t, d.finish(), 0)
}

// Merged requests carry the union of what changed: full wins in either order, configs,
// hosts and reasons add up, the first start is kept; endpoints-only changes stay
// endpoints-only.
func TestDebounceMergesWhatChanged(t *testing.T) {
	early := NewFull(ReasonConfig, key("x"))
	early.Start = time.Unix(1, 0)
	cases := []struct {
		name      string
		in        []*Request
		full      bool
		keys      []string
		hosts     []string
		reasons   map[string]int
		wantStart time.Time
	}{
		{name: "full, endpoints, full", in: []*Request{early, eds("h1"), NewFull(ReasonService, key("y"))},
			full: true, keys: []string{"x", "y"}, hosts: []string{"h1"},
			reasons: map[string]int{ReasonConfig: 1, ReasonEndpoint: 1, ReasonService: 1}, wantStart: early.Start},
		{name: "full then endpoints", in: []*Request{NewFull(ReasonConfig, key("x")), eds("h1")},
			full: true, keys: []string{"x"}, hosts: []string{"h1"}, reasons: map[string]int{ReasonConfig: 1, ReasonEndpoint: 1}},
		{name: "endpoints then full", in: []*Request{eds("h1"), NewFull(ReasonMesh)},
			full: true, hosts: []string{"h1"}, reasons: map[string]int{ReasonEndpoint: 1, ReasonMesh: 1}},
		{name: "endpoints only", in: []*Request{eds("h1", "h2"), eds("h2", "h3"), eds("h4")},
			hosts: []string{"h1", "h2", "h3", "h4"}, reasons: map[string]int{ReasonEndpoint: 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDebouncer(t, DebounceOptions{After: 100 * time.Millisecond, Max: time.Second, EnableEDS: true}, false)
			for _, r := range tc.in {
				d.send(r)
				d.advance(10 * time.Millisecond)
			}
			d.advance(100 * time.Millisecond)
			require.Len(t, d.waits(), 1)
			r := d.next()
			assert.Equal(t, tc.full, r.Full)
			assert.Equal(t, tc.keys, keys(r))
			assert.Equal(t, tc.hosts, hosts(r))
			assert.Equal(t, tc.reasons, r.Reasons)
			if !tc.wantStart.IsZero() {
				assert.Equal(t, tc.wantStart, r.Start)
			}
			assert.Empty(t, d.finish())
		})
	}
}

// Changes that arrive while a push is in flight wait for it, however long it takes, and go
// out merged right after it returns.
func TestDebounceOnePushInFlight(t *testing.T) {
	d := newDebouncer(t, DebounceOptions{After: 100 * time.Millisecond, Max: time.Second, EnableEDS: true}, true)
	d.send(NewFull(ReasonConfig, key("a")))
	d.advance(100 * time.Millisecond)
	assert.Equal(t, []string{"a"}, keys(d.next()))

	d.send(NewFull(ReasonConfig, key("b")))
	d.advance(50 * time.Millisecond)
	d.send(eds("h1"))
	d.advance(2 * time.Second) // past the quiet period and the cap
	require.Len(t, d.waits(), 1, "a second push started while the first was in flight")

	d.release <- struct{}{} // the first push returns at 2150 ms
	r := d.next()
	assert.Equal(t, []time.Duration{100 * time.Millisecond, 2050 * time.Millisecond}, d.waits())
	assert.True(t, r.Full)
	assert.Equal(t, []string{"b"}, keys(r))
	assert.Equal(t, []string{"h1"}, hosts(r))
	assert.Empty(t, d.finish())
	assert.Equal(t, int32(1), d.maxIn.Load(), "pushes in flight at once")
}

// With EDS debounce off, an endpoints-only change is pushed at once, but not past a push in
// flight: it waits and is merged with what else arrived.
func TestDebounceEDSBypassWaitsForPushInFlight(t *testing.T) {
	d := newDebouncer(t, DebounceOptions{After: 100 * time.Millisecond, Max: time.Second, EnableEDS: false}, true)
	d.send(eds("h1"))
	assert.Equal(t, []string{"h1"}, hosts(d.next()), "pushed without waiting for the quiet period")
	assert.Empty(t, d.waits(), "not debounced")

	d.send(eds("h2"))
	d.send(NewFull(ReasonConfig))
	d.send(eds("h3"))
	d.advance(2 * time.Second)
	require.Empty(t, d.waits(), "a push started while another was in flight")

	d.release <- struct{}{} // at 2 s: the quiet period has long passed
	r := d.next()
	assert.Equal(t, []time.Duration{2 * time.Second}, d.waits())
	assert.True(t, r.Full)
	assert.Equal(t, []string{"h2", "h3"}, hosts(r))
	assert.Empty(t, d.finish())
	assert.Equal(t, int32(1), d.maxIn.Load(), "pushes in flight at once")
}

// With no quiet period (PILOT_DEBOUNCE_AFTER=0) every change is pushed as it arrives, with
// no timer and no time passing; changes that arrive during a push in flight still wait
// for it and go out merged when it returns.
func TestDebounceWithoutQuietPeriodPushesAtOnce(t *testing.T) {
	d := newDebouncer(t, DebounceOptions{After: 0, Max: time.Second, EnableEDS: true}, true)
	d.send(NewFull(ReasonConfig, key("a")))
	require.Equal(t, []time.Duration{0}, d.waits(), "pushed as it arrived")
	assert.Equal(t, []string{"a"}, keys(d.next()))

	d.send(NewFull(ReasonConfig, key("b")))
	d.send(eds("h1"))
	require.Len(t, d.waits(), 1, "a push started while another was in flight")

	d.release <- struct{}{}
	r := d.next()
	assert.Equal(t, []time.Duration{0, 0}, d.waits())
	assert.Equal(t, []string{"b"}, keys(r))
	assert.Equal(t, []string{"h1"}, hosts(r))
	assert.Empty(t, d.finish())
	assert.Equal(t, time.Duration(0), d.at(), "the clock never had to move")
}
