package listener

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"

	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
)

const tcpProxyTypeURL = "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"

// tcpProxy is envoy.filters.network.tcp_proxy: bytes both ways between the downstream
// connection and one host of the cluster.
type tcpProxy struct {
	ctx      *hcm.Context
	cluster  string
	weighted []weightedCluster
	total    uint64
	attempts int
	st       struct {
		cxTotal, noRoute, connectFail *stats.Counter
		active                        *stats.Gauge
	}
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	run   context.Context
}

func newTCPProxy(ctx *hcm.Context, p *tcpv3.TcpProxy) (*tcpProxy, error) {
	if err := p.ValidateAll(); err != nil {
		return nil, err
	}
	t := &tcpProxy{ctx: ctx, conns: map[net.Conn]struct{}{}}
	switch c := p.GetClusterSpecifier().(type) {
	case *tcpv3.TcpProxy_Cluster:
		t.cluster = c.Cluster
	case *tcpv3.TcpProxy_WeightedClusters:
		for _, wc := range c.WeightedClusters.GetClusters() {
			t.weighted = append(t.weighted, weightedCluster{name: wc.GetName(), weight: uint64(wc.GetWeight())})
			t.total += uint64(wc.GetWeight())
		}
		if t.total == 0 {
			return nil, fmt.Errorf("tcp_proxy: weighted_clusters: total weight is zero")
		}
	default:
		return nil, fmt.Errorf("tcp_proxy: cluster specifier %T is not supported", c)
	}
	t.attempts = 1
	if n := p.GetMaxConnectAttempts(); n != nil {
		t.attempts = int(n.GetValue())
	}
	sc := ctx.Store.Scope("tcp." + p.GetStatPrefix())
	t.st.cxTotal = sc.Counter("downstream_cx_total")
	t.st.noRoute = sc.Counter("downstream_cx_no_route")
	t.st.connectFail = sc.Counter("upstream_connect_fail")
	t.st.active = sc.Gauge("upstream_cx_active")
	return t, nil
}

func (t *tcpProxy) Start(ctx context.Context) { t.run = ctx }

// weightedCluster is one of tcp_proxy's weighted clusters.
type weightedCluster struct {
	name   string
	weight uint64
}

// pick chooses the connection's cluster: the one cluster, or a weighted one at random.
func (t *tcpProxy) pick() string {
	if len(t.weighted) == 0 {
		return t.cluster
	}
	x := rand.Uint64N(t.total)
	for _, wc := range t.weighted {
		if x < wc.weight {
			return wc.name
		}
		x -= wc.weight
	}
	return t.weighted[len(t.weighted)-1].name
}

func (t *tcpProxy) ServeConn(conn net.Conn) {
	t.st.cxTotal.Inc()
	name := t.pick()
	cl := t.ctx.Clusters.Get(name)
	if cl == nil {
		t.st.noRoute.Inc()
		_ = conn.Close()
		return
	}
	release, ok := cl.Breakers(0).TryConnection()
	if !ok {
		_ = conn.Close()
		return
	}
	go func() {
		defer release()
		// max_connect_attempts: a failed connection is tried again on another host.
		lbctx := &upstream.LBContext{AvoidAttempted: true, HostSelectionAttempts: 1}
		var up net.Conn
		for attempt := 0; attempt < t.attempts; attempt++ {
			var host *upstream.Host
			if cl.Config.GetType().String() == "ORIGINAL_DST" {
				host = upstream.OriginalDstHost(conn.LocalAddr().String())
			} else {
				host = cl.Choose(lbctx)
			}
			if host == nil {
				_ = conn.Close()
				return
			}
			lbctx.Attempted = append(lbctx.Attempted, host)
			c, err := cl.DialTCP(t.run, host)
			if err == nil {
				up = c
				cl.ReportResult(host, upstream.LocalOriginConnectSuccess)
				break
			}
			t.st.connectFail.Inc()
			cl.Stats.UpstreamCxConnectFail.Inc()
			cl.ReportResult(host, upstream.LocalOriginConnectFailed)
		}
		if up == nil {
			cl.Stats.Scope().Counter("upstream_cx_connect_attempts_exceeded").Inc()
			_ = conn.Close()
			return
		}
		if o, ok := conn.(UpstreamObserver); ok {
			o.UpstreamChosen(name, up)
		}
		cl.Stats.UpstreamCxTotal.Inc()
		cl.Stats.UpstreamCxActive.Inc()
		t.st.active.Inc()
		t.track(conn, true)
		defer func() {
			cl.Stats.UpstreamCxActive.Dec()
			t.st.active.Dec()
			t.track(conn, false)
			_ = up.Close()
			_ = conn.Close()
		}()
		done := make(chan struct{}, 2)
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			if tc, ok := dst.(interface{ CloseWrite() error }); ok {
				_ = tc.CloseWrite()
			}
			done <- struct{}{}
		}
		go pipe(up, conn)
		go pipe(conn, up)
		select {
		case <-done:
			<-done
		case <-t.run.Done():
		}
	}()
}

func (t *tcpProxy) track(c net.Conn, add bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if add {
		t.conns[c] = struct{}{}
	} else {
		delete(t.conns, c)
	}
}

// Shutdown waits for the proxied connections to end on their own, then closes the rest
// when ctx ends (TCP has no way to ask a peer to go away).
func (t *tcpProxy) Shutdown(ctx context.Context) error {
	<-ctx.Done()
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := range t.conns {
		_ = c.Close()
	}
	return nil
}
