package server

import (
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// StreamAggregatedResources serves State of the World ADS.
func (s *Server) StreamAggregatedResources(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if isClosed(err) {
			return nil
		}
		return err
	}
	c, err := s.newConnection(ctx, first.GetNode(), false)
	if err != nil {
		return err
	}
	s.addConnection(c)
	defer s.closeConnection(c)

	reqs := make(chan *discovery.DiscoveryRequest)
	errs := make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				errs <- err
				return
			}
			select {
			case reqs <- r:
			case <-c.stopped:
				return
			}
		}
	}()
	if err := c.onSotwRequest(stream, first); err != nil {
		return err
	}
	for {
		select {
		case r := <-reqs:
			if err := c.onSotwRequest(stream, r); err != nil {
				return err
			}
		case ev := <-c.pushCh:
			err := c.pushSotw(stream, ev)
			close(ev.done)
			if err != nil {
				return err
			}
		case err := <-errs:
			if isClosed(err) {
				return nil
			}
			return err
		case <-s.stop:
			return nil
		}
	}
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
		if r.GetErrorDetail() != nil || w.wildcard || sameNames(w.names, r.GetResourceNames()) {
			// An ACK or NACK without a new subscription: nothing to send. After a NACK the
			// proxy keeps its last accepted config; resending the same would fail again.
			return nil
		}
	}
	if w == nil {
		w = &watch{}
		c.mu.Lock()
		c.watches[typ] = w
		c.mu.Unlock()
	}
	c.mu.Lock()
	w.wildcard = xds.Wildcard(typ)
	w.names = nameSet(r.GetResourceNames())
	c.mu.Unlock()
	// A new or changed subscription gets the full set of what it names.
	return c.sendSotw(stream, typ, w, c.srv.Snapshot(), true)
}

func sameNames(have map[string]struct{}, names []string) bool {
	if len(have) != len(names) {
		return false
	}
	for _, n := range names {
		if _, ok := have[n]; !ok {
			return false
		}
	}
	return true
}

func nameSet(names []string) map[string]struct{} {
	m := make(map[string]struct{}, len(names))
	for _, n := range names {
		m[n] = struct{}{}
	}
	return m
}

// pushSotw sends what a push changed, type by type in Envoy's order. After CDS (LDS) is
// sent, all of EDS (RDS) follows, since Envoy waits for them to warm updated clusters
// (listeners); otherwise EDS and RDS send only the resources that changed.
func (c *Connection) pushSotw(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer, ev *pushEvent) error {
	start := time.Now()
	defer func() { c.srv.metrics.SendTime.Observe(time.Since(start).Seconds()) }()
	if !ev.req.Full {
		if err := c.pushEDSOnly(ev, func(typ string, w *watch, items []*xds.Resource, known *xds.Resources) error {
			return c.sendSotwItems(stream, typ, w, ev.snap, items, known)
		}); err != nil {
			return err
		}
		c.observeConvergence(ev)
		return nil
	}
	forceEDS, forceRDS := false, false
	for _, typ := range xds.PushOrder {
		c.mu.Lock()
		w := c.watches[typ]
		c.mu.Unlock()
		if w == nil {
			continue
		}
		force := (typ == xds.EndpointType && forceEDS) || (typ == xds.RouteType && forceRDS)
		sent, err := c.sendSotwChanged(stream, typ, w, ev.snap, force)
		if err != nil {
			return err
		}
		if sent && typ == xds.ClusterType {
			forceEDS = true
		}
		if sent && typ == xds.ListenerType {
			forceRDS = true
		}
	}
	c.observeConvergence(ev)
	return nil
}

// pushEDSOnly sends the assignments of the changed hosts' clusters this proxy watches.
func (c *Connection) pushEDSOnly(ev *pushEvent, send func(typ string, w *watch, items []*xds.Resource, known *xds.Resources) error) error {
	names := c.edsNames(ev.snap, ev.req.EDSHosts)
	c.mu.Lock()
	w := c.watches[xds.EndpointType]
	c.mu.Unlock()
	if w == nil || len(names) == 0 {
		return nil
	}
	items := xds.Endpoints(ev.snap, names)
	changed, _ := xds.Diff(xds.Select(w.known, nameSet(names)), xds.Merge(nil, items))
	if len(changed) == 0 {
		return nil
	}
	c.viewFor(ev.snap)
	return send(xds.EndpointType, w, changed, xds.Merge(w.known, changed))
}

// sendSotwChanged sends a type when it changed; it reports whether it sent.
func (c *Connection) sendSotwChanged(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer, typ string, w *watch, snap *push.Snapshot, force bool) (bool, error) {
	v := c.viewFor(snap)
	cur := xds.Generate(v, typ, c.subscribed(w))
	if force {
		return true, c.sendSotwItems(stream, typ, w, snap, cur.Items, cur)
	}
	if w.wildcard {
		if w.known != nil && w.known.Hash == cur.Hash {
			return false, nil
		}
		return true, c.sendSotwItems(stream, typ, w, snap, cur.Items, cur)
	}
	changed, _ := xds.Diff(w.known, cur)
	if len(changed) == 0 {
		return false, nil
	}
	return true, c.sendSotwItems(stream, typ, w, snap, changed, cur)
}

func (c *Connection) sendSotw(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer, typ string, w *watch, snap *push.Snapshot, force bool) error {
	_, err := c.sendSotwChanged(stream, typ, w, snap, force)
	return err
}

func (c *Connection) sendSotwItems(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer, typ string, w *watch, snap *push.Snapshot, items []*xds.Resource, known *xds.Resources) error {
	start := time.Now()
	res := make([]*anypb.Any, len(items))
	bytes := 0
	for i, it := range items {
		res[i] = it.Any
		bytes += len(it.Any.Value)
	}
	nonce := c.srv.nextNonce()
	resp := &discovery.DiscoveryResponse{VersionInfo: snap.Version, Resources: res, TypeUrl: typ, Nonce: nonce}
	if err := c.sendWithTimeout(func() error { return stream.Send(resp) }); err != nil {
		return err
	}
	c.recordSent(typ, w, nonce, snap.Version, known, bytes)
	c.srv.metrics.PushTime.WithLabelValues(xds.ShortType(typ)).Observe(time.Since(start).Seconds())
	return nil
}
