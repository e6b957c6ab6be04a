// Package xdsproxy is the agent's XDS proxy, as pilot-agent's since Istio 1.8: the proxy's
// ADS streams (State of the World and Delta) arrive on a Unix socket and each is forwarded,
// message for message and in order, over a stream of its own to discovery's authenticated
// TLS port, so that the proxy itself holds no credential for discovery.
package xdsproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmesh/wasmesh/agent/internal/uds"
)

// DefaultSocketPath is Istio's XDS proxy socket, relative to the agent's working directory.
const DefaultSocketPath = "./etc/istio/proxy/XDS"

// maxMessageSize bounds one xDS message either way: a large mesh's full configuration
// exceeds gRPC's default 4 MiB (Istio's agent lifts the limit altogether, math.MaxInt32).
const maxMessageSize = 256 << 20

// Config says where discovery is and how to reach it.
type Config struct {
	// Address is discovery's host:port.
	Address string
	// DialOptions reach it (caclient.Config.DialOptions: TLS, client certificate, bearer
	// token). Each downstream stream dials anew, so that a renewed workload certificate
	// is presented on the next stream.
	DialOptions []grpc.DialOption
	// ConnectTimeout bounds opening the upstream stream (default 5s, as Istio's agent).
	ConnectTimeout time.Duration
	Registry       prometheus.Registerer
	Log            *slog.Logger
}

// Proxy forwards ADS streams to discovery.
type Proxy struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	mu        sync.Mutex
	upstreams int   // streams to discovery open now
	lastErr   error // why the last upstream stream failed or ended
}

// New checks the configuration.
func New(cfg Config) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(cfg.Address); err != nil {
		return nil, fmt.Errorf("XDS proxy: discovery address %q: %w", cfg.Address, err)
	}
	if len(cfg.DialOptions) == 0 {
		return nil, errors.New("XDS proxy: no dial options (transport credentials) for discovery")
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	// A handshake that hangs fails the stream after ConnectTimeout, not gRPC's 20 s.
	cfg.DialOptions = append(cfg.DialOptions[:len(cfg.DialOptions):len(cfg.DialOptions)],
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: cfg.ConnectTimeout}))
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	return &Proxy{cfg: cfg, log: cfg.Log.With("scope", "xdsproxy"), m: m}, nil
}

// Listen opens the socket at path, replacing a stale one, its directory made as needed.
func Listen(path string) (net.Listener, error) {
	return uds.Listen("XDS proxy socket", path)
}

// Serve serves the proxy's streams on l until ctx ends.
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxMessageSize), grpc.MaxSendMsgSize(maxMessageSize))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, &ads{p: p})
	stop := context.AfterFunc(ctx, srv.Stop)
	defer stop()
	err := srv.Serve(l)
	if ctx.Err() != nil || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Upstream is nil while at least one stream to discovery is open, else why none is: the
// last stream's failure, or that the proxy has not connected yet.
func (p *Proxy) Upstream() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.upstreams > 0:
		return nil
	case p.lastErr != nil:
		return fmt.Errorf("XDS proxy: no stream to discovery %s: %w", p.cfg.Address, p.lastErr)
	default:
		return fmt.Errorf("XDS proxy: the proxy has not connected yet (discovery %s)", p.cfg.Address)
	}
}

func (p *Proxy) upstreamOpened() {
	p.mu.Lock()
	p.upstreams++
	p.mu.Unlock()
	p.m.upstreams.Inc()
}

func (p *Proxy) upstreamClosed(err error) {
	p.mu.Lock()
	p.upstreams--
	p.lastErr = err
	p.mu.Unlock()
	p.m.upstreams.Dec()
}

type ads struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	p *Proxy
}

func (a *ads) StreamAggregatedResources(down discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return forward(a.p, down, func(ctx context.Context, c discoveryv3.AggregatedDiscoveryServiceClient) (
		upstream[*discoveryv3.DiscoveryRequest, *discoveryv3.DiscoveryResponse], error) {
		return c.StreamAggregatedResources(ctx, grpc.MaxCallRecvMsgSize(maxMessageSize), grpc.MaxCallSendMsgSize(maxMessageSize))
	})
}

func (a *ads) DeltaAggregatedResources(down discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return forward(a.p, down, func(ctx context.Context, c discoveryv3.AggregatedDiscoveryServiceClient) (
		upstream[*discoveryv3.DeltaDiscoveryRequest, *discoveryv3.DeltaDiscoveryResponse], error) {
		return c.DeltaAggregatedResources(ctx, grpc.MaxCallRecvMsgSize(maxMessageSize), grpc.MaxCallSendMsgSize(maxMessageSize))
	})
}

// downstream is the proxy's side of a stream, upstream discovery's.
type downstream[Req, Resp any] interface {
	Recv() (Req, error)
	Send(Resp) error
	Context() context.Context
}

type upstream[Req, Resp any] interface {
	Send(Req) error
	Recv() (Resp, error)
	CloseSend() error
}

// forward runs one downstream stream: one new connection and stream to discovery, requests
// copied up by a goroutine, responses copied down by the handler's own goroutine (the only
// one that may send on the downstream). Nothing is queued beyond gRPC's flow-control
// windows: a side that stops reading stops the copy toward it. The first side to end ends
// both: discovery's failure is returned to the proxy, which reconnects with its back-off,
// and the proxy's departure cancels the upstream stream.
func forward[Req, Resp any](p *Proxy, down downstream[Req, Resp],
	open func(context.Context, discoveryv3.AggregatedDiscoveryServiceClient) (upstream[Req, Resp], error)) error {
	conn, err := grpc.NewClient(p.cfg.Address, p.cfg.DialOptions...)
	if err != nil {
		p.m.connectFailures.Inc()
		return status.Errorf(codes.Unavailable, "XDS proxy: discovery %s: %v", p.cfg.Address, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(down.Context())
	defer cancel()
	up, err := openUpstream(p, ctx, conn, open)
	if err != nil {
		return err
	}
	p.upstreamOpened()

	var upErr error
	go func() {
		for {
			req, err := down.Recv()
			if errors.Is(err, io.EOF) {
				up.CloseSend() // the proxy half-closed: let discovery finish
				return
			}
			if err != nil {
				return // the proxy's stream ended: ctx, the stream's, ends with it
			}
			p.m.requests.Inc()
			if err := up.Send(req); err != nil {
				return // up.Recv below returns the stream's error
			}
		}
	}()
	for {
		resp, err := up.Recv()
		if err != nil {
			upErr = err
			break
		}
		p.m.responses.Inc()
		if err := down.Send(resp); err != nil {
			upErr = fmt.Errorf("sending to the proxy: %w", err)
			break
		}
	}
	return p.ended(ctx, upErr)
}

// openUpstream opens the stream to discovery. gRPC fails it at once when the connection
// cannot be made (a refused handshake: TLS or the server's certificate); a refused
// credential arrives as the stream's first error.
func openUpstream[Req, Resp any](p *Proxy, ctx context.Context, conn *grpc.ClientConn,
	open func(context.Context, discoveryv3.AggregatedDiscoveryServiceClient) (upstream[Req, Resp], error)) (upstream[Req, Resp], error) {
	up, err := open(ctx, discoveryv3.NewAggregatedDiscoveryServiceClient(conn))
	if err != nil {
		p.m.connectFailures.Inc()
		p.mu.Lock()
		p.lastErr = err
		p.mu.Unlock()
		p.log.Warn("no stream to discovery", "discovery", p.cfg.Address, "err", err)
		return nil, status.Errorf(status.Code(err), "XDS proxy: discovery %s: %v", p.cfg.Address, status.Convert(err).Message())
	}
	return up, nil
}

// ended records how a stream ended and says it to the proxy: the proxy's own departure
// needs no answer; discovery's clean end is a clean end (as Istio's agent, Envoy starts a
// new stream either way) and its failure is returned with discovery's code.
func (p *Proxy) ended(ctx context.Context, upErr error) error {
	if err := ctx.Err(); err != nil {
		p.upstreamClosed(errors.New("the proxy's stream ended"))
		p.m.envoyTerminations.Inc()
		p.log.Debug("the proxy's stream ended")
		return status.FromContextError(err).Err()
	}
	p.m.istiodTerminations.Inc()
	if errors.Is(upErr, io.EOF) {
		p.upstreamClosed(errors.New("discovery closed the stream"))
		p.log.Info("discovery closed the stream", "discovery", p.cfg.Address)
		return nil
	}
	p.upstreamClosed(upErr)
	p.log.Info("stream to discovery failed; the proxy will reconnect", "discovery", p.cfg.Address, "err", upErr)
	st := status.Convert(upErr)
	return status.Errorf(st.Code(), "XDS proxy: discovery %s: %s", p.cfg.Address, st.Message())
}
