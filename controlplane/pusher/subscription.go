package pusher

import (
	"hash/maphash"
	"slices"
	"strconv"
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// Subscription is a set of resource names, shared by every connection that subscribes to
// exactly that set (typically all proxies of a mesh subscribe to the same EDS clusters), so
// thousands of proxies hold one copy and their EDS/RDS responses are generated once.
type Subscription struct {
	key   uint64
	names []string    // sorted, read-only
	id    xds.NameSet // the names, as generated sets are cached by
	set   map[string]struct{}
	refs  int
	// next remembers where a delta change led from here, so thousands of proxies making the
	// same change (a new cluster) share one result without sorting and hashing each time.
	next map[string]*Subscription
}

// Has reports whether the subscription names name.
func (s *Subscription) Has(name string) bool {
	if s == nil {
		return false
	}
	_, ok := s.set[name]
	return ok
}

// Len is the number of names.
func (s *Subscription) Len() int {
	if s == nil {
		return 0
	}
	return len(s.names)
}

// SameAs reports whether the subscription is exactly names.
func (s *Subscription) SameAs(names []string) bool {
	if s.Len() != len(names) {
		return false
	}
	for _, n := range names {
		if !s.Has(n) {
			return false
		}
	}
	return true
}

// subscriptions interns subscriptions by content, reference counted.
type subscriptions struct {
	seed maphash.Seed
	mu   sync.Mutex
	m    map[uint64][]*Subscription
}

func newSubscriptions() *subscriptions {
	return &subscriptions{seed: maphash.MakeSeed(), m: map[uint64][]*Subscription{}}
}

// acquire returns the shared subscription for names (which it may reorder).
func (ss *subscriptions) acquire(names []string) *Subscription {
	if !slices.IsSorted(names) {
		slices.Sort(names)
	}
	names = slices.Compact(names)
	var key uint64
	for _, n := range names {
		key = key*1099511628211 ^ maphash.String(ss.seed, n)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, s := range ss.m[key] {
		if slices.Equal(s.names, names) {
			s.refs++
			return s
		}
	}
	s := &Subscription{key: key, names: slices.Clone(names), set: make(map[string]struct{}, len(names)), refs: 1}
	s.id.Names = s.names
	for _, n := range s.names {
		s.set[n] = struct{}{}
	}
	ss.m[key] = append(ss.m[key], s)
	return s
}

// release drops a reference; the last one forgets the subscription.
func (ss *subscriptions) release(s *Subscription) {
	if s == nil {
		return
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s.refs--
	if s.refs > 0 {
		return
	}
	list := ss.m[s.key]
	for i, o := range list {
		if o == s {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(ss.m, s.key)
	} else {
		ss.m[s.key] = list
	}
}

func (s *Subscription) namesOrNil() []string {
	if s == nil {
		return nil
	}
	return s.names
}

// change returns the subscription that results from adding and removing names (delta
// requests), acquiring it and releasing from.
func (ss *subscriptions) change(from *Subscription, add, remove []string) *Subscription {
	if len(add) == 0 && len(remove) == 0 && from != nil {
		return from
	}
	var key string
	if from != nil {
		// Each name with its length: names may hold any character, and two different
		// changes must not spell the same key ("+p-q" is adding "p-q", or adding "p" and
		// removing "q").
		var b []byte
		for _, n := range add {
			b = append(strconv.AppendInt(append(b, '+'), int64(len(n)), 10), ':')
			b = append(b, n...)
		}
		for _, n := range remove {
			b = append(strconv.AppendInt(append(b, '-'), int64(len(n)), 10), ':')
			b = append(b, n...)
		}
		key = string(b)
		ss.mu.Lock()
		if to := from.next[key]; to != nil && to.refs > 0 {
			to.refs++
			ss.mu.Unlock()
			ss.release(from)
			return to
		}
		ss.mu.Unlock()
	}
	drop := make(map[string]bool, len(remove))
	for _, n := range remove {
		drop[n] = true
	}
	names := make([]string, 0, from.Len()+len(add))
	for _, n := range from.namesOrNil() {
		if !drop[n] {
			names = append(names, n)
		}
	}
	names = append(names, add...)
	to := ss.acquire(names)
	if from != nil {
		ss.mu.Lock()
		if from.next == nil {
			from.next = map[string]*Subscription{}
		}
		if len(from.next) > 64 {
			clear(from.next) // bounded: transitions are a cache
		}
		from.next[key] = to
		ss.mu.Unlock()
	}
	ss.release(from)
	return to
}
