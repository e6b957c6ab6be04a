package push

import "sync"

// Cache builds each value once per key, even when many connections ask at the same time;
// what is generated from a snapshot is cached so (package xds).
type Cache[K comparable, V any] struct {
	m sync.Map // K → *entry[V]
}

type entry[V any] struct {
	once sync.Once
	val  V
}

// Get returns the value for k, building it with build on first use.
func (c *Cache[K, V]) Get(k K, build func() V) V {
	e, ok := c.m.Load(k)
	if !ok {
		e, _ = c.m.LoadOrStore(k, &entry[V]{})
	}
	me := e.(*entry[V])
	me.once.Do(func() { me.val = build() })
	return me.val
}

// Once builds one value once.
type Once[V any] struct {
	once sync.Once
	val  V
}

// Get returns the value, building it with build on first use.
func (o *Once[V]) Get(build func() V) V {
	o.once.Do(func() { o.val = build() })
	return o.val
}

// HostKey keys a result that depends on one host's service and endpoints and otherwise only
// on what neither an endpoints-only nor a services-only change touches (mesh config, and
// configs other than ServiceEntry and WorkloadEntry): a derived snapshot's HostCache drops
// exactly the keys of changed hosts.
type HostKey struct {
	Host string
	Name string
}

// HostCache is a Cache keyed by HostKey that a derived snapshot inherits: its entries hold
// for the hosts the derivation did not change. Layers hold only HostKey entries, so no
// snapshot is kept alive by its successors.
type HostCache[V any] struct {
	layer *hostLayer[V]
}

// hostLayer holds entries; one with a parent inherits the parent's entries unless their host
// is in changed.
type hostLayer[V any] struct {
	m       sync.Map // HostKey → *entry[V]
	parent  *hostLayer[V]
	changed map[string]struct{}
	depth   int
}

// NewHostCache returns an empty host cache.
func NewHostCache[V any]() *HostCache[V] { return &HostCache[V]{layer: &hostLayer[V]{}} }

// Get returns the value for k, building it with build on first use (or inheriting it).
func (c *HostCache[V]) Get(k HostKey, build func() V) V {
	me := c.layer.entry(k)
	me.once.Do(func() { me.val = build() })
	return me.val
}

// entry returns key's entry: this layer's, else one inherited from the layers below if it
// still holds here (not past a layer that changed its host), else a new one. An inherited
// entry is not stored again here: a change does not copy the entries of the hosts it did
// not change, even as they are read.
func (l *hostLayer[V]) entry(key HostKey) *entry[V] {
	if e, ok := l.m.Load(key); ok {
		return e.(*entry[V])
	}
	for cur := l; cur.parent != nil; cur = cur.parent {
		if _, changed := cur.changed[key.Host]; changed {
			break
		}
		if e, ok := cur.parent.m.Load(key); ok {
			return e.(*entry[V])
		}
	}
	e, _ := l.m.LoadOrStore(key, &entry[V]{})
	return e.(*entry[V])
}

// Without returns a cache over c's in which the entries of the changed hosts do not hold
// (every maxLayers-th layer is flattened into one of its own).
func (c *HostCache[V]) Without(changed map[string]struct{}) *HostCache[V] {
	n := &hostLayer[V]{parent: c.layer, changed: changed, depth: c.layer.depth + 1}
	if n.depth <= maxLayers {
		return &HostCache[V]{layer: n}
	}
	flat := &hostLayer[V]{}
	dropped := map[string]struct{}{}
	for cur := n; cur.parent != nil; cur = cur.parent {
		for h := range cur.changed {
			dropped[h] = struct{}{}
		}
		cur.parent.m.Range(func(k, v any) bool {
			if _, d := dropped[k.(HostKey).Host]; !d {
				flat.m.LoadOrStore(k, v) // the nearest layer's entry wins
			}
			return true
		})
	}
	return &HostCache[V]{layer: flat}
}
