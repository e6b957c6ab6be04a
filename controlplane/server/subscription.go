package server

import (
	"hash/fnv"
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
	mu sync.Mutex
	m  map[uint64][]*subscription
}

func newSubscriptions() *subscriptions { return &subscriptions{m: map[uint64][]*subscription{}} }

// acquire returns the shared subscription for names (which it may reorder).
func (ss *subscriptions) acquire(names []string) *subscription {
	slices.Sort(names)
	names = slices.Compact(names)
	h := fnv.New64a()
	for _, n := range names {
		_, _ = h.Write([]byte(n))
		_, _ = h.Write([]byte{0})
	}
	key := h.Sum64()
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

// subKey memoizes a generated set per subscription (and, for routes, namespace).
type subKey struct {
	typ       string
	sub       *subscription
	namespace string
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
		return v.Snapshot.EDS.Get(subKey{typ: typ, sub: w.sub}, func() any { return xds.Generate(v, typ, w.sub.names) }).(*xds.Resources)
	case xds.RouteType:
		return v.Snapshot.Full.Get(subKey{typ: typ, sub: w.sub, namespace: v.Proxy.Namespace}, func() any { return xds.Generate(v, typ, w.sub.names) }).(*xds.Resources)
	}
	return xds.Generate(v, typ, w.sub.names)
}

func (s *subscription) namesOrNil() []string {
	if s == nil {
		return nil
	}
	return s.names
}
