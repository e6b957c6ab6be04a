package server

import (
	"strconv"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/wasmesh/wasmesh/controlplane/pusher"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// DeltaAggregatedResources serves incremental (delta) ADS: only changed resources and the
// names of removed ones are sent.
func (s *Server) DeltaAggregatedResources(stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return s.streamDelta(stream, nil)
}

// streamDelta serves a delta stream opened by caller (nil: unauthenticated, the plaintext port).
func (s *Server) streamDelta(stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer, caller Caller) error {
	return serve(s, stream, caller, true, func(r *discovery.DeltaDiscoveryRequest) bool { return len(r.GetInitialResourceVersions()) > 0 },
		func(c *Connection, r *discovery.DeltaDiscoveryRequest) error { return c.onDeltaRequest(stream, r) },
		func(c *Connection, ev *pusher.Event) error { return c.pushDelta(stream, ev) })
}

func (c *Connection) onDeltaRequest(stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer, r *discovery.DeltaDiscoveryRequest) error {
	typ := r.GetTypeUrl()
	c.mu.Lock()
	w := c.watches[typ]
	initial := w == nil
	if initial {
		w = &watch{}
		c.watches[typ] = w
		w.wildcard = xds.Wildcard(typ) && (len(r.GetResourceNamesSubscribe()) == 0 || contains(r.GetResourceNamesSubscribe(), "*"))
		if w.wildcard {
			c.gen.Subscribe(typ, true, nil)
		}
		// A reconnecting proxy says what it has; resources at the same version are not resent.
		if iv := r.GetInitialResourceVersions(); len(iv) > 0 {
			var items []*xds.Resource
			for name, ver := range iv {
				if h, err := strconv.ParseUint(ver, 36, 64); err == nil {
					items = append(items, &xds.Resource{Name: name, Hash: h})
				}
			}
			w.known = xds.Merge(nil, items)
		}
	}
	c.mu.Unlock()
	if !initial && r.GetResponseNonce() != "" {
		if c.recordAck(typ, w, r.GetResponseNonce(), w.versionSent, r.GetErrorDetail().GetMessage()) && r.GetErrorDetail() != nil {
			return nil
		}
	}
	changedSubs := false
	c.mu.Lock()
	if !w.wildcard {
		var add, remove []string
		for _, n := range r.GetResourceNamesUnsubscribe() {
			if c.gen.Watches(typ, n) {
				remove = append(remove, n)
			}
		}
		for _, n := range r.GetResourceNamesSubscribe() {
			if n != "*" && !c.gen.Watches(typ, n) {
				add = append(add, n)
			}
		}
		changedSubs = len(add) > 0
		if len(add) > 0 || len(remove) > 0 || initial {
			c.gen.Change(typ, add, remove)
			if w.known != nil && len(remove) > 0 {
				// Forgetting unsubscribed names keeps them from being reported as removed.
				w.known = xds.Select(w.known, c.gen.Names(typ))
			}
		}
	}
	c.mu.Unlock()
	if !initial && !changedSubs {
		return nil
	}
	_, err := c.sendDeltaChanged(stream, typ, w, nil, initial && w.wildcard)
	return err
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func (c *Connection) pushDelta(stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer, ev *pusher.Event) error {
	start := time.Now()
	defer func() { c.srv.metrics.SendTime.Observe(time.Since(start).Seconds()) }()
	if !ev.Full() {
		err := c.pushEDSOnly(ev, func(typ string, w *watch, items []*xds.Resource, known *xds.Resources, version string) error {
			return c.sendDeltaItems(stream, typ, w, version, items, nil, known)
		})
		if err == nil {
			c.observeConvergence(ev)
		}
		return err
	}
	for _, typ := range xds.PushOrder {
		c.mu.Lock()
		w := c.watches[typ]
		c.mu.Unlock()
		if w == nil {
			continue
		}
		if _, err := c.sendDeltaChanged(stream, typ, w, ev.Snapshot(), false); err != nil {
			return err
		}
	}
	c.observeConvergence(ev)
	return nil
}

// sendDeltaChanged sends the changed and removed resources of a type; always answers when
// force is set (the first response to a wildcard subscription, which Envoy waits for even
// when empty).
func (c *Connection) sendDeltaChanged(stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer, typ string, w *watch, snap *xds.Snapshot, force bool) (bool, error) {
	c.mu.Lock()
	known := w.known
	c.mu.Unlock()
	cur, version := c.gen.Resources(typ, snap)
	if cur == known && !force {
		return false, nil
	}
	changed, removed := xds.Diff(known, cur)
	if len(changed) == 0 && len(removed) == 0 && !force {
		return false, nil
	}
	return true, c.sendDeltaItems(stream, typ, w, version, changed, removed, cur)
}

func (c *Connection) sendDeltaItems(stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer, typ string, w *watch, version string, items []*xds.Resource, removed []string, known *xds.Resources) error {
	if c.held() {
		return nil // nothing recorded as sent: the push after the window sends it all
	}
	start := time.Now()
	nonce := c.srv.nextNonce()
	resp := xds.EncodeDelta(version, typ, nonce, known, items, removed)
	if err := c.sendWithTimeout(func() error { return stream.SendMsg(resp) }); err != nil {
		return err
	}
	bytes := resp.Size()
	c.recordSent(typ, w, nonce, version, known, bytes)
	c.srv.metrics.PushTime.WithLabelValues(xds.ShortType(typ)).Observe(time.Since(start).Seconds())
	return nil
}
