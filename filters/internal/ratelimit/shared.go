package ratelimit

import (
	"errors"
	"time"
)

// Errors a Store reports; adapters map the host's statuses onto them.
var (
	ErrNotFound    = errors.New("ratelimit: key not found")
	ErrCASMismatch = errors.New("ratelimit: compare-and-swap mismatch")
)

// Store is a key-value store with a compare-and-swap version per key, as proxy-wasm
// shared data is: Get returns the value and its version (ErrNotFound if absent); Set with
// a non-zero cas fails with ErrCASMismatch unless the version still matches, and with
// cas 0 writes unconditionally. Get may return memory the store owns: the limiter never
// modifies or keeps it.
type Store interface {
	Get(key string) (value []byte, cas uint32, err error)
	Set(key string, value []byte, cas uint32) error
}

// Shared is the Limiter over a Store: read with the version, compute, write with the
// version, retry on a lost race. It is used by one VM at a time (proxy-wasm callbacks do
// not overlap within a VM) and reuses its buffers, so a decision does not allocate.
type Shared struct {
	store   Store
	retries int
	st      state
	buf     []byte
}

// NewShared returns a limiter over store that retries a lost compare-and-swap up to
// casRetries times before failing open.
func NewShared(store Store, casRetries int) *Shared {
	return &Shared{store: store, retries: max(casRetries, 0), buf: make([]byte, 0, shortStateLen)}
}

// Decide takes req.Hits from the bucket named req.Key. It fails open (allows, with
// FailOpen set) when the store fails or every attempt loses its compare-and-swap: a rate
// limiter that cannot count must not take the service down. A denial takes nothing, so
// it is never retried; it writes only when the clock moved the state on.
func (l *Shared) Decide(req *Request, now time.Time) Decision {
	p, hits, t := req.Policy, max(req.Hits, 1), now.UnixNano()
	var d Decision
	for range l.retries + 1 {
		value, cas, err := l.store.Get(req.Key)
		switch {
		case errors.Is(err, ErrNotFound):
			// Nothing to compare against: the first write is unconditional (cas 0). Two
			// VMs creating the same bucket at once can lose one charge, at most once
			// per bucket, when the other VM's creation lands between our Get and Set.
			l.st.fresh(p, t)
			cas = 0
		case err != nil:
			return failOpen(p, StoreError)
		default:
			if !l.st.decode(value, p) {
				l.st.fresh(p, t)
			}
		}
		advanced := l.st.advance(p, t)
		d = l.st.take(p, hits, t)
		if !d.Allowed {
			if advanced {
				// Best effort, not retried: the decision does not depend on it, but a
				// re-anchored fill grid (the clock stepped back) must be stored or every
				// later request would re-anchor again and never fill.
				l.buf = l.st.appendTo(l.buf[:0])
				_ = l.store.Set(req.Key, l.buf, cas)
			}
			return d
		}
		l.buf = l.st.appendTo(l.buf[:0])
		switch err := l.store.Set(req.Key, l.buf, cas); {
		case err == nil:
			return d
		case errors.Is(err, ErrCASMismatch):
			continue
		default:
			return failOpen(p, StoreError)
		}
	}
	d.FailOpen = CASExhausted
	return d
}

func failOpen(p *Policy, why FailOpen) Decision {
	return Decision{Allowed: true, Limit: p.Limit(), Remaining: p.Limit(), FailOpen: why}
}

// Refresh writes the bucket's state as of now (fills added, windows and slots retired)
// if it changed, in one attempt: losing the race means another VM just wrote a state at
// least as fresh. A bucket that does not exist yet is left alone. Refreshing is never
// needed for correct decisions (Decide advances from the clock too); it keeps the stored
// value current for anyone reading it, and the work off the request path.
func (l *Shared) Refresh(key string, p *Policy, now time.Time) bool {
	value, cas, err := l.store.Get(key)
	if err != nil || !l.st.decode(value, p) {
		return false
	}
	if !l.st.advance(p, now.UnixNano()) {
		return false
	}
	l.buf = l.st.appendTo(l.buf[:0])
	return l.store.Set(key, l.buf, cas) == nil
}

// Inspect decodes a stored value for policy p, for tests and debugging: the token count
// or amount used (summed over slots for a rolling window) and the time stamp.
func Inspect(value []byte, p *Policy) (count uint32, at time.Time, ok bool) {
	var s state
	if !s.decode(value, p) {
		return 0, time.Time{}, false
	}
	count = s.count
	for _, n := range s.slots {
		count += n
	}
	return count, time.Unix(0, s.at).UTC(), true
}
