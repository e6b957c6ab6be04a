// Package adsc is a small ADS client for tests and load generation: it connects like Envoy
// (SotW or Delta), subscribes to CDS and LDS, follows them with EDS and RDS subscriptions,
// ACKs every response (or NACKs on request), and keeps the resources it received.
package adsc

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Type URLs followed by the client.
const (
	ClusterType  = resourcev3.ClusterType
	EndpointType = resourcev3.EndpointType
	ListenerType = resourcev3.ListenerType
	RouteType    = resourcev3.RouteType
)

// Config says how the client behaves.
type Config struct {
	Node  *core.Node
	Delta bool
	// Reject, when set, is asked about every response; a non-empty message NACKs it.
	Reject func(typeURL string, names []string) string
	// Thin keeps only resource names and bytes and reads clusters with a wire-level scan,
	// so one process can hold thousands of clients.
	Thin bool
	// SkipEDS does not follow clusters with EDS subscriptions.
	SkipEDS bool
}

// Response records one response received.
type Response struct {
	TypeURL  string
	Version  string
	Nonce    string
	Names    []string
	Removed  []string
	Received time.Time
	Acked    time.Time
	Nacked   bool
}

// Client is one ADS stream.
type Client struct {
	cfg Config

	mu        sync.Mutex
	resources map[string]map[string]*entry // type → name → what is kept of the resource
	edsNames  map[string]bool              // EDS clusters seen in CDS
	rdsNames  map[string]bool              // route configs referenced by LDS
	log       []Response
	nonces    map[string]string // latest nonce per type, sent with subscription changes as Envoy does
	changed   chan struct{}
	err       error
	done      chan struct{}

	sendMu sync.Mutex
	send   func(typ string, nonce, version string, names []string, sub, unsub []string, errMsg string) error
}

// Dial opens an ADS stream over conn and starts the client; it stops when ctx ends or the
// stream fails (Err reports why).
func Dial(ctx context.Context, conn grpc.ClientConnInterface, cfg Config) (*Client, error) {
	c := &Client{cfg: cfg, resources: map[string]map[string]*entry{}, edsNames: map[string]bool{}, rdsNames: map[string]bool{}, nonces: map[string]string{},
		changed: make(chan struct{}), done: make(chan struct{})}
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	if cfg.Delta {
		stream, err := ads.DeltaAggregatedResources(ctx)
		if err != nil {
			return nil, fmt.Errorf("opening delta ADS stream: %w", err)
		}
		first := true
		c.send = func(typ, nonce, _ string, _ []string, sub, unsub []string, errMsg string) error {
			r := &discovery.DeltaDiscoveryRequest{TypeUrl: typ, ResponseNonce: nonce, ResourceNamesSubscribe: sub, ResourceNamesUnsubscribe: unsub}
			if first {
				r.Node, first = cfg.Node, false
			}
			if errMsg != "" {
				r.ErrorDetail = &statuspb.Status{Code: 3, Message: errMsg}
			}
			return stream.Send(r)
		}
		go c.run(func() error { return c.recvDelta(stream) })
	} else {
		stream, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return nil, fmt.Errorf("opening ADS stream: %w", err)
		}
		first := true
		c.send = func(typ, nonce, version string, names []string, _, _ []string, errMsg string) error {
			r := &discovery.DiscoveryRequest{TypeUrl: typ, ResponseNonce: nonce, VersionInfo: version, ResourceNames: names}
			if first {
				r.Node, first = cfg.Node, false
			}
			if errMsg != "" {
				r.ErrorDetail = &statuspb.Status{Code: 3, Message: errMsg}
			}
			return stream.Send(r)
		}
		go c.run(func() error { return c.recvSotw(stream) })
	}
	if err := c.request(ClusterType, "", "", nil, nil, nil, ""); err != nil {
		return nil, err
	}
	if err := c.request(ListenerType, "", "", nil, nil, nil, ""); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Client) request(typ, nonce, version string, names, sub, unsub []string, errMsg string) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.send(typ, nonce, version, names, sub, unsub, errMsg)
}

func (c *Client) run(loop func() error) {
	err := loop()
	c.mu.Lock()
	c.err = err
	c.notifyLocked()
	c.mu.Unlock()
	close(c.done)
}

// Done is closed when the stream has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the stream ended (nil while it runs).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *Client) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *Client) recvSotw(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient) error {
	acked := map[string]string{} // last accepted version per type, sent back on NACK
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		typ := resp.GetTypeUrl()
		names, err := c.names(typ, resp.GetResources())
		if err != nil {
			return err
		}
		r := Response{TypeURL: typ, Version: resp.GetVersionInfo(), Nonce: resp.GetNonce(), Names: names, Received: time.Now()}
		if msg := c.reject(typ, names); msg != "" {
			r.Nacked = true
			c.record(r, nil, false)
			if err := c.request(typ, resp.GetNonce(), acked[typ], c.subscription(typ), nil, nil, msg); err != nil {
				return err
			}
			continue
		}
		acked[typ] = resp.GetVersionInfo()
		follow := c.apply(typ, resp.GetResources(), nil, typ == ClusterType || typ == ListenerType)
		c.mu.Lock()
		c.nonces[typ] = resp.GetNonce()
		c.mu.Unlock()
		r.Acked = time.Now()
		if err := c.request(typ, resp.GetNonce(), resp.GetVersionInfo(), c.subscription(typ), nil, nil, ""); err != nil {
			return err
		}
		c.record(r, nil, false)
		for _, f := range follow {
			c.mu.Lock()
			nonce := c.nonces[f.typ]
			c.mu.Unlock()
			if err := c.request(f.typ, nonce, acked[f.typ], f.names, nil, nil, ""); err != nil {
				return err
			}
		}
	}
}

func (c *Client) recvDelta(stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient) error {
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		typ := resp.GetTypeUrl()
		anys := make([]*anypb.Any, len(resp.GetResources()))
		for i, r := range resp.GetResources() {
			anys[i] = r.GetResource()
		}
		names, err := c.names(typ, anys)
		if err != nil {
			return err
		}
		r := Response{TypeURL: typ, Version: resp.GetSystemVersionInfo(), Nonce: resp.GetNonce(), Names: names, Removed: resp.GetRemovedResources(), Received: time.Now()}
		if msg := c.reject(typ, names); msg != "" {
			r.Nacked = true
			c.record(r, nil, false)
			if err := c.request(typ, resp.GetNonce(), "", nil, nil, nil, msg); err != nil {
				return err
			}
			continue
		}
		follow := c.apply(typ, anys, resp.GetRemovedResources(), false)
		r.Acked = time.Now()
		if err := c.request(typ, resp.GetNonce(), "", nil, nil, nil, ""); err != nil {
			return err
		}
		c.record(r, nil, false)
		for _, f := range follow {
			if err := c.request(f.typ, "", "", nil, f.sub, f.unsub, ""); err != nil {
				return err
			}
		}
	}
}

func (c *Client) reject(typ string, names []string) string {
	if c.cfg.Reject == nil {
		return ""
	}
	return c.cfg.Reject(typ, names)
}

func (c *Client) record(r Response, _ error, _ bool) {
	c.mu.Lock()
	c.log = append(c.log, r)
	c.notifyLocked()
	c.mu.Unlock()
}

// names reads the resource names of a response.
func (c *Client) names(typ string, anys []*anypb.Any) ([]string, error) {
	out := make([]string, 0, len(anys))
	for _, a := range anys {
		n, err := nameOf(a.GetValue())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", typ, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// nameOf reads field 1 (name / cluster_name) of Cluster, Listener, RouteConfiguration and
// ClusterLoadAssignment without decoding the rest.
func nameOf(b []byte) (string, error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return "", protowire.ParseError(n)
			}
			return string(v), nil
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return "", protowire.ParseError(n)
		}
		b = b[n:]
	}
	return "", errors.New("resource without a name")
}

type followUp struct {
	typ        string
	names      []string // SotW: the full new subscription
	sub, unsub []string // delta
}

// apply stores resources and works out the EDS/RDS subscriptions that CDS/LDS imply.
func (c *Client) apply(typ string, anys []*anypb.Any, removed []string, replaceAll bool) []followUp {
	c.mu.Lock()
	defer c.mu.Unlock()
	store := c.resources[typ]
	if store == nil || replaceAll {
		store = map[string]*entry{}
		c.resources[typ] = store
	}
	for _, a := range anys {
		n, _ := nameOf(a.GetValue())
		e := &entry{}
		switch {
		case typ == ClusterType:
			_, e.eds = c.edsCluster(a.GetValue())
		case typ == ListenerType:
			e.routes = routeNames(a.GetValue())
		}
		// A thin client keeps the bytes of endpoints only (tests look into those); a full
		// client keeps everything.
		if !c.cfg.Thin || typ == EndpointType {
			e.raw = a.GetValue()
		}
		store[n] = e
	}
	for _, n := range removed {
		delete(store, n)
	}
	switch typ {
	case ClusterType:
		if c.cfg.SkipEDS {
			return nil
		}
		want := map[string]bool{}
		for name, e := range store {
			if e.eds {
				want[name] = true
			}
		}
		return c.follow(EndpointType, c.edsNames, want, func(m map[string]bool) { c.edsNames = m })
	case ListenerType:
		want := map[string]bool{}
		for _, e := range store {
			for _, rn := range e.routes {
				want[rn] = true
			}
		}
		return c.follow(RouteType, c.rdsNames, want, func(m map[string]bool) { c.rdsNames = m })
	}
	return nil
}

// entry is what the client keeps of one resource.
type entry struct {
	raw    []byte
	eds    bool     // a cluster using EDS
	routes []string // route configurations a listener references
}

func (c *Client) follow(typ string, have, want map[string]bool, set func(map[string]bool)) []followUp {
	var sub, unsub []string
	for n := range want {
		if !have[n] {
			sub = append(sub, n)
		}
	}
	for n := range have {
		if !want[n] {
			unsub = append(unsub, n)
			delete(c.resources[typ], n)
		}
	}
	if len(sub) == 0 && len(unsub) == 0 {
		return nil
	}
	set(want)
	sort.Strings(sub)
	sort.Strings(unsub)
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	return []followUp{{typ: typ, names: names, sub: sub, unsub: unsub}}
}

func (c *Client) subscription(typ string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var m map[string]bool
	switch typ {
	case EndpointType:
		m = c.edsNames
	case RouteType:
		m = c.rdsNames
	default:
		return nil
	}
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// edsCluster reports a cluster's name and whether it uses EDS (type field 2 == EDS).
func (c *Client) edsCluster(b []byte) (string, bool) {
	if c.cfg.Thin {
		name, _ := nameOf(b)
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				return name, false
			}
			b = b[n:]
			if num == 2 && typ == protowire.VarintType {
				v, _ := protowire.ConsumeVarint(b)
				return name, cluster.Cluster_DiscoveryType(v) == cluster.Cluster_EDS
			}
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return name, false
			}
			b = b[n:]
		}
		return name, false
	}
	var cl cluster.Cluster
	if proto.Unmarshal(b, &cl) != nil {
		return "", false
	}
	return cl.GetName(), cl.GetType() == cluster.Cluster_EDS
}

func routeNames(b []byte) []string {
	var l listener.Listener
	if proto.Unmarshal(b, &l) != nil {
		return nil
	}
	var out []string
	for _, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			var m hcm.HttpConnectionManager
			if f.GetTypedConfig().MessageIs(&m) && f.GetTypedConfig().UnmarshalTo(&m) == nil && m.GetRds() != nil {
				out = append(out, m.GetRds().GetRouteConfigName())
			}
		}
	}
	return out
}

// Names returns the names of the resources of a type the client holds, sorted.
func (c *Client) Names(typ string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.resources[typ]))
	for n := range c.resources[typ] {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Resource unmarshals a held resource into m; false when the client does not hold it.
func (c *Client) Resource(typ, name string, m proto.Message) bool {
	c.mu.Lock()
	e, ok := c.resources[typ][name]
	c.mu.Unlock()
	return ok && e.raw != nil && proto.Unmarshal(e.raw, m) == nil
}

// Responses returns every response received so far.
func (c *Client) Responses() []Response {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Response(nil), c.log...)
}

// Wait blocks until cond holds (checked after every response) or ctx ends.
func (c *Client) Wait(ctx context.Context, cond func(*Client) bool) error {
	for {
		c.mu.Lock()
		ch := c.changed
		err := c.err
		c.mu.Unlock()
		if cond(c) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("stream ended: %w", err)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Has reports whether the client holds a resource.
func (c *Client) Has(typ, name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.resources[typ][name]
	return ok
}

// Count is the number of resources of a type the client holds.
func (c *Client) Count(typ string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.resources[typ])
}

// Subscribed is the number of names the client subscribes to for EDS or RDS.
func (c *Client) Subscribed(typ string) int { return len(c.subscription(typ)) }

// LastAck is when the client last ACKed a response of typ (zero if never).
func (c *Client) LastAck(typ string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.log) - 1; i >= 0; i-- {
		if c.log[i].TypeURL == typ && !c.log[i].Nacked {
			return c.log[i].Acked
		}
	}
	return time.Time{}
}

// TrimLog drops the recorded responses, so a long-running load client does not grow.
func (c *Client) TrimLog() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log = nil
}
