// Command xdsload connects many ADS clients (thin proxies) to an xDS server and reports
// convergence for the push benchmark. It reads commands on stdin and answers on stdout:
//
//	ready refused=<n> retries=<n> synced-ms=<n>
//	                           printed once every client has CDS, EDS, LDS and RDS: how many
//	                           clients had a stream refused or failed at least once before
//	                           that, how many reconnections they made, and the time from the
//	                           first dial to the last client holding its config
//	cluster <name> [namespace] wait until every client (in namespace) has the cluster and its
//	                           endpoints
//	endpoint <cluster> <addr>  wait until every client's assignment for cluster has addr
//	endpoint-watchers <cluster> <addr>
//	                           the same for the clients that hold the cluster's assignment
//	                           only (the answer counts them)
//
//	profile start <file>       start a CPU profile of this process (profile stop ends it)
//	gc                         collect this process's garbage now, so that collecting the
//	                           responses of earlier changes does not fall into the next
//	                           measurement (the clients hold gigabytes at 2000 proxies)
//
// A client whose stream is refused or fails before it holds its config reconnects after a
// jittered exponential backoff, as Envoy's xDS stream does (JitteredExponentialBackOffStrategy:
// a delay drawn uniformly below an interval that starts at --retry-base and doubles up to
// --retry-max, reset once a response arrives; the agent's bootstrap sets 0.5 s and 5 s).
// --retry-base 0 turns retries off: the first failure is the run's error.
//
// Each command answers "done <unix-nanos of the last ACK> <clients>" or "error <message>";
// the last ACK is the latest among all clients, so clients a change does not concern add
// nothing to it.
package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
	"github.com/wasmesh/wasmesh/controlplane/bench"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

type options struct {
	addr    string
	proxies int
	delta   bool
	timeout time.Duration
	dialers int
	profile string
	// grpcGo runs the clients on grpc-go connections instead of h2grpc streams.
	grpcGo bool
	// namespaces spreads the proxies over bench.ClientNamespace(0..n-1), round robin; 0
	// keeps them all in "load".
	namespaces int
	// retryBase and retryMax are the reconnect backoff (Envoy's retry_back_off); a zero
	// retryBase turns retries off.
	retryBase, retryMax time.Duration
}

func newCommand() *cobra.Command {
	var o options
	cmd := &cobra.Command{
		Use:          "xdsload",
		Short:        "many thin ADS clients against an xDS server, driven over stdin/stdout",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.profile != "" {
				f, err := os.Create(o.profile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			return run(cmd.Context(), o, os.Stdin, os.Stdout)
		},
	}
	cmd.Flags().StringVar(&o.addr, "addr", "127.0.0.1:15010", "xDS server address")
	cmd.Flags().IntVar(&o.proxies, "proxies", 100, "number of proxies (one gRPC connection each)")
	cmd.Flags().BoolVar(&o.delta, "delta", false, "use delta xDS")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up waiting after this long")
	cmd.Flags().IntVar(&o.dialers, "dialers", 50, "clients taking their initial config concurrently (0: all at once, a connection storm)")
	cmd.Flags().DurationVar(&o.retryBase, "retry-base", 500*time.Millisecond, "reconnect backoff's base interval (Envoy's retry_back_off base_interval; 0: no retries)")
	cmd.Flags().DurationVar(&o.retryMax, "retry-max", 5*time.Second, "reconnect backoff's maximum interval (the agent's bootstrap: 5 s)")
	cmd.Flags().StringVar(&o.profile, "cpuprofile", "", "write a CPU profile of the load client here")
	cmd.Flags().BoolVar(&o.grpcGo, "grpc-go", false, "run the clients on grpc-go (four goroutines and their hand-offs per client) instead of h2grpc (one)")
	cmd.Flags().IntVar(&o.namespaces, "namespaces", 0, "spread the proxies over this many client namespaces (0: all in \"load\")")
	return cmd
}

type proxy struct {
	close func() error
	c     *adsc.Client
	ns    string
}

// configured holds once a client has clusters and listeners and every endpoint assignment
// and route configuration they name.
func configured(c *adsc.Client) bool {
	return c.Count(adsc.ClusterType) > 0 && c.Count(adsc.ListenerType) > 0 &&
		c.Count(adsc.EndpointType) == c.Subscribed(adsc.EndpointType) && c.Count(adsc.RouteType) == c.Subscribed(adsc.RouteType)
}

func run(ctx context.Context, o options, in io.Reader, out io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	proxies := make([]*proxy, o.proxies)
	defer func() {
		for _, p := range proxies {
			if p != nil {
				p.close()
			}
		}
	}()
	// A dialer's slot is free again once its client holds its first config: at most
	// o.dialers clients take their initial config at a time, so none waits for the CPU long
	// enough for the server to give up on it (a client that does not read for the keepalive
	// timeout is cut by the kernel, TCP_USER_TIMEOUT), as Envoys starting in a rollout.
	// o.dialers 0 starts them all at once, as Envoys reconnecting to a restarted server.
	var wg sync.WaitGroup
	errs := make(chan error, o.proxies)
	dialers := o.dialers
	if dialers <= 0 {
		dialers = max(o.proxies, 1)
	}
	sem := make(chan struct{}, dialers)
	var st stormStats
	start := time.Now()
	deadline, cancelDeadline := context.WithTimeout(ctx, o.timeout)
	defer cancelDeadline()
	for i := range proxies {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			p, err := syncClient(ctx, deadline, o, i, &st)
			if err != nil {
				errs <- err
				return
			}
			proxies[i] = p
			st.synced(time.Since(start))
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		fmt.Fprintf(out, "error %v\n", err)
		return err
	}
	for _, p := range proxies {
		p.c.TrimLog()
	}
	if f := st.failures(); f != "" {
		fmt.Fprintf(os.Stderr, "xdsload: failures before sync by code: %s\n", f)
	}
	fmt.Fprintf(out, "ready refused=%d retries=%d synced-ms=%d\n", st.refused.Load(), st.retries.Load(), st.last.Load()/int64(time.Millisecond))
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var cond func(*adsc.Client) bool
		counted := func(*adsc.Client) bool { return true } // the clients the answer counts
		switch {
		case len(f) == 3 && f[0] == "profile" && f[1] == "start":
			pf, err := os.Create(f[2])
			if err == nil {
				err = pprof.StartCPUProfile(pf)
			}
			if err != nil {
				fmt.Fprintf(out, "error %v\n", err)
			} else {
				fmt.Fprintln(out, "done 0 0")
			}
			continue
		case len(f) == 2 && f[0] == "profile" && f[1] == "stop":
			pprof.StopCPUProfile()
			fmt.Fprintln(out, "done 0 0")
			continue
		case len(f) == 1 && f[0] == "gc":
			runtime.GC()
			fmt.Fprintln(out, "done 0 0")
			continue
		case (len(f) == 2 || len(f) == 3) && f[0] == "cluster":
			name := f[1]
			cond = func(c *adsc.Client) bool { return c.Has(adsc.ClusterType, name) && c.Has(adsc.EndpointType, name) }
			if len(f) == 3 {
				ns, has := f[2], cond
				inNS := map[*adsc.Client]bool{}
				for _, p := range proxies {
					inNS[p.c] = p.ns == ns
				}
				cond = func(c *adsc.Client) bool { return !inNS[c] || has(c) }
				counted = func(c *adsc.Client) bool { return inNS[c] }
			}
		case len(f) == 3 && f[0] == "endpoint":
			cluster, addr := f[1], endpointPattern(f[2])
			cond = func(c *adsc.Client) bool { return hasEndpoint(c, cluster, addr) }
		case len(f) == 3 && f[0] == "endpoint-watchers":
			cluster, addr := f[1], endpointPattern(f[2])
			cond = func(c *adsc.Client) bool { return !c.Has(adsc.EndpointType, cluster) || hasEndpoint(c, cluster, addr) }
			counted = func(c *adsc.Client) bool { return c.Has(adsc.EndpointType, cluster) }
		default:
			fmt.Fprintf(out, "error unknown command %q\n", sc.Text())
			continue
		}
		last, err := waitAll(ctx, o, proxies, cond)
		if err != nil {
			fmt.Fprintf(out, "error %v\n", err)
			continue
		}
		for _, p := range proxies {
			p.c.TrimLog()
		}
		n := 0
		for _, p := range proxies {
			if counted(p.c) {
				n++
			}
		}
		fmt.Fprintf(out, "done %d %d\n", last.UnixNano(), n)
	}
	return sc.Err()
}

// stormStats counts what the clients went through before all held their config.
type stormStats struct {
	refused, retries atomic.Int64
	// codes counts the failures by gRPC status code, for stderr.
	mu    sync.Mutex
	codes map[codes.Code]int
	// sample is the first failure's message of each code.
	sample map[codes.Code]string
	// last is the latest time, from the first dial, at which a client held its config.
	last atomic.Int64
}

func (s *stormStats) failed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.codes == nil {
		s.codes, s.sample = map[codes.Code]int{}, map[codes.Code]string{}
	}
	c := status.Code(err)
	if s.codes[c]++; s.codes[c] == 1 {
		s.sample[c] = err.Error()
	}
}

// failures is the failures by code, "" when none.
func (s *stormStats) failures() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for c, n := range s.codes {
		out = append(out, fmt.Sprintf("%v=%d (first: %s)", c, n, s.sample[c]))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func (s *stormStats) synced(after time.Duration) {
	for {
		old := s.last.Load()
		if int64(after) <= old || s.last.CompareAndSwap(old, int64(after)) {
			return
		}
	}
}

// backoff is Envoy's JitteredExponentialBackOffStrategy: each delay is drawn uniformly
// from [0, interval); the interval starts at base and doubles up to max; reset starts over.
type backoff struct{ base, max, interval time.Duration }

func (b *backoff) next() time.Duration {
	d := b.interval
	if b.interval < b.max/2 {
		b.interval *= 2
	} else {
		b.interval = b.max
	}
	return min(time.Duration(rand.Int64N(int64(d))), b.max)
}

func (b *backoff) reset() { b.interval = b.base }

// syncClient connects client i and waits until it holds its config, reconnecting after a
// backoff while its stream is refused or fails (each reconnection counted in st), until
// deadline.
func syncClient(ctx, deadline context.Context, o options, i int, st *stormStats) (*proxy, error) {
	bo := backoff{base: o.retryBase, max: max(o.retryMax, o.retryBase), interval: o.retryBase}
	for attempt := 0; ; attempt++ {
		p, err := connect(ctx, o, i)
		if err == nil {
			if err = p.c.Wait(deadline, configured); err == nil {
				return p, nil
			}
			if len(p.c.Responses()) > 0 {
				bo.reset() // Envoy resets its backoff when a response arrives
			}
			p.close()
		}
		if o.retryBase <= 0 || deadline.Err() != nil {
			return nil, fmt.Errorf("client %d: %w", i, err)
		}
		if attempt == 0 {
			st.refused.Add(1)
		}
		st.failed(err)
		st.retries.Add(1)
		t := time.NewTimer(bo.next())
		select {
		case <-t.C:
		case <-deadline.Done():
			t.Stop()
			return nil, fmt.Errorf("client %d: %w (after %d attempts)", i, err, attempt+1)
		}
	}
}

func connect(ctx context.Context, o options, i int) (*proxy, error) {
	ns, id := "load", bench.NodeID(i)
	if o.namespaces > 0 {
		ns = bench.ClientNamespace(i % o.namespaces)
		id = bench.NodeIDIn(i, ns)
	}
	md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": ns, "ISTIO_VERSION": "load"})
	cfg := adsc.Config{Node: &core.Node{Id: id, Metadata: md, Cluster: "load." + ns}, Delta: o.delta, Thin: true}
	if !o.grpcGo {
		ctx, cancel := context.WithCancel(ctx)
		c, err := adsc.DialH2(ctx, o.addr, cfg)
		if err != nil {
			cancel()
			return nil, err
		}
		return &proxy{close: func() error { cancel(); return nil }, c: c, ns: ns}, nil
	}
	// Large fixed windows, as Envoy uses (its default stream window is 256 MiB): no
	// bandwidth probing and few window updates.
	cc, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
		grpc.WithInitialWindowSize(16<<20), grpc.WithInitialConnWindowSize(16<<20))
	if err != nil {
		return nil, err
	}
	c, err := adsc.Dial(ctx, cc, cfg)
	if err != nil {
		cc.Close()
		return nil, err
	}
	return &proxy{close: cc.Close, c: c, ns: ns}, nil
}

// waitAll waits for cond on every client and returns the latest EDS or CDS ACK among them.
func waitAll(ctx context.Context, o options, proxies []*proxy, cond func(*adsc.Client) bool) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var mu sync.Mutex
	var last time.Time
	var firstErr error
	left := len(proxies)
	all := make(chan struct{})
	if left == 0 {
		close(all)
	}
	// Each client checks cond in its own reader after every response (Notify): no goroutine
	// per client to wake, which on this machine would compete with the server measured.
	for _, p := range proxies {
		c := p.c
		var once sync.Once
		check := func() {
			err := c.Err()
			if err == nil && !cond(c) {
				return
			}
			once.Do(func() {
				t := c.LastAck(adsc.EndpointType)
				if ct := c.LastAck(adsc.ClusterType); ct.After(t) {
					t = ct
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("stream ended: %w", err)
				}
				if t.After(last) {
					last = t
				}
				if left--; left == 0 {
					close(all)
				}
			})
		}
		defer c.Notify(check)()
		check()
	}
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		return last, ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	return last, firstErr
}

// endpointPattern is how an address looks on the wire: SocketAddress.address is field 2, a
// string, so an endpoint with addr carries the bytes 0x12, len(addr), addr.
func endpointPattern(addr string) []byte {
	return append([]byte{0x12, byte(len(addr))}, addr...)
}

// hasEndpoint looks for an endpointPattern in a cluster's assignment. Thousands of clients
// check after every response; decoding each assignment would dominate the measurement.
func hasEndpoint(c *adsc.Client, cluster string, pattern []byte) bool {
	return bytes.Contains(c.Raw(adsc.EndpointType, cluster), pattern)
}
