package server

import (
	"hash/maphash"
	"slices"
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// subscription is a set of resource names, shared by every connection that subscribes to
// exactly that set (typically all proxies of a mesh subscribe to the same EDS clusters), so
// thousands of proxies hold one copy and their EDS/RDS responses are generated once.
type subscription struct {
	key   uint64
	names []string // sorted, read-only
	set   map[string]struct{}
	refs  int
	// next remembers where a delta change led from here, so thousands of proxies making the
	// same change (a new cluster) share one result without sorting and hashing each time.
	next map[string]*subscription
}

func (s *subscription) has(name string) bool {
	if s == nil {
		return false
	}
	_, ok := s.set[name]
	return ok
}

func (s *subscription) len() int {
	if s == nil {
		return 0
	}
	return len(s.names)
}

// sameAs reports whether the subscription is exactly names.
func (s *subscription) sameAs(names []string) bool {
	if s.len() != len(names) {
		return false
	}
	for _, n := range names {
		if !s.has(n) {
			return false
		}
	}
	return true
}

// subscriptions interns subscriptions by content, reference counted.
type subscriptions struct {
	seed maphash.Seed
	mu   sync.Mutex
	m    map[uint64][]*subscription
}

func newSubscriptions() *subscriptions {
	return &subscriptions{seed: maphash.MakeSeed(), m: map[uint64][]*subscription{}}
}

// acquire returns the shared subscription for names (which it may reorder).
func (ss *subscriptions) acquire(names []string) *subscription {
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
	s := &subscription{key: key, names: slices.Clone(names), set: make(map[string]struct{}, len(names)), refs: 1}
	for _, n := range s.names {
		s.set[n] = struct{}{}
	}
	ss.m[key] = append(ss.m[key], s)
	return s
}

// release drops a reference; the last one forgets the subscription.
func (ss *subscriptions) release(s *subscription) {
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

// subKey memoizes a generated set per subscription and what else the set depends on: the
// proxy's scope for routes, its EDS key (scope, and locality when it matters) for endpoints.
type subKey struct {
	typ   string
	sub   *subscription
	scope string
}

// generate builds the resources of a type for a connection's subscription; named types are
// memoized in the snapshot per shared subscription, so equal proxies share one result.
func generate(v *xds.View, typ string, w *watch) *xds.Resources {
	if w.wildcard {
		return xds.Generate(v, typ, nil)
	}
	if w.sub == nil {
		return xds.Generate(v, typ, nil)
	}
	switch typ {
	case xds.EndpointType:
		return v.Snapshot.EDS.Get(subKey{typ: typ, sub: w.sub, scope: v.EDSKey}, func() any { return xds.Generate(v, typ, w.sub.names) }).(*xds.Resources)
	case xds.RouteType:
		return v.Snapshot.Full.Get(subKey{typ: typ, sub: w.sub, scope: v.RouteKey()}, func() any { return xds.Generate(v, typ, w.sub.names) }).(*xds.Resources)
	}
	return xds.Generate(v, typ, w.sub.names)
}

func (s *subscription) namesOrNil() []string {
	if s == nil {
		return nil
	}
	return s.names
}

// change returns the subscription that results from adding and removing names (delta
// requests), acquiring it and releasing from.
func (ss *subscriptions) change(from *subscription, add, remove []string) *subscription {
	if len(add) == 0 && len(remove) == 0 && from != nil {
		return from
	}
	var key string
	if from != nil {
		var b []byte
		for _, n := range add {
			b = append(append(b, '+'), n...)
		}
		for _, n := range remove {
			b = append(append(b, '-'), n...)
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
	names := make([]string, 0, from.len()+len(add))
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
			from.next = map[string]*subscription{}
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
