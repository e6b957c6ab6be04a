// Package healthreport tells discovery whether this pod may receive traffic, the way
// Istio's agent reports the health of an auto-registered workload: over an ADS stream of
// its own, with the proxy's node, a DiscoveryRequest of type istio.io/health carrying no
// error when healthy and the reason when not (docs/contracts.md). Discovery keeps the pod's
// endpoint out of every proxy's load balancing while it is unhealthy, so a starting pod gets
// no request before it is ready and a stopping one none after it began to drain.
package healthreport

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// The reconnection back-off of the health stream.
const (
	minBackoff = 200 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// TypeURL is the type of the health requests (Istio's HealthInfoType).
const TypeURL = "istio.io/health"

// Reporter keeps discovery informed of the latest health state.
type Reporter struct {
	addr string
	node *corev3.Node
	log  *slog.Logger
	dial []grpc.DialOption

	mu      sync.Mutex
	state   error // nil: healthy
	known   bool  // a state has been set
	gen     uint64
	sentGen uint64
	wake    chan struct{}
	sent    chan struct{} // closed and replaced whenever sentGen advances
}

// New returns a reporter for the proxy with node, to discovery at addr (host:port),
// reached with dial (the agent's TLS and credentials for discovery; none: plaintext).
func New(addr string, node *corev3.Node, log *slog.Logger, dial ...grpc.DialOption) *Reporter {
	if log == nil {
		log = slog.Default()
	}
	if len(dial) == 0 {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return &Reporter{addr: addr, node: node, log: log.With("scope", "healthreport"), dial: dial,
		wake: make(chan struct{}, 1), sent: make(chan struct{})}
}

// Set records the current health (nil is healthy); only changes are sent.
func (r *Reporter) Set(health error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.known && sameHealth(r.state, health) {
		return
	}
	r.state, r.known = health, true
	r.gen++
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func sameHealth(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Error() == b.Error()
}

// Flush waits until the latest state has been sent to discovery or ctx ends.
func (r *Reporter) Flush(ctx context.Context) error {
	for {
		r.mu.Lock()
		done, sent := r.sentGen >= r.gen, r.sent
		r.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-sent:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Run keeps a stream to discovery open until ctx ends, reconnecting with back-off, and
// sends the state on every change and after every reconnection.
func (r *Reporter) Run(ctx context.Context) {
	// The channel redials on the same back-off as the stream (gRPC's own grows to 120 s,
	// and a restarted discovery would not hear of this pod for that long).
	conn, err := grpc.NewClient(r.addr, append(r.dial[:len(r.dial):len(r.dial)],
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: minBackoff, Multiplier: 2, Jitter: 0.2, MaxDelay: maxBackoff}}))...)
	if err != nil {
		r.log.Error("health reports disabled: bad discovery address", "address", r.addr, "err", err)
		return
	}
	defer conn.Close()
	client := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	wait := minBackoff
	for ctx.Err() == nil {
		start := time.Now()
		err := r.stream(ctx, client)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 10*time.Second {
			wait = minBackoff
		}
		r.log.Debug("health stream ended; reconnecting", "err", err, "in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
		wait = min(2*wait, maxBackoff)
	}
}

func (r *Reporter) stream(ctx context.Context, client discoveryv3.AggregatedDiscoveryServiceClient) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := client.StreamAggregatedResources(sctx)
	if err != nil {
		return err
	}
	broken := make(chan error, 1)
	go func() {
		// Discovery answers nothing on this stream; Recv returns when it breaks.
		for {
			if _, err := s.Recv(); err != nil {
				broken <- err
				return
			}
		}
	}()
	var sentOnStream uint64
	first := true
	for {
		r.mu.Lock()
		gen, state, known := r.gen, r.state, r.known
		r.mu.Unlock()
		if known && (first || gen != sentOnStream) {
			req := &discoveryv3.DiscoveryRequest{Node: r.node, TypeUrl: TypeURL}
			if state != nil {
				req.ErrorDetail = &status.Status{Code: int32(codes.Unavailable), Message: state.Error()}
			}
			if err := s.Send(req); err != nil {
				return err
			}
			first, sentOnStream = false, gen
			r.log.Info("health reported", "healthy", state == nil, "reason", errString(state))
			r.mu.Lock()
			if gen > r.sentGen {
				r.sentGen = gen
				close(r.sent)
				r.sent = make(chan struct{})
			}
			r.mu.Unlock()
		}
		select {
		case <-r.wake:
		case err := <-broken:
			return err
		case <-ctx.Done():
			return errors.Join(ctx.Err(), s.CloseSend())
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
