package proxytest

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strconv"
	"sync"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/agent/healthreport"
)

// The xDS types Discovery serves.
const (
	clusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	listenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
)

// Discovery stands where discovery is in the agent's tests: an ADS server (State of the
// World and Delta) that gives every proxy connected to it the listeners a test asks for,
// and records the health reports the agent sends on its own stream. It answers no proxy
// until Configure is first called, so a proxy waits for its first configuration
// (INITIALIZING) until the test says otherwise.
type Discovery struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	addr string

	mu      sync.Mutex
	config  *Config
	version int
	holding bool
	streams map[*adsStream]bool
	reports []string // "" for healthy
	node    string
	callers []Caller
}

// Config is what discovery gives the proxies.
type Config struct {
	// Inbound and Outbound are the addresses (host:port) of listeners whose traffic
	// direction is INBOUND and OUTBOUND.
	Inbound, Outbound []string
	// Upstream is the application every listener routes to (host:port); without it the
	// listeners answer 200 themselves.
	Upstream string
}

// StartDiscovery serves a Discovery on a free loopback port until the test ends.
func StartDiscovery(t testing.TB) *Discovery {
	t.Helper()
	return startDiscovery(t)
}

// StartSecureDiscovery serves a Discovery over TLS as discovery's port 15012 does: cert is
// its serving certificate, clients may present a certificate of clientRoots, and every
// stream's bearer token and client certificate identity are recorded (Callers).
func StartSecureDiscovery(t testing.TB, cert tls.Certificate, clientRoots *x509.CertPool) *Discovery {
	t.Helper()
	var d *Discovery
	record := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		var c Caller
		md, _ := metadata.FromIncomingContext(ss.Context())
		if v := md.Get("authorization"); len(v) > 0 {
			c.Authorization = v[0]
		}
		if p, ok := peer.FromContext(ss.Context()); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 && len(ti.State.PeerCertificates[0].URIs) > 0 {
				c.Identity = ti.State.PeerCertificates[0].URIs[0].String()
			}
		}
		d.mu.Lock()
		d.callers = append(d.callers, c)
		d.mu.Unlock()
		return handler(srv, ss)
	}
	d = startDiscovery(t, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert},
		ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: clientRoots})), grpc.StreamInterceptor(record))
	return d
}

func startDiscovery(t testing.TB, opts ...grpc.ServerOption) *Discovery {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &Discovery{addr: l.Addr().String(), streams: map[*adsStream]bool{}}
	srv := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, d)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return d
}

// Caller is who opened a stream to a secure Discovery.
type Caller struct {
	// Authorization is the stream's authorization header ("Bearer <token>").
	Authorization string
	// Identity is the client certificate's URI SAN ("" without a certificate).
	Identity string
}

// Callers is every stream's caller so far, in order.
func (d *Discovery) Callers() []Caller {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Caller(nil), d.callers...)
}

// Addr is the discovery address (ProxyConfig discoveryAddress).
func (d *Discovery) Addr() string { return d.addr }

// Configure sets the configuration and sends it to every proxy (the first call ends
// their wait for a first configuration).
func (d *Discovery) Configure(c Config) {
	d.mu.Lock()
	d.config = &c
	d.version++
	var streams []*adsStream
	for s := range d.streams {
		if !s.held {
			streams = append(streams, s)
		}
	}
	d.mu.Unlock()
	for _, s := range streams {
		d.push(s)
	}
}

// HoldNewStreams leaves the proxies that connect from now on (a new hot-restart epoch)
// without an answer until Release: they stay INITIALIZING, as a proxy whose discovery is
// slow to answer.
func (d *Discovery) HoldNewStreams() {
	d.mu.Lock()
	d.holding = true
	d.mu.Unlock()
}

// Release answers the streams HoldNewStreams held, and new ones again at once.
func (d *Discovery) Release() {
	d.mu.Lock()
	d.holding = false
	var held []*adsStream
	for s := range d.streams {
		if s.held {
			s.held = false
			held = append(held, s)
		}
	}
	d.mu.Unlock()
	for _, s := range held {
		d.push(s)
	}
}

// Reports returns the health reports received so far, in order ("" for healthy, else
// the reason), and the node id of the last one.
func (d *Discovery) Reports() ([]string, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.reports...), d.node
}

// LastReport returns the last health report ("<none>" before the first) and how many
// arrived.
func (d *Discovery) LastReport() (string, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.reports) == 0 {
		return "<none>", 0
	}
	return d.reports[len(d.reports)-1], len(d.reports)
}

// adsStream is one proxy's stream. Sends are serialized by mu and always carry the
// configuration current when they are made, so a late send never undoes a newer one.
type adsStream struct {
	mu    sync.Mutex
	delta bool
	sotw  discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer
	dlt   discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	nonce int
	sent  map[string][]string // delta: names sent, per type

	// Guarded by Discovery.mu.
	subscribed map[string]bool
	held       bool
}

func (d *Discovery) open(s *adsStream) func() {
	s.subscribed, s.sent = map[string]bool{}, map[string][]string{}
	d.mu.Lock()
	s.held = d.holding
	d.streams[s] = true
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		delete(d.streams, s)
		d.mu.Unlock()
	}
}

// request handles a request: a health report is recorded; a first request for clusters
// or listeners (no response nonce: not an ACK or NACK) subscribes and is answered.
func (d *Discovery) request(s *adsStream, typeURL, nonce string, node *corev3.Node, detail string) {
	switch {
	case typeURL == healthreport.TypeURL:
		d.mu.Lock()
		d.reports = append(d.reports, detail)
		if node.GetId() != "" {
			d.node = node.GetId()
		}
		d.mu.Unlock()
	case (typeURL == clusterType || typeURL == listenerType) && nonce == "":
		d.mu.Lock()
		s.subscribed[typeURL] = true
		d.mu.Unlock()
		d.push(s)
	}
}

// StreamAggregatedResources implements State of the World ADS.
func (d *Discovery) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return d.serve(&adsStream{sotw: st}, func() (string, string, *corev3.Node, string, error) {
		req, err := st.Recv()
		return req.GetTypeUrl(), req.GetResponseNonce(), req.GetNode(), req.GetErrorDetail().GetMessage(), err
	})
}

// DeltaAggregatedResources implements Delta ADS (wildcard subscriptions).
func (d *Discovery) DeltaAggregatedResources(st discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return d.serve(&adsStream{delta: true, dlt: st}, func() (string, string, *corev3.Node, string, error) {
		req, err := st.Recv()
		return req.GetTypeUrl(), req.GetResponseNonce(), req.GetNode(), req.GetErrorDetail().GetMessage(), err
	})
}

// serve handles a stream's requests (type, response nonce, node, error detail) until it
// ends.
func (d *Discovery) serve(s *adsStream, recv func() (string, string, *corev3.Node, string, error)) error {
	defer d.open(s)()
	for {
		typeURL, nonce, node, detail, err := recv()
		if err != nil {
			return nil
		}
		d.request(s, typeURL, nonce, node, detail)
	}
}

// push sends the current configuration of every type s subscribed to, clusters first
// (Envoy's order), unless there is none yet or s is held.
func (d *Discovery) push(s *adsStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d.mu.Lock()
	cfg, version, held := d.config, strconv.Itoa(d.version), s.held
	var types []string
	for _, t := range []string{clusterType, listenerType} {
		if s.subscribed[t] {
			types = append(types, t)
		}
	}
	d.mu.Unlock()
	if cfg == nil || held {
		return
	}
	for _, t := range types {
		names, resources := cfg.resources(t)
		s.nonce++
		if err := s.send(t, version, strconv.Itoa(s.nonce), names, resources); err != nil {
			return
		}
	}
}

// send writes one response; s.mu is held.
func (s *adsStream) send(typeURL, version, nonce string, names []string, resources []*anypb.Any) error {
	if !s.delta {
		return s.sotw.Send(&discoveryv3.DiscoveryResponse{TypeUrl: typeURL, VersionInfo: version, Nonce: nonce, Resources: resources})
	}
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, SystemVersionInfo: version, Nonce: nonce}
	now := map[string]bool{}
	for i, n := range names {
		now[n] = true
		resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: n, Version: version, Resource: resources[i]})
	}
	for _, n := range s.sent[typeURL] {
		if !now[n] {
			resp.RemovedResources = append(resp.RemovedResources, n)
		}
	}
	s.sent[typeURL] = names
	return s.dlt.Send(resp)
}

// resources builds the configuration's resources of a type, with their names.
func (c *Config) resources(typeURL string) ([]string, []*anypb.Any) {
	var names []string
	var out []*anypb.Any
	add := func(name string, m proto.Message) {
		a, err := anypb.New(m)
		if err != nil {
			panic(err) // the messages are built here, always marshalable
		}
		names, out = append(names, name), append(out, a)
	}
	switch typeURL {
	case clusterType:
		if c.Upstream != "" {
			add(upstreamCluster, cluster(c.Upstream))
		}
	case listenerType:
		for _, a := range c.Inbound {
			add("inbound_"+a, c.listener("inbound_"+a, a, corev3.TrafficDirection_INBOUND))
		}
		for _, a := range c.Outbound {
			add("outbound_"+a, c.listener("outbound_"+a, a, corev3.TrafficDirection_OUTBOUND))
		}
	}
	return names, out
}

const upstreamCluster = "app"

func socketAddress(hostPort string) *corev3.Address {
	host, port, _ := net.SplitHostPort(hostPort)
	p, _ := strconv.Atoi(port)
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)}}}}
}

func cluster(upstream string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 upstreamCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: upstreamCluster, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{
				Endpoint: &endpointv3.Endpoint{Address: socketAddress(upstream)}}}},
		}}},
	}
}

// listener is an HTTP listener on addr whose one route goes to the upstream, or answers
// 200 itself without one.
func (c *Config) listener(name, addr string, dir corev3.TrafficDirection) *listenerv3.Listener {
	rt := &routev3.Route{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}}
	if c.Upstream != "" {
		rt.Action = &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: upstreamCluster}}}
	} else {
		rt.Action = &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 200}}
	}
	router, _ := anypb.New(&routerv3.Router{})
	hcm, _ := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix: name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: name, VirtualHosts: []*routev3.VirtualHost{{Name: name, Domains: []string{"*"}, Routes: []*routev3.Route{rt}}},
		}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	return &listenerv3.Listener{
		Name: name, Address: socketAddress(addr), TrafficDirection: dir,
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm}}}}},
	}
}
