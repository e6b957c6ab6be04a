package xdsproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/wasmesh/wasmesh/agent/caclient"
	"github.com/wasmesh/wasmesh/agent/internal/testca"
)

const nodeID = "sidecar~10.0.0.1~p.ns~ns.svc.cluster.local"

// discovery is a real ADS server (go-control-plane's, State of the World and Delta, over a
// snapshot cache) behind a TLS listener that authenticates streams as discovery's 15012
// does: a bearer token it knows, and the client certificate, when one is sent, chaining
// to the mesh root.
type discovery struct {
	t     testing.TB
	ca    *testca.CA
	token string
	cache cachev3.SnapshotCache
	addr  string

	mu      sync.Mutex
	srv     *grpc.Server
	streams []seen
	open    int
	closed  chan struct{} // gets a value when a stream ends
}

// seen is what discovery saw of one stream's caller.
type seen struct {
	authorization string
	clientCert    *x509.Certificate
}

func startDiscovery(t testing.TB, ca *testca.CA, token string) *discovery {
	d := &discovery{t: t, ca: ca, token: token, closed: make(chan struct{}, 64),
		cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)}
	d.setConfig(1)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	d.addr = l.Addr().String()
	d.serve(l)
	t.Cleanup(d.stop)
	return d
}

func (d *discovery) serve(l net.Listener) {
	cert := d.ca.ServingCert(d.t)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: d.ca.Roots(),
	})), grpc.StreamInterceptor(d.authenticate))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, serverv3.NewServer(context.Background(), d.cache, nil))
	d.mu.Lock()
	d.srv = srv
	d.mu.Unlock()
	go srv.Serve(l)
}

func (d *discovery) stop() {
	d.mu.Lock()
	srv := d.srv
	d.mu.Unlock()
	srv.Stop()
}

// restart stops the server, ending every stream, and serves again on the same address.
func (d *discovery) restart() {
	d.stop()
	var l net.Listener
	require.Eventually(d.t, func() bool {
		var err error
		l, err = net.Listen("tcp", d.addr)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	d.serve(l)
}

func (d *discovery) authenticate(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	var s seen
	md, _ := metadata.FromIncomingContext(ss.Context())
	if v := md.Get("authorization"); len(v) > 0 {
		s.authorization = v[0]
	}
	if p, ok := peer.FromContext(ss.Context()); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			s.clientCert = ti.State.PeerCertificates[0]
		}
	}
	d.mu.Lock()
	d.streams = append(d.streams, s)
	d.mu.Unlock()
	if s.authorization != "Bearer "+d.token {
		return status.Error(codes.Unauthenticated, "unknown credential")
	}
	d.mu.Lock()
	d.open++
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.open--
		d.mu.Unlock()
		d.closed <- struct{}{}
	}()
	return handler(srv, ss)
}

func (d *discovery) seen() []seen {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]seen(nil), d.streams...)
}

func (d *discovery) openStreams() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.open
}

// setConfig gives the node one cluster and one listener, both named for version v.
func (d *discovery) setConfig(v int) { d.setConfigFor(nodeID, v) }

func (d *discovery) setConfigFor(id string, v int) {
	ver := strconv.Itoa(v)
	c := &clusterv3.Cluster{Name: "c" + ver, ConnectTimeout: durationpb.New(time.Second),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}}
	l := &listenerv3.Listener{Name: "l" + ver}
	snap, err := cachev3.NewSnapshot(ver, map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType: {c}, resourcev3.ListenerType: {l},
	})
	require.NoError(d.t, err)
	require.NoError(d.t, d.cache.SetSnapshot(context.Background(), id, snap))
}

// workload is what the agent has to reach discovery with.
type workload struct {
	token      string
	tokenFile  string
	cert       *tls.Certificate
	serverName string
	rootFile   string
}

func newWorkload(t testing.TB, ca *testca.CA) workload {
	chain, key := ca.Issue(t, "spiffe://cluster.local/ns/ns/sa/sa", time.Hour)
	cert, err := tls.X509KeyPair(chain, key)
	require.NoError(t, err)
	return workload{token: "pod-token", tokenFile: ca.Allow(t, "pod-token", "cluster.local", "ns", "sa"),
		cert: &cert, serverName: testca.ServerName, rootFile: ca.RootFile}
}

func (w workload) dialConfig(addr string) caclient.Config {
	return caclient.Config{Address: addr, RootFile: w.rootFile, ServerName: w.serverName, TokenFile: w.tokenFile,
		ClientCertificate: func() *tls.Certificate { return w.cert }}
}

// startProxy serves an XDS proxy to discovery at addr on a socket of the test's.
func startProxy(t testing.TB, w workload, addr string) (*Proxy, string) {
	p, err := New(Config{Address: addr, DialOptions: w.dialConfig(addr).DialOptions(), ConnectTimeout: 2 * time.Second})
	require.NoError(t, err)
	return p, serve(t, p)
}

// dialSocket connects as Envoy does to the xds-grpc pipe cluster: plaintext HTTP/2.
func dialSocket(t testing.TB, sock string) discoveryv3.AggregatedDiscoveryServiceClient {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
}

func errContains(t testing.TB, err error, code codes.Code, text string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code.String(), status.Code(err).String(), "status of %v", err)
	require.True(t, strings.Contains(err.Error(), text), "%q does not say %q", err.Error(), text)
}

func node() *corev3.Node { return &corev3.Node{Id: nodeID, Cluster: "app.ns"} }
