// Package server is the xDS server, how config is sent: ADS over gRPC in both State of the
// World and Delta variants, with per-connection ACK/NACK tracking, a bounded push queue
// (PILOT_PUSH_THROTTLE), a per-connection send timeout and admission control for new
// connections. What to send comes from a Generator (package pusher): the server registers
// each connection with it, is handed the pushes that concern it, and asks it for resources.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/pusher"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// Options tune the server; Defaults gives istiod's values.
type Options struct {
	// PushThrottle bounds concurrent pushes (PILOT_PUSH_THROTTLE).
	PushThrottle int
	// SendTimeout closes a connection whose send does not complete in time
	// (PILOT_XDS_SEND_TIMEOUT, 5 s).
	SendTimeout time.Duration
	// ConnectInFlight admits new connections by the server's capacity: at most this many
	// at a time between admission and the sending of their initial clusters and
	// listeners; the others wait, stream open, first come first served. 0 derives the
	// bound from PushThrottle (the pushes the server runs at once); a negative value turns
	// it off.
	ConnectInFlight int
	// ConnectQueue bounds how many connections wait for admission; past it a new one is
	// refused at once with RESOURCE_EXHAUSTED (0: no bound).
	ConnectQueue int
	// ConnectRate and ConnectBurst optionally cap new connections with a token bucket
	// (PILOT_MAX_REQUESTS_PER_SECOND; 0, the default, is no cap: the capacity gate above
	// paces a storm by what the server gets done instead of by the clock).
	ConnectRate  float64
	ConnectBurst int
	// ConnectWait bounds a connection's wait for admission (the rate cap and the capacity
	// gate together); past it the connection is refused with RESOURCE_EXHAUSTED and
	// retries with its own backoff. 0: no bound.
	ConnectWait time.Duration
	// ReconnectWindow: a proxy that resumes with config it already had, in the first
	// minute after start (discovery restarted under it), gets no updates for this long after
	// it reconnects. The registry is being rebuilt from the proxies coming back, so an early
	// update would lack the endpoints of those not back yet; on its last config the proxy
	// keeps serving. Fresh proxies, and proxies resuming later (a network blip), are served
	// at once.
	ReconnectWindow time.Duration
}

// Defaults returns istiod's defaults.
func Defaults() Options {
	return Options{
		PushThrottle: 100,
		SendTimeout:  5 * time.Second,
		ConnectQueue: 10000,
		ConnectWait:  30 * time.Second,

		ReconnectWindow: 10 * time.Second,
	}
}

// Generator is what the server needs of the side that decides what to send (package
// pusher, through Pushes); the server's tests give it a fake.
type Generator interface {
	// Ready reports whether there is a snapshot to serve.
	Ready() bool
	// Watch registers a connection's proxy; the pushes that concern it go to target.
	Watch(p *model.Proxy, target pusher.Watcher) ProxyWatch
	// Current is a push bringing a connection up to the snapshot in force.
	Current(reason string) *pusher.Event
}

// ProxyWatch is one connection's proxy as the Generator knows it (pusher.Proxy): what it
// watches and the resources it gets.
type ProxyWatch interface {
	Subscribe(typ string, wildcard bool, names []string)
	Change(typ string, add, remove []string)
	Watches(typ, name string) bool
	Names(typ string) map[string]struct{}
	Subscribed(typ string) int
	SameNames(typ string, names []string) bool
	// Resources is what the proxy gets of typ from snap (nil: the snapshot in force), with
	// the snapshot's version.
	Resources(typ string, snap *xds.Snapshot) (*xds.Resources, string)
	Close()
}

// Pushes is the Generator of a pusher.
func Pushes(p *pusher.Pusher) Generator { return pushes{p} }

type pushes struct{ *pusher.Pusher }

func (g pushes) Watch(p *model.Proxy, target pusher.Watcher) ProxyWatch {
	return g.Pusher.Watch(p, target)
}

// Registrar registers the workloads of the proxies that connect (registry.AutoRegistration).
type Registrar interface {
	Connect(w *model.Workload, startUnhealthy bool)
	Disconnect(w *model.Workload)
	SetHealth(namespace, name string, healthy bool, reason string)
}

// Deps are what the server serves from.
type Deps struct {
	Generator Generator
	// AutoRegistration, when set, registers proxies with workload metadata.
	AutoRegistration Registrar
}

// Server serves ADS. Create with New, then Run; Serve accepts connections.
type Server struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer

	log     *slog.Logger
	metrics *metrics.Metrics
	opts    Options
	deps    Deps

	queue    *pushQueue
	admitter *tokenBucket
	gate     *capacityGate // nil: no capacity admission

	connSeq  atomic.Uint64
	nonceSeq atomic.Uint64
	// BytesSent counts marshalled resource bytes sent, for benchmarks and debug output.
	bytesSent atomic.Uint64

	mu    sync.RWMutex
	conns map[string]*Connection

	// started is when Run began; resuming proxies are held only shortly after it.
	started atomic.Pointer[time.Time]

	// stop is closed when Run's context ends: connection loops and blocked updates return.
	stop     chan struct{}
	stopOnce sync.Once
}

// New returns a server serving what deps.Generator generates.
func New(log *slog.Logger, m *metrics.Metrics, opts Options, deps Deps) *Server {
	if opts.PushThrottle <= 0 {
		opts.PushThrottle = 1
	}
	s := &Server{
		log: log.With("scope", "ads"), metrics: m, opts: opts, deps: deps,
		conns: map[string]*Connection{},
		stop:  make(chan struct{}),
	}
	s.queue = newPushQueue()
	s.admitter = newTokenBucket(opts.ConnectRate, max(opts.ConnectBurst, 1))
	switch {
	case opts.ConnectInFlight > 0:
		s.gate = newCapacityGate(opts.ConnectInFlight, opts.ConnectQueue)
	case opts.ConnectInFlight == 0:
		s.gate = newCapacityGate(opts.PushThrottle, opts.ConnectQueue)
	}
	return s
}

// Ready reports whether there is a snapshot to serve.
func (s *Server) Ready() bool { return s.deps.Generator.Ready() }

// BytesSent is the total of resource bytes sent so far.
func (s *Server) BytesSent() uint64 { return s.bytesSent.Load() }

// Idle reports whether no connection waits for a push or is being pushed to.
func (s *Server) Idle() bool { return s.queue.Idle() }

// Queued is the number of connections waiting for a push.
func (s *Server) Queued() int { return s.queue.Len() }

// Run runs the push workers until ctx ends.
func (s *Server) Run(ctx context.Context) {
	now := time.Now()
	s.started.Store(&now)
	var wg sync.WaitGroup
	for i := 0; i < s.opts.PushThrottle; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.pushWorker()
		}()
	}
	<-ctx.Done()
	s.stopOnce.Do(func() { close(s.stop) })
	s.queue.Close()
	wg.Wait()
}

func (s *Server) pushWorker() {
	for {
		c, ev, ok := s.queue.Dequeue()
		if !ok {
			return
		}
		s.metrics.QueueTime.Observe(time.Since(ev.Queued()).Seconds())
		c.runPush(ev)
		s.queue.MarkDone(c)
	}
}

// Connections returns the connected proxies sorted by connection id.
func (s *Server) Connections() []*Connection {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Connection, 0, len(s.conns))
	for _, c := range s.conns {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Connection returns a connection of the proxy with the given node id, if connected.
func (s *Server) Connection(proxyID string) *Connection {
	for _, c := range s.Connections() {
		if c.Proxy.ID == proxyID {
			return c
		}
	}
	return nil
}

func (s *Server) addConnection(c *Connection) {
	c.gen = s.deps.Generator.Watch(c.Proxy, c)
	s.mu.Lock()
	s.conns[c.ID] = c
	n := len(s.conns)
	s.mu.Unlock()
	s.metrics.XDSClients.WithLabelValues(c.Proxy.IstioVersion).Inc()
	s.log.Info("proxy connected", "conn", c.ID, "delta", c.delta, "connections", n)
	if c.workload != nil && s.deps.AutoRegistration != nil {
		// A health-checked workload starts unhealthy until its agent reports, unless its
		// proxy resumes with config it already had (discovery restarted under it): it was
		// serving, and taking it out of every load balancer until its agent reconnects
		// would fail requests that were flowing.
		s.deps.AutoRegistration.Connect(c.workload, c.Proxy.HealthChecked && !c.resumed)
	}
}

func (s *Server) removeConnection(c *Connection) {
	s.mu.Lock()
	_, ok := s.conns[c.ID]
	delete(s.conns, c.ID)
	s.mu.Unlock()
	if !ok {
		return
	}
	s.metrics.XDSClients.WithLabelValues(c.Proxy.IstioVersion).Dec()
	s.log.Info("proxy disconnected", "conn", c.ID)
	if c.workload != nil && s.deps.AutoRegistration != nil {
		s.deps.AutoRegistration.Disconnect(c.workload)
	}
}

// GRPCServer returns a gRPC server with ADS registered and keepalives like istiod's.
func (s *Server) GRPCServer(extra ...grpc.ServerOption) *grpc.Server {
	g := grpc.NewServer(GRPCOptions(extra...)...)
	discovery.RegisterAggregatedDiscoveryServiceServer(g, s)
	return g
}

// GRPCOptions are the options of an xDS gRPC server (keepalives like istiod's, the xDS
// codec), then extra.
func GRPCOptions(extra ...grpc.ServerOption) []grpc.ServerOption {
	return append([]grpc.ServerOption{
		grpc.MaxConcurrentStreams(100000),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 15 * time.Second, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(4 << 20),
		// Thousands of mostly idle streams: return write buffers to a pool between writes
		// and keep read buffers small, so a connection costs little memory when quiet.
		grpc.SharedWriteBuffer(true),
		// Large responses go out in fewer, larger writes; the buffer is pooled, not per stream.
		grpc.WriteBufferSize(64 << 10),
		// Fixed windows turn off gRPC's bandwidth-delay probing, which costs a ping and its
		// answer per received message; proxies only send small requests.
		grpc.InitialWindowSize(1 << 20),
		grpc.InitialConnWindowSize(1 << 20),
		grpc.ForceServerCodecV2(xds.NewCodec()),
		grpc.ReadBufferSize(8 << 10),
	}, extra...)
}

// Serve serves g on lis until ctx ends, then stops gracefully: streams are told to finish
// and given up to grace before being cut. Connections get ProxyReadTimeout.
func Serve(ctx context.Context, g *grpc.Server, lis net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(readTimeoutListener{lis}) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(grace):
		g.Stop()
		<-stopped
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

func (s *Server) nextNonce() string {
	return fmt.Sprintf("%x", s.nonceSeq.Add(1))
}

// restartPeriod is how long after start a resuming proxy counts as coming back from a
// discovery restart (Envoy's reconnect back-off tops out at 30 s by default; the agent's
// bootstrap caps it at 5 s, so proxies are back well within ReconnectWindow).
const restartPeriod = time.Minute

// holdResumed returns until when a proxy resuming now is held (zero: not held).
func (s *Server) holdResumed() time.Time {
	started := s.started.Load()
	if s.opts.ReconnectWindow <= 0 || started == nil || time.Since(*started) > restartPeriod {
		return time.Time{}
	}
	return time.Now().Add(s.opts.ReconnectWindow)
}

// releaseHeld brings a held connection up to date when its hold ends.
func (s *Server) releaseHeld(c *Connection, until time.Time) {
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	select {
	case <-t.C:
		s.queue.Enqueue(c, s.deps.Generator.Current(push.ReasonReconnect))
	case <-c.stopped:
	case <-s.stop:
	}
}
