package pusher

import (
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// watchIndex finds the proxies a push concerns without visiting the others, as Istio's
// ProxyNeedsPush decides per proxy: an endpoints-only change concerns the connections whose
// EDS subscription names one of its clusters; a full change of services only (see
// servicesOnly) also those whose scope reaches or routes a changed host, or whose namespace
// holds one (a service there may select the proxy: its inbound side), judged once per proxy
// shape; any other full change concerns every connection. Connections sharing a
// subscription share one entry, so a push that concerns 20 of 2000 proxies looks at a few
// subscriptions and shapes, then at those 20 only.
type watchIndex struct {
	mu sync.Mutex // taken under a watch's mu (setEDS); never takes a watch's lock
	// live connections (added, not yet removed), by EDS subscription (nil: none yet) and
	// by shape; a connection is live while its shape's set holds it.
	bySub   map[*Subscription]map[*Proxy]struct{}
	byShape map[string]map[*Proxy]struct{}

	// scopes of the shapes, as of the traffic config in force (Sidecars, VirtualServices,
	// mesh config): a push of services only changes none of it, so a scope built on an
	// earlier snapshot answers for later ones (Scope.Reaches) and the other shapes' scopes
	// are not built for each push; any other full push forgets them. Only concerned, which
	// pushes call one at a time, uses it.
	scopes map[string]*xds.Scope
}

func newWatchIndex() *watchIndex {
	return &watchIndex{bySub: map[*Subscription]map[*Proxy]struct{}{}, byShape: map[string]map[*Proxy]struct{}{}}
}

// live reports whether c was added and not yet removed (the caller holds x.mu).
func (x *watchIndex) live(c *Proxy) bool {
	_, ok := x.byShape[c.shape][c]
	return ok
}

func addTo[K comparable](m map[K]map[*Proxy]struct{}, k K, c *Proxy) {
	set := m[k]
	if set == nil {
		set = map[*Proxy]struct{}{}
		m[k] = set
	}
	set[c] = struct{}{}
}

func removeFrom[K comparable](m map[K]map[*Proxy]struct{}, k K, c *Proxy) {
	if set := m[k]; set != nil {
		delete(set, c)
		if len(set) == 0 {
			delete(m, k)
		}
	}
}

// add indexes a connection that has joined the server.
func (x *watchIndex) add(c *Proxy) {
	x.mu.Lock()
	defer x.mu.Unlock()
	addTo(x.bySub, c.edsSub, c)
	addTo(x.byShape, c.shape, c)
}

// remove forgets a connection that has left; later subscription changes of it are ignored.
func (x *watchIndex) remove(c *Proxy) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.live(c) {
		return
	}
	removeFrom(x.bySub, c.edsSub, c)
	removeFrom(x.byShape, c.shape, c)
}

// setEDS records the connection's EDS subscription (the caller holds w.mu).
func (x *watchIndex) setEDS(c *Proxy, sub *Subscription) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.live(c) {
		removeFrom(x.bySub, c.edsSub, c)
		addTo(x.bySub, sub, c)
	}
	c.edsSub = sub
}

// concerned returns the connections ev concerns; prev is the snapshot before it (nil at
// start-up, when every connection is concerned).
func (x *watchIndex) concerned(ev *Event, prev *xds.Snapshot) []*Proxy {
	var reached map[string]bool
	if ev.req.Full {
		if prev == nil || !servicesOnly(ev.req) {
			x.scopes = nil
			return x.all()
		}
		// What a scope test reads (the scope, the namespace) is the same for every proxy
		// of a shape: one of them answers for all, outside the lock (a scope may have to
		// be computed).
		shapes := x.shapes()
		if x.scopes == nil {
			x.scopes = make(map[string]*xds.Scope, len(shapes))
		}
		for shape := range x.scopes {
			if shapes[shape] == nil {
				delete(x.scopes, shape)
			}
		}
		reached = make(map[string]bool, len(shapes))
		for shape, c := range shapes {
			scope := x.scopes[shape]
			if scope == nil {
				scope = xds.CachedScope(prev, c.proxy, shape)
				x.scopes[shape] = scope
			}
			reached[shape] = c.reaches(ev, prev, scope)
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []*Proxy
	for shape, set := range x.byShape {
		if reached[shape] {
			for c := range set {
				out = append(out, c)
			}
		}
	}
	for sub, set := range x.bySub {
		if !ev.watches(sub) {
			continue
		}
		for c := range set {
			if !reached[c.shape] {
				out = append(out, c)
			}
		}
	}
	return out
}

func (x *watchIndex) all() []*Proxy {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []*Proxy
	for _, set := range x.byShape {
		for c := range set {
			out = append(out, c)
		}
	}
	return out
}

// shapes returns one connection of each shape.
func (x *watchIndex) shapes() map[string]*Proxy {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make(map[string]*Proxy, len(x.byShape))
	for shape, set := range x.byShape {
		for c := range set {
			out[shape] = c
			break
		}
	}
	return out
}
