package server

import (
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/wasmesh/wasmesh/controlplane/pusher"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// StreamAggregatedResources serves State of the World ADS.
func (s *Server) StreamAggregatedResources(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return s.streamSotw(stream, nil)
}

// streamSotw serves a SotW stream opened by caller (nil: unauthenticated, the plaintext port).
func (s *Server) streamSotw(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer, caller Caller) error {
	return serve(s, stream, caller, false, func(r *discovery.DiscoveryRequest) bool { return r.GetVersionInfo() != "" },
		func(c *Connection, r *discovery.DiscoveryRequest) error { return c.onSotwRequest(stream, r) },
		func(c *Connection, ev *pusher.Event) error { return c.pushSotw(stream, ev) })
}

func (c *Connection) onSotwRequest(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer, r *discovery.DiscoveryRequest) error {
	typ := r.GetTypeUrl()
	c.mu.Lock()
	w := c.watches[typ]
	c.mu.Unlock()
	if w != nil && r.GetResponseNonce() != "" {
		if !c.recordAck(typ, w, r.GetResponseNonce(), r.GetVersionInfo(), r.GetErrorDetail().GetMessage()) {
			return nil
		}
		if r.GetErrorDetail() != nil || w.wildcard || c.gen.SameNames(typ, r.GetResourceNames()) {
			// An ACK or NACK without a new subscription: nothing to send. After a NACK the
			// proxy keeps its last accepted config; resending the same would fail again.
			return nil
		}
	}
	if w == nil {
		w = &watch{}
		c.mu.Lock()
		c.watches[typ] = w
		// Envoy subscribes to CDS and LDS as a whole (no names); gRPC's xDS client names
		// the listeners and clusters it wants.
		w.wildcard = xds.Wildcard(typ) && (len(r.GetResourceNames()) == 0 || contains(r.GetResourceNames(), "*"))
		if w.wildcard {
			c.gen.Subscribe(typ, true, nil)
		} else {
			c.subscribe(typ, w, r.GetResourceNames())
		}
		c.mu.Unlock()
		// A new subscription (or a reconnect) gets everything it names.
		return c.sendSotwAll(stream, typ, w, nil)
	}
	// A changed subscription gets what it did not have: the resources of added names.
	c.mu.Lock()
	c.subscribe(typ, w, r.GetResourceNames())
	c.mu.Unlock()
	_, err := c.sendSotwChanged(stream, typ, w, nil, nil)
	return err
}

// pushSotw sends what a push changed, type by type in Envoy's order. CDS and LDS go out
// whole when anything in them changed (SotW needs the full set); EDS and RDS send only the
// resources that changed, plus the assignments of clusters that CDS just replaced, which
// Envoy needs to warm them (Istio pushes EDS after CDS for the same reason).
func (c *Connection) pushSotw(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer, ev *pusher.Event) error {
	start := time.Now()
	defer func() { c.srv.metrics.SendTime.Observe(time.Since(start).Seconds()) }()
	if !ev.Full() {
		if err := c.pushEDSOnly(ev, func(typ string, w *watch, items []*xds.Resource, known *xds.Resources, version string) error {
			return c.sendSotwItems(stream, typ, w, version, items, known)
		}); err != nil {
			return err
		}
		c.observeConvergence(ev)
		return nil
	}
	var replacedClusters map[string]struct{}
	for _, typ := range xds.PushOrder {
		c.mu.Lock()
		w := c.watches[typ]
		c.mu.Unlock()
		if w == nil {
			continue
		}
		changed, err := c.sendSotwChanged(stream, typ, w, ev.Snapshot(), alsoFor(typ, replacedClusters))
		if err != nil {
			return err
		}
		if typ == xds.ClusterType {
			replacedClusters = changed
		}
	}
	c.observeConvergence(ev)
	return nil
}

// pushEDSOnly sends the assignments of the changed hosts' clusters this proxy watches.
func (c *Connection) pushEDSOnly(ev *pusher.Event, send func(typ string, w *watch, items []*xds.Resource, known *xds.Resources, version string) error) error {
	c.mu.Lock()
	w := c.watches[xds.EndpointType]
	c.mu.Unlock()
	if w == nil {
		return nil
	}
	var names []string
	for _, n := range ev.EDSClusters() {
		if c.gen.Watches(xds.EndpointType, n) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil
	}
	// The new full set is shared by every proxy with this subscription; the client gets the
	// changed part of it, found by name without walking the whole set.
	cur, version := c.gen.Resources(xds.EndpointType, ev.Snapshot())
	var changed []*xds.Resource
	for _, n := range names {
		nr := cur.Find(n)
		if nr == nil {
			continue
		}
		if or := w.known.Find(n); or == nil || or.Hash != nr.Hash {
			changed = append(changed, nr)
		}
	}
	if len(changed) == 0 {
		return nil
	}
	return send(xds.EndpointType, w, changed, cur, version)
}

// sendSotwChanged sends a type when it changed and returns the names that changed. Wildcard
// types (CDS, LDS) are sent whole; named types send the changed resources plus those named
// in also, even when unchanged.
func (c *Connection) sendSotwChanged(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer, typ string, w *watch, snap *xds.Snapshot, also map[string]struct{}) (map[string]struct{}, error) {
	cur, version := c.gen.Resources(typ, snap)
	if cur == w.known {
		return nil, nil // the very set this proxy has: shared results make this common
	}
	changed, removed := xds.Diff(w.known, cur)
	if len(changed) == 0 && len(removed) == 0 && len(also) == 0 {
		return nil, nil
	}
	names := make(map[string]struct{}, len(changed))
	for _, r := range changed {
		names[r.Name] = struct{}{}
	}
	if w.wildcard || xds.Wildcard(typ) {
		// CDS and LDS responses are the whole state even for a client that names what it
		// wants (gRPC): a resource left out of one would be taken as deleted.
		return names, c.sendSotwItems(stream, typ, w, version, cur.Items, cur)
	}
	send := changed
	if len(also) > 0 {
		send = send[:0:0]
		for _, r := range cur.Items {
			_, ch := names[r.Name]
			_, al := also[r.Name]
			if ch || al {
				send = append(send, r)
			}
		}
	}
	if len(send) == 0 {
		return nil, nil
	}
	return names, c.sendSotwItems(stream, typ, w, version, send, cur)
}

// sendSotwAll answers a new subscription with everything it names.
func (c *Connection) sendSotwAll(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer, typ string, w *watch, snap *xds.Snapshot) error {
	cur, version := c.gen.Resources(typ, snap)
	return c.sendSotwItems(stream, typ, w, version, cur.Items, cur)
}

func (c *Connection) sendSotwItems(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer, typ string, w *watch, version string, items []*xds.Resource, known *xds.Resources) error {
	if c.held() {
		return nil // nothing recorded as sent: the push after the window sends it all
	}
	start := time.Now()
	nonce := c.srv.nextNonce()
	// Encoded once per shared set; this connection adds only its header.
	resp := xds.EncodeSotw(version, typ, nonce, known, items)
	if err := c.sendWithTimeout(func() error { return stream.SendMsg(resp) }); err != nil {
		return err
	}
	bytes := resp.Size()
	c.recordSent(typ, w, nonce, version, known, bytes)
	c.srv.metrics.PushTime.WithLabelValues(xds.ShortType(typ)).Observe(time.Since(start).Seconds())
	return nil
}

// alsoFor passes the replaced clusters to EDS only.
func alsoFor(typ string, replaced map[string]struct{}) map[string]struct{} {
	if typ == xds.EndpointType {
		return replaced
	}
	return nil
}
