// Command xdsload connects many ADS clients (thin proxies) to an xDS server and reports
// convergence for the push benchmark. It reads commands on stdin and answers on stdout:
//
//	ready                      printed once every client has CDS, EDS, LDS and RDS
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
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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
	cmd.Flags().IntVar(&o.dialers, "dialers", 50, "connections opened concurrently")
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
	var wg sync.WaitGroup
	errs := make(chan error, o.proxies)
	sem := make(chan struct{}, o.dialers)
	for i := range proxies {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			p, err := connect(ctx, o, i)
			if err == nil {
				proxies[i] = p
				wctx, cancel := context.WithTimeout(ctx, o.timeout)
				err = p.c.Wait(wctx, configured)
				cancel()
			}
			if err != nil {
				errs <- err
			}
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
	fmt.Fprintln(out, "ready")
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
