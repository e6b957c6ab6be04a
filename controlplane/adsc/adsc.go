// Package adsc is a small ADS client for tests and load generation: it connects like Envoy
// (SotW or Delta), subscribes to CDS and LDS, follows them with EDS and RDS subscriptions,
// ACKs every response (or NACKs on request), and keeps the resources it received.
//
// Responses are read from the wire directly (names, and only the bytes the client keeps),
// so one process can hold thousands of clients; requests are ordinary discovery messages.
// Dial runs the stream on a grpc-go connection; DialH2 on its own HTTP/2 connection read
// and written by the client's one goroutine (package h2grpc), for load generation.
package adsc

import (
	"context"
	"errors"
	"fmt"
	"path"
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
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/wasmesh/wasmesh/controlplane/h2grpc"
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
	// Thin keeps only names (and the bytes of endpoints) and no log of responses (only when
	// each type was last ACKed), so one process can hold thousands of clients.
	Thin bool
	// SkipEDS does not follow clusters with EDS subscriptions.
	SkipEDS bool
}

// Response records one response received.
type Response struct {
	TypeURL  string
	Version  string
	Nonce    string
	Names    []string // nil for a thin client
	Count    int
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
	follows   map[string]*followed         // EDS and RDS subscriptions implied by CDS and LDS
	gen       uint64
	log       []Response
	nonces    map[string]string    // latest nonce per type, sent with subscription changes as Envoy does
	changed   chan struct{}        // closed by the next response; made when Wait needs it
	lastAcks  map[string]time.Time // a thin client's stand-in for its log
	onChange  func()               // see Notify
	err       error
	done      chan struct{}

	tr transport
	// send writes a request; an error is the stream's, which the reader reports.
	send func(typ string, nonce, version string, names []string, sub, unsub []string, errMsg string) error
}

// transport carries one ADS stream. Send must not wait for the server's flow control
// window, as Envoy never stops reading responses to write a request: a reader blocked on a
// full send window while the server is blocked sending to it would deadlock the stream.
type transport interface {
	// Recv returns the next response's bytes, valid until the next call.
	Recv() ([]byte, error)
	Send(proto.Message) error
}

// entry is what the client keeps of one resource.
type entry struct {
	raw    []byte
	eds    bool     // a cluster using EDS
	routes []string // route configurations a listener references
	gen    uint64
}

// followed is a subscription the client derives from another type.
type followed struct {
	names  map[string]bool
	sorted []string // cached for requests; nil when stale
}

func (f *followed) list() []string {
	if f.sorted == nil {
		f.sorted = make([]string, 0, len(f.names))
		for n := range f.names {
			f.sorted = append(f.sorted, n)
		}
		sort.Strings(f.sorted)
	}
	return f.sorted
}

// Dial opens an ADS stream over a grpc-go connection and starts the client; it stops when
// ctx ends or the stream fails (Err reports why).
func Dial(ctx context.Context, conn grpc.ClientConnInterface, cfg Config) (*Client, error) {
	method := adsStream
	if cfg.Delta {
		method = adsDelta
	}
	desc := &grpc.StreamDesc{StreamName: path.Base(method), ServerStreams: true, ClientStreams: true}
	st, err := conn.NewStream(ctx, desc, method, grpc.ForceCodecV2(rawCodec{proto: encoding.GetCodecV2("proto")}))
	if err != nil {
		return nil, fmt.Errorf("opening ADS stream %s: %w", method, err)
	}
	return start(newGRPCTransport(st), cfg), nil
}

// DialH2 opens an ADS stream over its own HTTP/2 connection to addr (plaintext) with
// h2grpc: the client's reader writes its requests itself and no transport goroutine runs,
// so a load generator holding thousands of clients costs the machine little beside the
// server it measures. Cancelling ctx closes the connection.
func DialH2(ctx context.Context, addr string, cfg Config) (*Client, error) {
	method := adsStream
	if cfg.Delta {
		method = adsDelta
	}
	st, err := h2grpc.Dial(ctx, addr, method)
	if err != nil {
		return nil, err
	}
	return start(&h2Transport{st: st}, cfg), nil
}

const (
	adsStream = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
	adsDelta  = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
)

// start runs a client on an open stream: it asks for CDS and LDS and reads responses.
func start(tr transport, cfg Config) *Client {
	c := &Client{cfg: cfg, tr: tr, resources: map[string]map[string]*entry{}, nonces: map[string]string{},
		follows:  map[string]*followed{EndpointType: {names: map[string]bool{}}, RouteType: {names: map[string]bool{}}},
		lastAcks: map[string]time.Time{}, done: make(chan struct{})}
	first := true
	if cfg.Delta {
		c.send = func(typ, nonce, _ string, _ []string, sub, unsub []string, errMsg string) error {
			r := &discovery.DeltaDiscoveryRequest{TypeUrl: typ, ResponseNonce: nonce, ResourceNamesSubscribe: sub, ResourceNamesUnsubscribe: unsub}
			if first {
				r.Node, first = cfg.Node, false
			}
			if errMsg != "" {
				r.ErrorDetail = &statuspb.Status{Code: 3, Message: errMsg}
			}
			return tr.Send(r)
		}
	} else {
		c.send = func(typ, nonce, version string, names []string, _, _ []string, errMsg string) error {
			r := &discovery.DiscoveryRequest{TypeUrl: typ, ResponseNonce: nonce, VersionInfo: version, ResourceNames: names}
			if first {
				r.Node, first = cfg.Node, false
			}
			if errMsg != "" {
				r.ErrorDetail = &statuspb.Status{Code: 3, Message: errMsg}
			}
			return tr.Send(r)
		}
	}
	_ = c.send(ClusterType, "", "", nil, nil, nil, "")
	_ = c.send(ListenerType, "", "", nil, nil, nil, "")
	go c.run(func() error { return c.recv(cfg.Delta) })
	return c
}

func (c *Client) run(loop func() error) {
	err := loop()
	c.mu.Lock()
	c.err = err
	fn := c.notifyLocked()
	c.mu.Unlock()
	close(c.done)
	if fn != nil {
		fn()
	}
}

// Done is closed when the stream has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the stream ended (nil while it runs).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// notifyLocked wakes Wait and returns the Notify callback, for the caller to run once it
// has released c.mu.
func (c *Client) notifyLocked() func() {
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
	return c.onChange
}

// Notify has fn called after every response the client applies and once its stream has
// ended, in the client's reader (fn must not block), until the returned stop is called; one
// callback at a time. Unlike Wait it costs no goroutine, so a load generator can watch
// thousands of clients without waking a goroutine per response.
func (c *Client) Notify(fn func()) (stop func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onChange = fn
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.onChange = nil
	}
}

// recv reads responses until the stream ends.
func (c *Client) recv(delta bool) error {
	acked := map[string]string{} // last accepted SotW version per type, sent back on NACK
	for {
		b, err := c.tr.Recv()
		if err != nil {
			return err
		}
		if err := c.handle(b, delta, acked); err != nil {
			return err
		}
	}
}

func (c *Client) handle(b []byte, delta bool, acked map[string]string) error {
	r, items, removed, err := parseResponse(b, delta)
	if err != nil {
		return err
	}
	typ := r.TypeURL
	r.Count, r.Removed, r.Received = len(items), removed, time.Now()
	var names []string
	if !c.cfg.Thin || c.cfg.Reject != nil {
		names = make([]string, len(items))
		for i, it := range items {
			names[i] = string(it.name)
		}
		if !c.cfg.Thin {
			r.Names = names
		}
	}
	if c.cfg.Reject != nil {
		if msg := c.cfg.Reject(typ, names); msg != "" {
			r.Nacked = true
			c.record(r)
			if delta {
				return c.send(typ, r.Nonce, "", nil, nil, nil, msg)
			}
			return c.send(typ, r.Nonce, acked[typ], c.subscription(typ), nil, nil, msg)
		}
	}
	replaceAll := !delta && (typ == ClusterType || typ == ListenerType)
	follow := c.apply(typ, items, removed, replaceAll)
	c.mu.Lock()
	c.nonces[typ] = r.Nonce
	c.mu.Unlock()
	r.Acked = time.Now()
	if delta {
		err = c.send(typ, r.Nonce, "", nil, nil, nil, "")
	} else {
		acked[typ] = r.Version
		err = c.send(typ, r.Nonce, r.Version, c.subscription(typ), nil, nil, "")
	}
	if err != nil {
		return err
	}
	c.record(r)
	for _, fu := range follow {
		c.mu.Lock()
		nonce := c.nonces[fu.typ]
		c.mu.Unlock()
		if delta {
			err = c.send(fu.typ, "", "", nil, fu.sub, fu.unsub, "")
		} else {
			err = c.send(fu.typ, nonce, acked[fu.typ], fu.names, nil, nil, "")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *Client) record(r Response) {
	c.mu.Lock()
	switch {
	case !c.cfg.Thin:
		c.log = append(c.log, r)
	case !r.Nacked:
		c.lastAcks[r.TypeURL] = r.Acked
	}
	fn := c.notifyLocked()
	c.mu.Unlock()
	if fn != nil {
		fn()
	}
}

type followUp struct {
	typ        string
	names      []string // SotW: the full new subscription
	sub, unsub []string // delta
}

// apply stores resources and works out the EDS/RDS subscriptions that CDS/LDS imply. The
// EDS subscription follows each cluster as it changes: rebuilding it from every cluster on
// every response costs a client that holds thousands of clusters more than the server spends.
func (c *Client) apply(typ string, items []item, removed []string, replaceAll bool) []followUp {
	c.mu.Lock()
	defer c.mu.Unlock()
	store := c.resources[typ]
	if store == nil {
		store = map[string]*entry{}
		c.resources[typ] = store
	}
	c.gen++
	gen := c.gen
	var edsAdd, edsDrop []string // clusters that start or stop using EDS
	listenersChanged := false
	for _, it := range items {
		e := store[string(it.name)] // no allocation for the lookup
		if e == nil {
			e = &entry{}
			store[string(it.name)] = e
		}
		e.gen = gen
		switch typ {
		case ClusterType:
			_, e.eds = edsCluster(it.value)
			if followed := c.follows[EndpointType].names[string(it.name)]; e.eds && !followed {
				edsAdd = append(edsAdd, string(it.name))
			} else if !e.eds && followed {
				edsDrop = append(edsDrop, string(it.name))
			}
		case ListenerType:
			e.routes = routeNames(it.value)
			listenersChanged = true
		}
		// A thin client keeps the bytes of endpoints only (tests look into those).
		if !c.cfg.Thin || typ == EndpointType {
			e.raw = append(e.raw[:0:0], it.value...)
		}
	}
	var dropped []string // resources the server removed
	for _, n := range removed {
		if _, ok := store[n]; ok {
			delete(store, n)
			dropped = append(dropped, n)
		}
	}
	if replaceAll {
		for n, e := range store {
			if e.gen != gen {
				delete(store, n)
				dropped = append(dropped, n)
			}
		}
	}
	switch {
	case typ == ClusterType && !c.cfg.SkipEDS:
		return c.follow(EndpointType, edsAdd, append(edsDrop, dropped...))
	case typ == ListenerType && (listenersChanged || len(dropped) > 0):
		// Listeners are few: the RDS subscription is recomputed from all of them.
		want := map[string]bool{}
		for _, e := range store {
			for _, rn := range e.routes {
				want[rn] = true
			}
		}
		var add, stale []string
		for rn := range want {
			add = append(add, rn)
		}
		for rn := range c.follows[RouteType].names {
			if !want[rn] {
				stale = append(stale, rn)
			}
		}
		return c.follow(RouteType, add, stale)
	}
	return nil
}

// follow adds names to and drops names from a derived subscription and returns the request
// that changes it, if it changed (caller holds c.mu).
func (c *Client) follow(typ string, add, drop []string) []followUp {
	f := c.follows[typ]
	var sub, unsub []string
	for _, n := range add {
		if !f.names[n] {
			f.names[n] = true
			sub = append(sub, n)
		}
	}
	for _, n := range drop {
		if f.names[n] {
			delete(f.names, n)
			delete(c.resources[typ], n)
			unsub = append(unsub, n)
		}
	}
	if len(sub) == 0 && len(unsub) == 0 {
		return nil
	}
	f.sorted = nil
	fu := followUp{typ: typ}
	if c.cfg.Delta {
		sort.Strings(sub)
		sort.Strings(unsub)
		fu.sub, fu.unsub = sub, unsub
	} else {
		fu.names = f.list()
	}
	return []followUp{fu}
}

func (c *Client) subscription(typ string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.follows[typ]; f != nil {
		return f.list()
	}
	return nil
}

// edsCluster reports a cluster's name and whether it uses EDS (type, field 2, is EDS),
// reading the wire without decoding the cluster.
func edsCluster(b []byte) ([]byte, bool) {
	var name []byte
	eds := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return name, eds
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return name, eds
			}
			name, n = v, m
		case num == 2 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return name, eds
			}
			eds, n = cluster.Cluster_DiscoveryType(v) == cluster.Cluster_EDS, m
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return name, eds
			}
		}
		b = b[n:]
	}
	return name, eds
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

// Resource unmarshals a held resource into m; false when the client does not hold it (or,
// thin, kept no bytes of it).
func (c *Client) Resource(typ, name string, m proto.Message) bool {
	c.mu.Lock()
	var raw []byte
	if e := c.resources[typ][name]; e != nil {
		raw = e.raw // apply replaces, never mutates, the bytes
	}
	c.mu.Unlock()
	return raw != nil && proto.Unmarshal(raw, m) == nil
}

// Raw returns the bytes kept of a resource (nil when none); callers must not modify them.
func (c *Client) Raw(typ, name string) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.resources[typ][name]; e != nil {
		return e.raw
	}
	return nil
}

// Responses returns every response received so far (none for a thin client).
func (c *Client) Responses() []Response {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Response(nil), c.log...)
}

// Wait blocks until cond holds (checked after every response) or ctx ends.
func (c *Client) Wait(ctx context.Context, cond func(*Client) bool) error {
	for {
		c.mu.Lock()
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
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
func (c *Client) Subscribed(typ string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.follows[typ]; f != nil {
		return len(f.names)
	}
	return 0
}

// LastAck is when the client last ACKed a response of typ (zero if never).
func (c *Client) LastAck(typ string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg.Thin {
		return c.lastAcks[typ]
	}
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
	clear(c.lastAcks)
}

// item is one resource of a response: its name and its encoded message (Any.value).
type item struct {
	name  []byte
	value []byte
}

// parseResponse reads a DiscoveryResponse or DeltaDiscoveryResponse from the wire. The
// returned slices alias b.
func parseResponse(b []byte, delta bool) (Response, []item, []string, error) {
	var r Response
	var items []item
	var removed []string
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return r, nil, nil, protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return r, nil, nil, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return r, nil, nil, protowire.ParseError(n)
		}
		b = b[n:]
		switch num {
		case 1:
			r.Version = string(v)
		case 2:
			it, err := parseResource(v, delta)
			if err != nil {
				return r, nil, nil, err
			}
			items = append(items, it)
		case 4:
			r.TypeURL = typeURL(v)
		case 5:
			r.Nonce = string(v)
		case 6:
			if delta {
				removed = append(removed, string(v))
			}
		}
	}
	return r, items, removed, nil
}

// typeURL returns the followed types' constants without allocating (map lookups keyed by
// them then compare equal pointers), other types as new strings.
func typeURL(b []byte) string {
	switch string(b) {
	case ClusterType:
		return ClusterType
	case EndpointType:
		return EndpointType
	case ListenerType:
		return ListenerType
	case RouteType:
		return RouteType
	}
	return string(b)
}

// parseResource reads an Any (SotW) or a Resource holding an Any (delta).
func parseResource(b []byte, delta bool) (item, error) {
	var it item
	var anyBytes []byte
	if delta {
		fields, err := bytesFields(b)
		if err != nil {
			return it, err
		}
		it.name, anyBytes = fields[3], fields[2]
	} else {
		anyBytes = b
	}
	fields, err := bytesFields(anyBytes)
	if err != nil {
		return it, err
	}
	it.value = fields[2]
	if it.name == nil {
		name, err := nameOf(it.value)
		if err != nil {
			return it, err
		}
		it.name = name
	}
	return it, nil
}

// bytesFields returns the length-delimited fields 1-3 of a message.
func bytesFields(b []byte) ([4][]byte, error) {
	var out [4][]byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return out, protowire.ParseError(n)
		}
		b = b[n:]
		if typ == protowire.BytesType && num >= 1 && num <= 3 {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return out, protowire.ParseError(m)
			}
			out[num] = v
			b = b[m:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return out, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return out, nil
}

// nameOf reads field 1 (name / cluster_name) of Cluster, Listener, RouteConfiguration and
// ClusterLoadAssignment without decoding the rest.
func nameOf(b []byte) ([]byte, error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			return v, nil
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil, errors.New("resource without a name")
}
