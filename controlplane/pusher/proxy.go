package pusher

import (
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// Watcher receives the pushes that concern a proxy: the server queues them for its stream.
// Push must not block for long (the pusher hands one event to every watcher in turn).
type Watcher interface {
	Push(*Event)
}

// Proxy is one connected proxy as the pusher sees it: what it is, which resources it
// watches, and its view of the snapshot in force. A connection calls its methods one at a
// time.
type Proxy struct {
	p      *Pusher
	proxy  *model.Proxy
	shape  string // xds.Shape of the proxy
	target Watcher

	mu   sync.Mutex
	subs map[string]*Subscription // named watches, by type
	wild map[string]bool          // types watched whole
	view *xds.View
	// edsSub is the EDS subscription, as indexed (under p.index.mu).
	edsSub *Subscription
	closed bool
}

// Watch registers a proxy: the pushes that concern it go to target until Close.
func (p *Pusher) Watch(proxy *model.Proxy, target Watcher) *Proxy {
	w := &Proxy{p: p, proxy: proxy, shape: xds.Shape(proxy), target: target,
		subs: map[string]*Subscription{}, wild: map[string]bool{}}
	p.index.add(w)
	return w
}

// Close forgets the proxy and releases its subscriptions.
func (w *Proxy) Close() {
	w.p.index.remove(w)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for typ, sub := range w.subs {
		w.p.subs.release(sub)
		w.setSub(typ, nil)
	}
}

// Subscribe sets what the proxy watches of typ: every resource (wildcard), or names.
func (w *Proxy) Subscribe(typ string, wildcard bool, names []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if wildcard {
		w.wild[typ] = true
		return
	}
	old := w.subs[typ]
	w.setSub(typ, w.p.subs.acquire(names))
	w.p.subs.release(old)
}

// Change adds and removes names of what the proxy watches of typ (delta requests).
func (w *Proxy) Change(typ string, add, remove []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.wild[typ] {
		return
	}
	w.setSub(typ, w.p.subs.change(w.subs[typ], add, remove))
}

// setSub replaces a type's subscription (the caller holds w.mu); the EDS one is also
// indexed, so a push finds the proxies that watch a changed cluster.
func (w *Proxy) setSub(typ string, sub *Subscription) {
	if sub == nil {
		delete(w.subs, typ)
	} else {
		w.subs[typ] = sub
	}
	if typ == xds.EndpointType {
		w.p.index.setEDS(w, sub)
	}
}

// Watches reports whether the proxy watches the resource name of typ (wildcard: all).
func (w *Proxy) Watches(typ, name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wild[typ] || w.subs[typ].Has(name)
}

// Names is the set of names the proxy watches of typ (nil for a wildcard or unnamed watch);
// the set is shared and read-only.
func (w *Proxy) Names(typ string) map[string]struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if sub := w.subs[typ]; sub != nil {
		return sub.set
	}
	return nil
}

// Subscribed is the number of names the proxy watches of typ (0 for a wildcard watch).
func (w *Proxy) Subscribed(typ string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.subs[typ].Len()
}

// SameNames reports whether the proxy watches exactly names of typ.
func (w *Proxy) SameNames(typ string, names []string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.subs[typ].SameAs(names)
}

// Resources is what the proxy gets of typ from snap (the snapshot in force when nil), with
// the snapshot's version. Named types are generated once per shared subscription
// (xds.GenerateSet), so equal proxies share one result.
func (w *Proxy) Resources(typ string, snap *xds.Snapshot) (*xds.Resources, string) {
	if snap == nil {
		snap = w.p.Snapshot()
	}
	v := w.viewFor(snap)
	w.mu.Lock()
	sub, wild := w.subs[typ], w.wild[typ]
	w.mu.Unlock()
	if wild || sub == nil {
		return xds.Generate(v, typ, nil), snap.Version
	}
	return xds.GenerateSet(v, typ, &sub.id), snap.Version
}

// View returns the proxy's view of the snapshot in force.
func (w *Proxy) View() *xds.View { return w.viewFor(w.p.Snapshot()) }

// viewFor reuses the proxy's view while the full snapshot is unchanged: an endpoints-only
// snapshot changes nothing the view computed.
func (w *Proxy) viewFor(snap *xds.Snapshot) *xds.View {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.view == nil || w.view.Snapshot.FullVersion != snap.FullVersion:
		w.view = xds.CachedView(snap, w.proxy, w.shape)
	case w.view.Snapshot != snap:
		v := *w.view
		v.Snapshot = snap
		w.view = &v
	}
	return w.view
}

// reaches reports whether the proxy, whose scope (built on a snapshot with today's traffic
// config) is given, reaches or routes a host a services-only push changed, before or after
// it, or whether one is in its namespace.
func (w *Proxy) reaches(ev *Event, prev *xds.Snapshot, scope *xds.Scope) bool {
	for h := range ev.req.EDSHosts {
		for _, snap := range []*xds.Snapshot{prev, ev.snap} {
			if scope.Reaches(snap, h) {
				return true
			}
			if svc := snap.Service(h); svc != nil && svc.Namespace == w.proxy.Namespace {
				return true
			}
		}
	}
	return false
}
