// Package xdsclient is meshproxy's ADS client: one gRPC stream to the management server,
// State of the World (AggregatedDiscoveryService.StreamAggregatedResources) or Delta
// (DeltaAggregatedResources), requesting resources in Envoy's order (CDS, then EDS for the
// clusters, then LDS, then RDS and ECDS for the listeners), ACKing and NACKing each
// response with its nonce (a NACK carries an error_detail naming each rejected resource
// and the reason), and reconnecting with jittered exponential back-off while the proxy
// keeps serving its last accepted configuration.
package xdsclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"
)

// Type URLs in Envoy's request order.
var (
	CDS  = resourcev3.ClusterType
	EDS  = resourcev3.EndpointType
	LDS  = resourcev3.ListenerType
	RDS  = resourcev3.RouteType
	ECDS = resourcev3.ExtensionConfigType
)

// order is the order in which (re)subscriptions are sent.
var order = []string{CDS, EDS, LDS, RDS, ECDS}

// wildcard types are subscribed to without names and are full-state in SotW.
func wildcard(t string) bool { return t == CDS || t == LDS }

// Update is one response's resources, handed to the Handler.
type Update struct {
	TypeURL string
	Version string
	// Resources by name (new or changed).
	Resources map[string]*anypb.Any
	// Removed names (Delta's removed_resources).
	Removed []string
	// FullState: Resources is the complete set of the type (SotW CDS and LDS), so anything
	// not in it is removed.
	FullState bool
}

// ResourceError is a rejected resource.
type ResourceError struct {
	Name string
	Err  error
}

// Handler applies updates and reports which names to subscribe to.
type Handler interface {
	// Apply applies what it can of u and returns the resources it rejected; those keep
	// their previous version.
	Apply(u Update) []ResourceError
	// Names returns the resource names the proxy needs of a non-wildcard type.
	Names(typeURL string) []string
}

// Config configures a client.
type Config struct {
	Conn  grpc.ClientConnInterface
	Node  *corev3.Node
	Delta bool
	Log   *slog.Logger
	// Backoff bounds; zero means Envoy's defaults (DefaultBackoffBase, DefaultBackoffMax).
	BackoffBase, BackoffMax time.Duration
	// OnEvent, if set, is told about stream events ("connected", "disconnected",
	// "ack <type>", "nack <type>") for stats and tests.
	OnEvent func(event, typeURL string)
}

// Client is an ADS client.
type Client struct {
	cfg Config
	h   Handler

	mu      sync.Mutex
	state   map[string]*typeState
	wake    chan struct{}
	ldsSent bool
	cdsDone bool
}

// typeState is what the client remembers of one type across streams.
type typeState struct {
	version    string            // last accepted (SotW)
	nonce      string            // last received on the current stream
	names      []string          // last requested names (non-wildcard)
	versions   map[string]string // delta: accepted version per resource
	subscribed bool              // requested on the current stream
}

// Envoy's reconnect back-off of xDS streams when the bootstrap sets none.
const (
	DefaultBackoffBase = 500 * time.Millisecond
	DefaultBackoffMax  = 30 * time.Second
)

// New returns a client.
func New(cfg Config, h Handler) *Client {
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	c := &Client{cfg: cfg, h: h, state: map[string]*typeState{}, wake: make(chan struct{}, 1)}
	for _, t := range order {
		c.state[t] = &typeState{versions: map[string]string{}}
	}
	return c
}

// Resubscribe asks the client to re-check Handler.Names and send new requests where the
// names changed (call after the proxy's clusters or listeners changed outside a response).
func (c *Client) Resubscribe() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Client) event(e, t string) {
	if c.cfg.OnEvent != nil {
		c.cfg.OnEvent(e, t)
	}
}

// Run keeps a stream open until ctx ends, reconnecting with back-off.
func (c *Client) Run(ctx context.Context) {
	backoff := c.cfg.BackoffBase
	for ctx.Err() == nil {
		start := time.Now()
		err := c.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		c.event("disconnected", "")
		c.cfg.Log.Warn("xDS stream closed, reconnecting", "err", err, "backoff", backoff)
		if time.Since(start) > c.cfg.BackoffMax {
			backoff = c.cfg.BackoffBase
		}
		// Full jitter, as Envoy's JitteredExponentialBackOffStrategy.
		wait := time.Duration(rand.Int64N(int64(backoff)) + 1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		backoff = min(backoff*2, c.cfg.BackoffMax)
	}
}

// sender abstracts the SotW and Delta streams.
type sender interface {
	send(t string, ts *typeState, names []string, nack error, ack bool) error
	recv() (*received, error)
}

type received struct {
	typeURL   string
	version   string
	nonce     string
	resources map[string]*anypb.Any
	versions  map[string]string
	removed   []string
}

func (c *Client) stream(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := discoveryv3.NewAggregatedDiscoveryServiceClient(c.cfg.Conn)
	var s sender
	if c.cfg.Delta {
		st, err := client.DeltaAggregatedResources(ctx)
		if err != nil {
			return err
		}
		s = &deltaSender{st: st, node: c.cfg.Node}
	} else {
		st, err := client.StreamAggregatedResources(ctx)
		if err != nil {
			return err
		}
		s = &sotwSender{st: st, node: c.cfg.Node}
	}
	c.mu.Lock()
	for _, ts := range c.state {
		ts.nonce, ts.subscribed = "", false
	}
	c.ldsSent = false
	c.mu.Unlock()
	c.event("connected", "")

	var sendMu sync.Mutex
	// Start with CDS; on a first stream the rest follows as responses arrive. On a
	// reconnect every type the proxy was subscribed to is requested again at once, in
	// Envoy's order, as Envoy's mux does when its stream is re-established: the server
	// may have nothing new to say about the clusters, and waiting for a CDS response
	// would leave EDS, LDS and RDS unsubscribed.
	if err := c.subscribe(s, &sendMu, CDS); err != nil {
		return err
	}
	if err := c.resubscribeAll(s, &sendMu); err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	responses := make(chan *received)
	go func() {
		for {
			r, err := s.recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case responses <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return err
		case <-c.wake:
			if err := c.resubscribeAll(s, &sendMu); err != nil {
				return err
			}
		case r := <-responses:
			if err := c.handle(s, &sendMu, r); err != nil {
				return err
			}
		}
	}
}

// subscribe sends the first request of a type on this stream.
func (c *Client) subscribe(s sender, mu *sync.Mutex, t string) error {
	c.mu.Lock()
	ts := c.state[t]
	var names []string
	if !wildcard(t) {
		names = c.h.Names(t)
	}
	ts.subscribed = true
	ts.names = names
	c.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	return s.send(t, ts, names, nil, false)
}

// resubscribeAll sends requests for types whose wanted names changed, in Envoy's order,
// and the first LDS request once CDS completed.
func (c *Client) resubscribeAll(s sender, mu *sync.Mutex) error {
	for _, t := range order {
		if wildcard(t) {
			c.mu.Lock()
			need := t == LDS && c.cdsDone && !c.state[LDS].subscribed && c.initialClustersWarm()
			c.mu.Unlock()
			if need {
				if err := c.subscribe(s, mu, t); err != nil {
					return err
				}
			}
			continue
		}
		names := c.h.Names(t)
		c.mu.Lock()
		ts := c.state[t]
		changed := !slices.Equal(names, ts.names) || (!ts.subscribed && len(names) > 0)
		if changed {
			ts.names = names
			ts.subscribed = true
		}
		c.mu.Unlock()
		if changed {
			mu.Lock()
			err := s.send(t, ts, names, nil, false)
			mu.Unlock()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// initialClustersWarm reports whether EDS has been answered for the clusters (Envoy
// sends LDS once the initial clusters are warm); c.mu must be held.
func (c *Client) initialClustersWarm() bool {
	eds := c.state[EDS]
	return len(eds.names) == 0 || eds.version != "" || len(eds.versions) > 0
}

func (c *Client) handle(s sender, mu *sync.Mutex, r *received) error {
	u := Update{TypeURL: r.typeURL, Version: r.version, Resources: r.resources, Removed: r.removed,
		FullState: !c.cfg.Delta && wildcard(r.typeURL)}
	rejected := c.h.Apply(u)
	c.mu.Lock()
	ts := c.state[r.typeURL]
	if ts == nil {
		ts = &typeState{versions: map[string]string{}}
		c.state[r.typeURL] = ts
	}
	ts.nonce = r.nonce
	var nack error
	if len(rejected) > 0 {
		sort.Slice(rejected, func(i, j int) bool { return rejected[i].Name < rejected[j].Name })
		msg := ""
		for i, e := range rejected {
			if i > 0 {
				msg += "\n"
			}
			msg += fmt.Sprintf("%s: %v", e.Name, e.Err)
		}
		nack = errors.New(msg)
	} else {
		ts.version = r.version
	}
	bad := map[string]bool{}
	for _, e := range rejected {
		bad[e.Name] = true
	}
	for n, v := range r.versions {
		if !bad[n] {
			ts.versions[n] = v
		}
	}
	for _, n := range r.removed {
		delete(ts.versions, n)
	}
	if r.typeURL == CDS {
		c.cdsDone = true
	}
	names := ts.names
	c.mu.Unlock()
	mu.Lock()
	err := s.send(r.typeURL, ts, names, nack, true)
	mu.Unlock()
	if err != nil {
		return err
	}
	if nack != nil {
		c.event("nack", r.typeURL)
		c.cfg.Log.Warn("xDS update rejected", "type", r.typeURL, "version", r.version, "error", nack)
	} else {
		c.event("ack", r.typeURL)
	}
	return c.resubscribeAll(s, mu)
}

// nackStatus is the error_detail of a NACK.
func nackStatus(err error) *status.Status {
	if err == nil {
		return nil
	}
	return &status.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
}

type sotwSender struct {
	st   discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node *corev3.Node
}

func (s *sotwSender) send(t string, ts *typeState, names []string, nack error, _ bool) error {
	return s.st.Send(&discoveryv3.DiscoveryRequest{
		Node: s.node, TypeUrl: t, ResourceNames: names, VersionInfo: ts.version,
		ResponseNonce: ts.nonce, ErrorDetail: nackStatus(nack),
	})
}

func (s *sotwSender) recv() (*received, error) {
	resp, err := s.st.Recv()
	if err != nil {
		return nil, err
	}
	r := &received{typeURL: resp.GetTypeUrl(), version: resp.GetVersionInfo(), nonce: resp.GetNonce(),
		resources: map[string]*anypb.Any{}}
	for _, a := range resp.GetResources() {
		name, err := ResourceName(a)
		if err != nil {
			name = fmt.Sprintf("<undecodable %s>", a.GetTypeUrl())
		}
		r.resources[name] = a
	}
	return r, nil
}

type deltaSender struct {
	st   discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	node *corev3.Node
	sub  map[string][]string // names subscribed on this stream, per type
}

func (s *deltaSender) send(t string, ts *typeState, names []string, nack error, ack bool) error {
	if s.sub == nil {
		s.sub = map[string][]string{}
	}
	req := &discoveryv3.DeltaDiscoveryRequest{Node: s.node, TypeUrl: t, ErrorDetail: nackStatus(nack)}
	if ack {
		req.ResponseNonce = ts.nonce
	}
	if !ack {
		prev, had := s.sub[t]
		if !had {
			req.InitialResourceVersions = map[string]string{}
			for n, v := range ts.versions {
				req.InitialResourceVersions[n] = v
			}
		}
		if !wildcard(t) {
			old := map[string]bool{}
			for _, n := range prev {
				old[n] = true
			}
			now := map[string]bool{}
			for _, n := range names {
				now[n] = true
				if !old[n] {
					req.ResourceNamesSubscribe = append(req.ResourceNamesSubscribe, n)
				}
			}
			for _, n := range prev {
				if !now[n] {
					req.ResourceNamesUnsubscribe = append(req.ResourceNamesUnsubscribe, n)
				}
			}
		}
		s.sub[t] = names
	}
	return s.st.Send(req)
}

func (s *deltaSender) recv() (*received, error) {
	resp, err := s.st.Recv()
	if err != nil {
		return nil, err
	}
	r := &received{typeURL: resp.GetTypeUrl(), version: resp.GetSystemVersionInfo(), nonce: resp.GetNonce(),
		resources: map[string]*anypb.Any{}, versions: map[string]string{}, removed: resp.GetRemovedResources()}
	for _, res := range resp.GetResources() {
		name := res.GetName()
		if name == "" {
			name, _ = ResourceName(res.GetResource())
		}
		r.resources[name] = res.GetResource()
		r.versions[name] = res.GetVersion()
	}
	if r.version == "" && len(r.versions) > 0 {
		r.version = "delta"
	}
	return r, nil
}
