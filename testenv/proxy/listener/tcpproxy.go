package listener

import (
	"context"
	"fmt"
	"io"
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
	ctx     *hcm.Context
	cluster string
	st      struct {
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
	default:
		return nil, fmt.Errorf("tcp_proxy: only a single cluster is supported")
	}
	sc := ctx.Store.Scope("tcp." + p.GetStatPrefix())
	t.st.cxTotal = sc.Counter("downstream_cx_total")
	t.st.noRoute = sc.Counter("downstream_cx_no_route")
	t.st.connectFail = sc.Counter("upstream_connect_fail")
	t.st.active = sc.Gauge("upstream_cx_active")
	return t, nil
}

func (t *tcpProxy) Start(ctx context.Context) { t.run = ctx }

func (t *tcpProxy) ServeConn(conn net.Conn) {
	t.st.cxTotal.Inc()
	cl := t.ctx.Clusters.Get(t.cluster)
	if cl == nil {
		t.st.noRoute.Inc()
		_ = conn.Close()
		return
	}
	var host *upstream.Host
	if cl.Config.GetType().String() == "ORIGINAL_DST" {
		host = upstream.OriginalDstHost(conn.LocalAddr().String())
	} else {
		host = cl.Choose(&upstream.LBContext{})
	}
	if host == nil {
		_ = conn.Close()
		return
	}
	go func() {
		var d net.Dialer
		up, err := d.DialContext(t.run, "tcp", host.Address)
		if err != nil {
			t.st.connectFail.Inc()
			cl.Stats.UpstreamCxConnectFail.Inc()
			_ = conn.Close()
			return
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
