// Package server is the xDS server: ADS over gRPC in both State of the World and Delta
// variants, with per-connection ACK/NACK tracking, a bounded push queue
// (PILOT_PUSH_THROTTLE), a per-connection send timeout, admission control for new
// connections, and the glue that turns change requests into snapshots and pushes.
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
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// Options tune the server; Defaults gives istiod's values.
type Options struct {
	Debounce push.DebounceOptions
	// PushThrottle bounds concurrent pushes (PILOT_PUSH_THROTTLE).
	PushThrottle int
	// SendTimeout closes a connection whose send does not complete in time
	// (PILOT_XDS_SEND_TIMEOUT, 5 s).
	SendTimeout time.Duration
	// ConnectRate and ConnectBurst admit new connections through a token bucket
	// (PILOT_MAX_REQUESTS_PER_SECOND) so a restart does not meet a reconnect storm at once;
	// a connection waits up to ConnectWait for a token, then is refused with
	// RESOURCE_EXHAUSTED and retries with its own backoff.
	ConnectRate  float64
	ConnectBurst int
	ConnectWait  time.Duration
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
		Debounce:     push.DefaultDebounce(),
		PushThrottle: 100,
		SendTimeout:  5 * time.Second,
		ConnectRate:  100,
		ConnectBurst: 200,
		ConnectWait:  10 * time.Second,

		ReconnectWindow: 10 * time.Second,
	}
}

// ConfigStore lists the configs in force, sorted by key (config.CompareKeys).
type ConfigStore interface {
	List() []*config.Config
}

// Deps are the stores the server reads when it builds a snapshot.
type Deps struct {
	Registry registry.Registry
	Configs  ConfigStore
	Mesh     func() *meshconfig.MeshConfig
	// AutoRegistration, when set, registers proxies with workload metadata.
	AutoRegistration *registry.AutoRegistration
	// OnSnapshot, when set, sees every snapshot before it is used (discovery attaches the
	// reporting of configuration that could not be applied).
	OnSnapshot func(*push.Snapshot)
}

// PushStatus describes the latest push, for /debug/push_status.
type PushStatus struct {
	Version     string         `json:"version"`
	Full        bool           `json:"full"`
	Reasons     map[string]int `json:"reasons"`
	Start       time.Time      `json:"start"`
	BuiltAt     time.Time      `json:"builtAt"`
	BuildTime   string         `json:"buildTime"`
	Connections int            `json:"connections"`
	Queued      int            `json:"queued"`
	Services    int            `json:"services"`
	Configs     int            `json:"configs"`
}

// Server serves ADS. Create with New, then Run; Serve accepts connections.
type Server struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer

	log     *slog.Logger
	metrics *metrics.Metrics
	opts    Options
	deps    Deps

	updates  chan *push.Request
	queue    *pushQueue
	admitter *tokenBucket
	subs     *subscriptions
	index    *connIndex

	snapshot atomic.Pointer[push.Snapshot]
	ready    atomic.Bool
	version  atomic.Uint64
	connSeq  atomic.Uint64
	nonceSeq atomic.Uint64
	// BytesSent counts marshalled resource bytes sent, for benchmarks and debug output.
	bytesSent atomic.Uint64
	// unsettled counts the changes handed to ConfigUpdate, by their reasons (which merging
	// adds up), that the debouncer has not yet turned into queued pushes.
	unsettled atomic.Int64

	mu     sync.RWMutex
	conns  map[string]*Connection
	status PushStatus

	// started is when Run began; resuming proxies are held only shortly after it.
	started atomic.Pointer[time.Time]

	// stop is closed when Run's context ends: connection loops and blocked updates return.
	stop     chan struct{}
	stopOnce sync.Once
}

// New returns a server reading from deps.
func New(log *slog.Logger, m *metrics.Metrics, opts Options, deps Deps) *Server {
	if opts.PushThrottle <= 0 {
		opts.PushThrottle = 1
	}
	s := &Server{
		log: log.With("scope", "ads"), metrics: m, opts: opts, deps: deps,
		updates: make(chan *push.Request, 1024),
		conns:   map[string]*Connection{},
		stop:    make(chan struct{}),
	}
	s.queue = newPushQueue()
	s.subs = newSubscriptions()
	s.index = newConnIndex()
	s.admitter = newTokenBucket(opts.ConnectRate, opts.ConnectBurst)
	return s
}

// ConfigUpdate hands a change to the debouncer. It never blocks a config source for long:
// the debouncer drains the channel continuously.
func (s *Server) ConfigUpdate(r *push.Request) {
	triggers := 0
	for reason, n := range r.Reasons {
		s.metrics.PushTriggers.WithLabelValues(reason).Add(float64(n))
		triggers += n
	}
	s.unsettled.Add(int64(triggers))
	if r.Full {
		s.metrics.InboundUpdates.WithLabelValues("config").Inc()
	} else {
		s.metrics.InboundUpdates.WithLabelValues("eds").Inc()
	}
	select {
	case s.updates <- r:
	case <-s.stop:
		s.unsettled.Add(-int64(triggers))
	}
}

// Snapshot returns the snapshot in force (nil before the first build).
func (s *Server) Snapshot() *push.Snapshot { return s.snapshot.Load() }

// Ready reports whether the first snapshot has been built.
func (s *Server) Ready() bool { return s.ready.Load() }

// BytesSent is the total of resource bytes sent so far.
func (s *Server) BytesSent() uint64 { return s.bytesSent.Load() }

// Settled reports whether every change handed in so far has reached every proxy it
// concerns: none waits in the debouncer or is being built, and the push queue holds no push
// and has none in progress. Tests check with it that nothing else followed a change.
func (s *Server) Settled() bool {
	// Read in this order: a push is queued before its changes stop counting as unsettled.
	return s.unsettled.Load() == 0 && s.queue.Idle()
}

// Status returns the latest push's status.
func (s *Server) Status() PushStatus {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := s.status
	st.Connections = len(s.conns)
	st.Queued = s.queue.Len()
	return st
}

// Run builds the initial snapshot and runs the debouncer and push workers until ctx ends.
func (s *Server) Run(ctx context.Context) {
	now := time.Now()
	s.started.Store(&now)
	s.build(push.NewFull(push.ReasonUnknown))
	s.ready.Store(true)
	var wg sync.WaitGroup
	for i := 0; i < s.opts.PushThrottle; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.pushWorker()
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		s.stopOnce.Do(func() { close(s.stop) })
		s.queue.Close()
	}()
	push.Debounce(ctx, s.updates, s.opts.Debounce, s.push, func(d time.Duration) { s.metrics.DebounceTime.Observe(d.Seconds()) })
	wg.Wait()
}

// build makes the snapshot for r and installs it.
func (s *Server) build(r *push.Request) *push.Snapshot {
	start := time.Now()
	version := fmt.Sprintf("%s/%d", start.UTC().Format("2006-01-02T15:04:05Z"), s.version.Add(1))
	cur := s.snapshot.Load()
	full := r.Full || cur == nil
	if !full {
		// Endpoints of DNS services live inside their clusters: they need CDS.
		for h := range r.EDSHosts {
			if svc := cur.Service(h); svc != nil && svc.Resolution != model.ClientSideLB {
				full = true
				break
			}
		}
	}
	var snap *push.Snapshot
	var configs []*config.Config
	if full {
		if s.deps.Configs != nil {
			configs = s.deps.Configs.List()
		}
		var prevIx *config.Index
		if cur != nil {
			prevIx = cur.Configs
		}
		if ix := config.Reindex(prevIx, configs); cur != nil && servicesOnly(r) {
			// The changed hosts say what changed: the rest of the snapshot is shared.
			snap = cur.WithServices(version, ix, s.deps.Registry, r.EDSHosts)
		} else {
			snap = push.Build(version, s.deps.Mesh(), ix, s.deps.Registry)
		}
	} else {
		snap = cur.WithEndpoints(version, s.deps.Registry, r.EDSHosts)
	}
	if s.deps.OnSnapshot != nil {
		s.deps.OnSnapshot(snap)
	}
	s.snapshot.Store(snap)
	elapsed := time.Since(start)
	s.metrics.PushContextInitTime.Observe(elapsed.Seconds())
	s.metrics.Services.Set(float64(len(snap.Services)))
	s.mu.Lock()
	s.status = PushStatus{Version: version, Full: full, Reasons: r.Reasons, Start: r.Start, BuiltAt: time.Now(), BuildTime: elapsed.String(),
		Services: len(snap.Services), Configs: snap.Configs.Len()}
	s.mu.Unlock()
	if full && !r.Full {
		r.Full = true
	}
	return snap
}

// push is the debouncer's callback: build, then queue every connection that needs it.
// It returns once all are queued, which frees the debouncer for the next push.
func (s *Server) push(ctx context.Context, r *push.Request) {
	prev := s.snapshot.Load()
	snap := s.build(r)
	s.log.Debug("push", "version", snap.Version, "request", r.String())
	ev := &pushEvent{snap: snap, req: r, queued: time.Now()}
	for _, c := range s.index.concerned(ev, prev) {
		s.queue.Enqueue(c, ev)
	}
	triggers := 0
	for _, n := range r.Reasons {
		triggers += n
	}
	s.unsettled.Add(-int64(triggers))
}

// servicesOnly reports whether a full request changed nothing but services and their
// endpoints (ServiceEntry and WorkloadEntry configs, registry events): no generator reads
// those configs except through the services, so the changed hosts say which proxies it
// concerns.
func servicesOnly(r *push.Request) bool {
	for reason := range r.Reasons {
		switch reason {
		case push.ReasonService, push.ReasonEndpoint:
		case push.ReasonConfig:
			if len(r.ConfigsUpdated) == 0 {
				return false // a config change that does not say which
			}
		default:
			return false
		}
	}
	for k := range r.ConfigsUpdated {
		if k.Kind != config.ServiceEntry && k.Kind != config.WorkloadEntry {
			return false
		}
	}
	return true
}

func (s *Server) pushWorker() {
	for {
		c, ev, ok := s.queue.Dequeue()
		if !ok {
			return
		}
		s.metrics.QueueTime.Observe(time.Since(ev.queued).Seconds())
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
	s.mu.Lock()
	s.conns[c.ID] = c
	n := len(s.conns)
	s.mu.Unlock()
	s.index.add(c)
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
	s.index.remove(c)
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
	opts := append([]grpc.ServerOption{
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
	g := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(g, s)
	return g
}

// Serve serves g on lis until ctx ends, then stops gracefully: streams are told to finish
// and given up to grace before being cut.
func Serve(ctx context.Context, g *grpc.Server, lis net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
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
		s.queue.Enqueue(c, &pushEvent{snap: s.Snapshot(), req: push.NewFull(push.ReasonReconnect), queued: time.Now()})
	case <-c.stopped:
	case <-s.stop:
	}
}
