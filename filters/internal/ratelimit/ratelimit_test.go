package ratelimit

import (
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// memStore is a Store with proxy-wasm-cpp-host's semantics: every write gets a new,
// process-wide, non-zero version; cas 0 writes unconditionally; a cas for a missing key
// is not checked.
type memStore struct {
	data map[string]*memEntry
	cas  uint32
	// beforeSet runs at the start of every Set: a test hook that plays another VM
	// writing between our read and our write.
	beforeSet func(s *memStore, key string)
	gets      int
	sets      int
	getErr    error
}

type memEntry struct {
	value []byte
	cas   uint32
}

func newMemStore() *memStore { return &memStore{data: map[string]*memEntry{}} }

func (s *memStore) Get(key string) ([]byte, uint32, error) {
	s.gets++
	if s.getErr != nil {
		return nil, 0, s.getErr
	}
	e, ok := s.data[key]
	if !ok {
		return nil, 0, ErrNotFound
	}
	return e.value, e.cas, nil
}

func (s *memStore) Set(key string, value []byte, cas uint32) error {
	s.sets++
	if s.beforeSet != nil {
		s.beforeSet(s, key)
	}
	return s.set(key, value, cas)
}

func (s *memStore) set(key string, value []byte, cas uint32) error {
	e, ok := s.data[key]
	if ok && cas != 0 && cas != e.cas {
		return ErrCASMismatch
	}
	if !ok {
		e = &memEntry{}
		s.data[key] = e
	}
	// Reuse the entry's memory, so that allocation tests measure the limiter only.
	e.value = append(e.value[:0], value...)
	s.cas++
	e.cas = s.cas
	return nil
}

// unhooked is the same store without the beforeSet hook.
type unhooked struct{ s *memStore }

func (u unhooked) Get(key string) ([]byte, uint32, error)         { return u.s.Get(key) }
func (u unhooked) Set(key string, value []byte, cas uint32) error { return u.s.set(key, value, cas) }

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func bucket(max, perFill uint32, every time.Duration) *Policy {
	return &Policy{Algorithm: TokenBucket, MaxTokens: max, TokensPerFill: perFill, FillInterval: every}
}

func fixed(max uint32, window time.Duration) *Policy {
	return &Policy{Algorithm: FixedWindow, MaxAmount: max, ValidDuration: window}
}

func rolling(max uint32, window, slot time.Duration) *Policy {
	return &Policy{Algorithm: RollingWindow, MaxAmount: max, ValidDuration: window, BucketDuration: slot}
}

// step is one request at an offset from epoch and what it must get.
type step struct {
	at        time.Duration
	allowed   bool
	remaining uint32
	reset     time.Duration
}

func TestDecideSequences(t *testing.T) {
	for name, tc := range map[string]struct {
		policy *Policy
		limit  uint32 // the x-ratelimit-limit every decision reports
		steps  []step
	}{
		"token bucket starts full, then refills per interval": {
			policy: bucket(3, 2, time.Second),
			limit:  3,
			steps: []step{
				{0, true, 2, time.Second},
				{0, true, 1, time.Second},
				{100 * time.Millisecond, true, 0, 900 * time.Millisecond},
				{200 * time.Millisecond, false, 0, 800 * time.Millisecond},
				// One fill (2 tokens) at 1s, on the grid anchored at creation.
				{time.Second, true, 1, time.Second},
				{1500 * time.Millisecond, true, 0, 500 * time.Millisecond},
				{1999 * time.Millisecond, false, 0, time.Millisecond},
				// Ten idle intervals: capped at max_tokens.
				{12 * time.Second, true, 2, time.Second},
			},
		},
		"token bucket with zero max_tokens always denies": {
			policy: bucket(0, 1, time.Second),
			limit:  0,
			steps:  []step{{0, false, 0, time.Second}, {5 * time.Second, false, 0, time.Second}},
		},
		"fixed window aligned to the epoch grid": {
			policy: fixed(2, time.Minute),
			limit:  2,
			steps: []step{
				{0, true, 1, time.Minute},
				{30 * time.Second, true, 0, 30 * time.Second},
				{59 * time.Second, false, 0, time.Second},
				// A new window: the full amount at once.
				{60 * time.Second, true, 1, time.Minute},
				{61 * time.Second, true, 0, 59 * time.Second},
				{62 * time.Second, false, 0, 58 * time.Second},
			},
		},
		"rolling window frees use slot by slot": {
			policy: rolling(3, 10*time.Second, time.Second),
			limit:  3,
			steps: []step{
				{0, true, 2, 10 * time.Second},
				{5 * time.Second, true, 1, 5 * time.Second},
				{9 * time.Second, true, 0, time.Second},
				// The fixed window would have reset at 10s; here only the slot used at
				// 0s leaves, freeing exactly one.
				{9500 * time.Millisecond, false, 0, 500 * time.Millisecond},
				{10 * time.Second, true, 0, 5 * time.Second},
				{11 * time.Second, false, 0, 4 * time.Second},
				{15 * time.Second, true, 0, 4 * time.Second},
				// A whole window idle clears everything.
				{40 * time.Second, true, 2, 10 * time.Second},
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			l := NewShared(newMemStore(), 5)
			req := &Request{Key: "k", Policy: tc.policy}
			for i, s := range tc.steps {
				d := l.Decide(req, epoch.Add(s.at))
				want := Decision{Allowed: s.allowed, Limit: tc.limit, Remaining: s.remaining, Reset: s.reset}
				assert.Equal(t, want, d, "step %d at %v", i, s.at)
			}
		})
	}
}

func TestFixedVersusRollingAtTheWindowEdge(t *testing.T) {
	// The same burst at the end of one minute and the start of the next: the fixed window
	// lets both through (the known edge burst), the rolling window only the limit.
	burst := func(p *Policy) (allowed int) {
		l := NewShared(newMemStore(), 5)
		req := &Request{Key: "k", Policy: p}
		for _, at := range []time.Duration{59 * time.Second, 60 * time.Second} {
			for range 5 {
				if l.Decide(req, epoch.Add(at)).Allowed {
					allowed++
				}
			}
		}
		return allowed
	}
	assert.Equal(t, 10, burst(fixed(5, time.Minute)))
	assert.Equal(t, 5, burst(rolling(5, time.Minute, time.Second)))
}

func TestTwoLimitersShareOneBucketThroughTheStore(t *testing.T) {
	store := newMemStore()
	vm1, vm2 := NewShared(store, 5), NewShared(store, 5)
	req := &Request{Key: "k", Policy: bucket(3, 1, time.Second)}
	var got []bool
	for _, l := range []*Shared{vm1, vm2, vm1, vm2} {
		got = append(got, l.Decide(req, epoch).Allowed)
	}
	assert.Equal(t, []bool{true, true, true, false}, got)
}

func TestCASConflicts(t *testing.T) {
	p := bucket(10, 1, time.Second)
	for name, tc := range map[string]struct {
		retries, conflicts int
		want               FailOpen
		tokensLeft         uint32
	}{
		"one conflict, retried":           {retries: 5, conflicts: 1, want: NotFailedOpen, tokensLeft: 10 - 1 - 1 - 1},
		"conflicts up to the bound":       {retries: 2, conflicts: 2, want: NotFailedOpen, tokensLeft: 10 - 1 - 2 - 1},
		"one more than the bound":         {retries: 2, conflicts: 3, want: CASExhausted, tokensLeft: 10 - 1 - 3},
		"no retries fails open at once":   {retries: 0, conflicts: 1, want: CASExhausted, tokensLeft: 10 - 1 - 1},
		"always conflicting fails open":   {retries: 5, conflicts: 100, want: CASExhausted, tokensLeft: 10 - 1 - 6},
		"no conflict writes on first try": {retries: 0, conflicts: 0, want: NotFailedOpen, tokensLeft: 10 - 1 - 1},
	} {
		t.Run(name, func(t *testing.T) {
			store := newMemStore()
			l := NewShared(store, tc.retries)
			req := &Request{Key: "k", Policy: p}
			require.True(t, l.Decide(req, epoch).Allowed, "creates the bucket")
			// other plays another VM that takes a token between our Get and our Set.
			other := NewShared(unhooked{store}, 0)
			n := 0
			store.beforeSet = func(_ *memStore, key string) {
				if n < tc.conflicts {
					n++
					require.True(t, other.Decide(&Request{Key: key, Policy: p}, epoch).Allowed)
				}
			}
			store.sets = 0
			d := l.Decide(req, epoch)
			assert.True(t, d.Allowed, "a conflict never denies")
			assert.Equal(t, tc.want, d.FailOpen)
			assert.Equal(t, min(tc.conflicts, tc.retries)+1, store.sets, "one Set per attempt")
			tokens, _, ok := Inspect(store.data["k"].value, p)
			require.True(t, ok)
			assert.Equal(t, tc.tokensLeft, tokens, "the fail-open request takes nothing; every other VM's request counts")
		})
	}
}

func TestStoreErrorFailsOpen(t *testing.T) {
	store := newMemStore()
	store.getErr = errors.New("host says no")
	d := NewShared(store, 5).Decide(&Request{Key: "k", Policy: bucket(1, 1, time.Second)}, epoch)
	assert.Equal(t, Decision{Allowed: true, Limit: 1, Remaining: 1, FailOpen: StoreError}, d)
	assert.Equal(t, 1, store.gets, "not retried")
}

func TestDenialDoesNotWrite(t *testing.T) {
	store := newMemStore()
	l := NewShared(store, 5)
	req := &Request{Key: "k", Policy: bucket(1, 1, time.Second)}
	require.True(t, l.Decide(req, epoch).Allowed)
	store.sets = 0
	require.False(t, l.Decide(req, epoch).Allowed)
	assert.Zero(t, store.sets)
}

func TestReconfigurationReplacesForeignState(t *testing.T) {
	store := newMemStore()
	l := NewShared(store, 5)
	require.True(t, l.Decide(&Request{Key: "k", Policy: fixed(1, time.Minute)}, epoch).Allowed)
	require.False(t, l.Decide(&Request{Key: "k", Policy: fixed(1, time.Minute)}, epoch).Allowed)
	// Same key, now a token bucket: the window's bytes do not fit, so it starts fresh.
	d := l.Decide(&Request{Key: "k", Policy: bucket(5, 1, time.Second)}, epoch)
	assert.Equal(t, Decision{Allowed: true, Limit: 5, Remaining: 4, Reset: time.Second}, d)
	// A rolling window with another slot count does not fit either.
	require.True(t, l.Decide(&Request{Key: "r", Policy: rolling(1, time.Minute, time.Second)}, epoch).Allowed)
	assert.True(t, l.Decide(&Request{Key: "r", Policy: rolling(1, time.Minute, 2*time.Second)}, epoch).Allowed)
	// A smaller bucket clamps the tokens left.
	d = l.Decide(&Request{Key: "k", Policy: bucket(2, 1, time.Second)}, epoch)
	assert.Equal(t, Decision{Allowed: true, Limit: 2, Remaining: 1, Reset: time.Second}, d)
}

func TestRefresh(t *testing.T) {
	store := newMemStore()
	l := NewShared(store, 5)
	p := bucket(3, 1, time.Second)
	assert.False(t, l.Refresh("k", p, epoch), "a missing bucket is not created")
	assert.Empty(t, store.data)

	req := &Request{Key: "k", Policy: p}
	for range 3 {
		l.Decide(req, epoch)
	}
	assert.False(t, l.Refresh("k", p, epoch.Add(999*time.Millisecond)), "nothing due")
	assert.True(t, l.Refresh("k", p, epoch.Add(2*time.Second)))
	tokens, at, ok := Inspect(store.data["k"].value, p)
	require.True(t, ok)
	assert.Equal(t, uint32(2), tokens)
	assert.Equal(t, epoch.Add(2*time.Second), at)
	assert.False(t, l.Refresh("k", p, epoch.Add(2*time.Second)), "idempotent")
}

func TestClockSteppingBack(t *testing.T) {
	l := NewShared(newMemStore(), 5)
	req := &Request{Key: "k", Policy: bucket(1, 1, time.Second)}
	require.True(t, l.Decide(req, epoch.Add(time.Hour)).Allowed)
	// An hour back: the grid re-anchors instead of waiting an hour for the next fill.
	assert.False(t, l.Decide(req, epoch).Allowed)
	assert.True(t, l.Decide(req, epoch.Add(time.Second)).Allowed)
}

func TestEncoding(t *testing.T) {
	at := int64(0x0102030405060708)
	for name, tc := range map[string]struct {
		s    state
		want string
	}{
		"token bucket":   {state{alg: TokenBucket, count: 7, at: at}, "01" + "07000000" + "0807060504030201"},
		"fixed window":   {state{alg: FixedWindow, count: 0x100, at: at}, "02" + "00010000" + "0807060504030201"},
		"rolling window": {state{alg: RollingWindow, at: at, slots: []uint32{1, 0, 2}}, "03" + "0807060504030201" + "01000000" + "00000000" + "02000000"},
	} {
		t.Run(name, func(t *testing.T) {
			b := tc.s.appendTo(nil)
			assert.Equal(t, tc.want, hex.EncodeToString(b))
			p := &Policy{Algorithm: tc.s.alg, ValidDuration: time.Duration(len(tc.s.slots)), BucketDuration: 1}
			var back state
			require.True(t, back.decode(b, p))
			assert.Equal(t, tc.s, back)
		})
	}
}

func TestDecideDoesNotAllocate(t *testing.T) {
	for _, p := range []*Policy{bucket(1e9, 1, time.Second), fixed(1e9, time.Minute), rolling(1e9, time.Minute, time.Second)} {
		l := NewShared(newMemStore(), 5)
		req := &Request{Key: "k", Policy: p}
		now := epoch
		l.Decide(req, now)
		allocs := testing.AllocsPerRun(100, func() {
			now = now.Add(10 * time.Millisecond)
			l.Decide(req, now)
		})
		assert.Zero(t, allocs, p.Algorithm.String())
	}
}

func BenchmarkDecide(b *testing.B) {
	for _, p := range []*Policy{bucket(1e9, 1, time.Second), fixed(1e9, time.Minute), rolling(1e9, time.Minute, time.Second)} {
		b.Run(p.Algorithm.String(), func(b *testing.B) {
			l := NewShared(newMemStore(), 5)
			req := &Request{Key: "k", Policy: p}
			now := epoch
			for b.Loop() {
				now = now.Add(time.Microsecond)
				l.Decide(req, now)
			}
		})
	}
}

func ExampleShared() {
	l := NewShared(newMemStore(), 5)
	req := &Request{Key: "wasmesh.quota/demo/global", Policy: bucket(2, 1, time.Second)}
	for i := range 3 {
		d := l.Decide(req, epoch)
		fmt.Printf("request %d: allowed=%v remaining=%d reset=%v\n", i, d.Allowed, d.Remaining, d.Reset)
	}
	// Output:
	// request 0: allowed=true remaining=1 reset=1s
	// request 1: allowed=true remaining=0 reset=1s
	// request 2: allowed=false remaining=0 reset=1s
}
