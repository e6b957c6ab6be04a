// Package listener is meshproxy's listener manager: it binds listeners (or takes their
// sockets over from the previous hot-restart epoch), accepts connections, picks the
// filter chain by Envoy's filter_chain_match rules and hands the connection to the
// chain's network filter (the HTTP connection manager or a TCP proxy). It keeps Envoy's
// listener.<address>.* statistics, honours the global connection limit, redirects
// connections of a use_original_dst listener to the listener of their original
// destination, and drains listeners (all, or inbound only) the way Envoy does.
package listener

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/drain"
	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/internal/pending"
	"github.com/wasmesh/wasmesh/testenv/proxy/rbac"
	"github.com/wasmesh/wasmesh/testenv/proxy/sds"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/tlsctx"
)

// NetworkFilter serves connections of one filter chain.
type NetworkFilter interface {
	Start(ctx context.Context)
	ServeConn(conn net.Conn)
	Shutdown(ctx context.Context) error
}

// NetworkFilterFactory builds a network filter that is not terminal (one configured before
// tcp_proxy or the HTTP connection manager, such as envoy.filters.network.wasm): given the
// next filter of its chain, it returns the filter that serves the chain's connections.
type NetworkFilterFactory func(li hcm.ListenerInfo, name string, a *anypb.Any) (func(next NetworkFilter) NetworkFilter, error)

// UpstreamObserver is a downstream connection that is told which upstream its terminal
// filter chose (tcp_proxy's cluster and connection), for the network filters that wrap it.
type UpstreamObserver interface {
	UpstreamChosen(cluster string, up net.Conn)
}

// SocketSource hands over listening sockets inherited from a previous epoch.
type SocketSource interface {
	// Take returns the inherited socket of a listener (by SocketKey), if any.
	Take(key string) (net.Listener, bool)
}

// Deps are what the manager builds listeners with.
type Deps struct {
	Store     *stats.Store
	Log       *slog.Logger
	HCM       func(li hcm.ListenerInfo, drainers drain.Any) *hcm.Context
	Sockets   SocketSource
	Server    *drain.Drainer // drains every listener (server shutdown, hot restart)
	Inbound   *drain.Drainer // drains inbound listeners only (/drain_listeners?inboundonly)
	MaxConns  int64          // global downstream connection limit; 0: none
	DrainTime time.Duration
	Secrets   *sds.Manager // TLS transport sockets' secrets
	// NetworkFilters are the non-terminal network filters by type URL.
	NetworkFilters map[string]NetworkFilterFactory
}

// filterChain is one filter chain with its network filter. It outlives a listener
// version: a filter chain only update hands an unchanged chain, with its connections, to
// the new version (Envoy's filter chain runtime info survives).
type filterChain struct {
	proto  *listenerv3.FilterChain
	filter NetworkFilter
	hcm    *hcm.Manager
	tls    *tlsctx.Server // nil: plaintext
	// drain drains this chain's connections (its listener or the chain itself removed).
	drain  *drain.Drainer
	cancel context.CancelFunc // stops the network filter; nil until started
}

// Listener is one configured listener.
type Listener struct {
	Name        string
	Proto       *listenerv3.Listener
	Version     string
	Address     string // "ip:port"
	Direction   int
	Bound       bool
	LastUpdated time.Time

	chains       []*filterChain
	defaultChain *filterChain
	sock         *socket
	ctx          context.Context
	cancel       context.CancelFunc
	tls          tlsState
	log          *slog.Logger
	// handoffs are the connections accepted but still in the listener filters or the TLS
	// handshake, not yet handed to a chain: a shutdown waits for them before it stops the
	// chains, so that a client whose connect succeeded is served, not closed on.
	handoffs pending.Count
	st       struct {
		cxTotal, cxDestroy, overflow, noChain, preCxTimeout *stats.Counter
		cxActive                                            *stats.Gauge
	}
}

// socket is a listening socket with its accept loop. It outlives a listener's
// configuration: an in-place update hands it to the new version, and each accepted
// connection goes to whichever version is active then.
type socket struct {
	lis       net.Listener
	name      string
	accepting atomic.Bool
	// looping: acceptLoop runs (until done); it then closes the listener itself.
	looping atomic.Bool
	done    chan struct{}
}

// HTTPManagers returns the connection managers of the listener's filter chains.
func (l *Listener) HTTPManagers() []*hcm.Manager {
	var out []*hcm.Manager
	for _, c := range append(append([]*filterChain(nil), l.chains...), l.defaultChain) {
		if c != nil && c.hcm != nil {
			out = append(out, c.hcm)
		}
	}
	return out
}

// Ready reports whether every connection manager has its routes and filter configs.
func (l *Listener) Ready() bool {
	for _, m := range l.HTTPManagers() {
		if !m.Ready() {
			return false
		}
	}
	return l.secretsReady()
}

// LocalAddr is the bound address (useful with port 0).
func (l *Listener) LocalAddr() string {
	if l.sock != nil {
		return l.sock.lis.Addr().String()
	}
	return l.Address
}

// StatPrefix is the listener's stats scope name, Envoy's listener.<address>. with the
// address's ':' turned into '_'.
func StatPrefix(p *listenerv3.Listener, addr string) string {
	if sp := p.GetStatPrefix(); sp != "" {
		return "listener." + sp
	}
	return "listener." + strings.ReplaceAll(addr, ":", "_")
}

// SocketKey identifies a listening socket across hot-restart epochs: the listener name
// and its configured address (the address alone is ambiguous with port 0).
func SocketKey(name, addr string) string { return name + "|" + addr }

// SocketAddress renders a listener address as ip:port.
func SocketAddress(a *corev3.Address) (string, error) {
	sa := a.GetSocketAddress()
	if sa == nil {
		return "", errors.New("only socket addresses are supported")
	}
	if sa.GetProtocol() != corev3.SocketAddress_TCP {
		return "", fmt.Errorf("protocol %s is not supported", sa.GetProtocol())
	}
	return net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))), nil
}

// Build compiles a listener without binding it.
func Build(d Deps, p *listenerv3.Listener, version string) (*Listener, error) {
	if err := p.ValidateAll(); err != nil {
		return nil, fmt.Errorf("listener %s: %w", p.GetName(), err)
	}
	addr, err := SocketAddress(p.GetAddress())
	if err != nil {
		return nil, fmt.Errorf("listener %s: address: %w", p.GetName(), err)
	}
	l := &Listener{Name: p.GetName(), Proto: p, Version: version, Address: addr, Direction: int(p.GetTrafficDirection()),
		Bound: p.GetBindToPort() == nil || p.GetBindToPort().GetValue(), LastUpdated: time.Now()}
	prefix := StatPrefix(p, addr)
	sc := d.Store.Scope(prefix)
	l.st.cxTotal = sc.Counter("downstream_cx_total")
	l.st.cxDestroy = sc.Counter("downstream_cx_destroy")
	l.st.cxActive = sc.Gauge("downstream_cx_active")
	l.st.overflow = sc.Counter("downstream_global_cx_overflow")
	l.st.noChain = sc.Counter("no_filter_chain_match")
	l.st.preCxTimeout = sc.Counter("downstream_pre_cx_timeout")
	l.log = d.Log
	drainers := drain.Any{d.Server}
	if l.Direction == int(corev3.TrafficDirection_INBOUND) {
		drainers = append(drainers, d.Inbound)
	}
	li := hcm.ListenerInfo{Name: p.GetName(), Direction: l.Direction, StatPrefix: prefix, BufferLimit: hcm.DefaultBufferLimit}
	if v := p.GetPerConnectionBufferLimitBytes(); v != nil {
		li.BufferLimit = int(v.GetValue())
	}
	for i, fc := range p.GetFilterChains() {
		c, err := buildChain(d, li, drainers, fc)
		if err != nil {
			return nil, fmt.Errorf("listener %s: filter_chains[%d] (%s): %w", p.GetName(), i, fc.GetName(), err)
		}
		l.chains = append(l.chains, c)
	}
	if dfc := p.GetDefaultFilterChain(); dfc != nil {
		c, err := buildChain(d, li, drainers, dfc)
		if err != nil {
			return nil, fmt.Errorf("listener %s: default_filter_chain: %w", p.GetName(), err)
		}
		l.defaultChain = c
	}
	if err := l.compileTLS(d, p, prefix); err != nil {
		return nil, err
	}
	return l, nil
}

// buildChain compiles a filter chain; its connection manager drains with drainers and
// with the chain's own drainer.
func buildChain(d Deps, li hcm.ListenerInfo, drainers drain.Any, fc *listenerv3.FilterChain) (*filterChain, error) {
	c := &filterChain{proto: fc, drain: drain.New(drain.Immediate, 0)}
	drainers = append(append(drain.Any(nil), drainers...), c.drain)
	var gates []*rbac.NetworkFilter
	var wraps []func(NetworkFilter) NetworkFilter
	for i, f := range fc.GetFilters() {
		tc := f.GetTypedConfig()
		if tc == nil {
			return nil, fmt.Errorf("filters[%d] (%s): no typed_config", i, f.GetName())
		}
		switch tc.GetTypeUrl() {
		case hcm.TypeURL:
			p := &hcmv3.HttpConnectionManager{}
			if err := tc.UnmarshalTo(p); err != nil {
				return nil, fmt.Errorf("filters[%d] (%s): %w", i, f.GetName(), err)
			}
			m, err := hcm.New(d.HCM(li, drainers), p)
			if err != nil {
				return nil, fmt.Errorf("filters[%d] (%s): %w", i, f.GetName(), err)
			}
			c.filter, c.hcm = m, m
		case tcpProxyTypeURL:
			p := &tcpv3.TcpProxy{}
			if err := tc.UnmarshalTo(p); err != nil {
				return nil, fmt.Errorf("filters[%d] (%s): %w", i, f.GetName(), err)
			}
			ctx := d.HCM(li, drainers)
			t, err := newTCPProxy(ctx, p)
			if err != nil {
				return nil, fmt.Errorf("filters[%d] (%s): %w", i, f.GetName(), err)
			}
			c.filter = t
		case rbac.NetworkTypeURL:
			g, err := rbac.NewNetworkFilter(d.Store, tc)
			if err != nil {
				return nil, fmt.Errorf("filters[%d] (%s): %w", i, f.GetName(), err)
			}
			gates = append(gates, g)
		default:
			if nf := d.NetworkFilters[tc.GetTypeUrl()]; nf != nil {
				w, err := nf(li, f.GetName(), tc)
				if err != nil {
					return nil, fmt.Errorf("filters[%d] (%s): %w", i, f.GetName(), err)
				}
				wraps = append(wraps, w)
				continue
			}
			return nil, fmt.Errorf("filters[%d]: didn't find a registered implementation for '%s' with type URL: '%s'",
				i, f.GetName(), strings.TrimPrefix(tc.GetTypeUrl(), "type.googleapis.com/"))
		}
	}
	if c.filter == nil {
		return nil, errors.New("no network filter")
	}
	for i := len(wraps) - 1; i >= 0; i-- { // the first configured sees the connection first
		c.filter = wraps[i](c.filter)
	}
	c.filter = rbac.Gate(c.filter, gates) // RBAC network filters decide before the others
	return c, nil
}

// start starts the filter chains and binds (unless bind_to_port is false or the socket
// is taken over from the previous version of the listener or the previous epoch).
func (l *Listener) start(m *Manager, inherited *socket) error {
	l.ctx, l.cancel = context.WithCancel(m.ctx)
	for _, c := range l.allChains() {
		if c.cancel == nil { // a chain kept from the previous version runs already
			var ctx context.Context
			ctx, c.cancel = context.WithCancel(m.ctx)
			c.filter.Start(ctx)
		}
	}
	if !l.Bound {
		return nil
	}
	if inherited != nil {
		l.sock = inherited
		return nil
	}
	var lis net.Listener
	if m.deps.Sockets != nil {
		if s, ok := m.deps.Sockets.Take(SocketKey(l.Name, l.Address)); ok {
			lis = s
		}
	}
	if lis == nil {
		var err error
		lis, err = net.Listen("tcp", l.Address)
		if err != nil {
			l.cancel()
			return fmt.Errorf("listener %s: cannot bind %s: %w", l.Name, l.Address, err)
		}
	}
	l.sock = &socket{lis: lis, name: l.Name, done: make(chan struct{})}
	l.sock.accepting.Store(true)
	m.accept(l.sock)
	return nil
}

func (s *socket) acceptLoop(m *Manager) {
	defer close(s.done)
	s.looping.Store(true)
	for {
		conn, err := s.lis.Accept()
		if err != nil {
			if !s.accepting.Load() && !errors.Is(err, net.ErrClosed) {
				s.takeQueued(m)
				_ = s.lis.Close()
				return
			}
			if m.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			m.deps.Log.Warn("accept failed", "listener", s.name, "err", err)
			select {
			case <-time.After(10 * time.Millisecond):
			case <-m.ctx.Done():
				return
			}
			continue
		}
		l := m.get(s.name)
		if l == nil || l.sock != s {
			_ = conn.Close()
			continue
		}
		m.dispatch(l, conn)
	}
}

// stop stops accepting. Connections the kernel has completed but nobody accepted yet would
// be reset when the socket closes (a client whose connect succeeded would read a reset): the
// accept loop is woken by a deadline instead, takes what is queued, serves it as any other
// connection, and closes the socket, so that only connections arriving after that are
// refused. A socket nobody accepts on (before the workers start) is closed at once.
func (s *socket) stop() {
	if s == nil || !s.accepting.CompareAndSwap(true, false) {
		return
	}
	tl, ok := s.lis.(*net.TCPListener)
	if !ok || !s.looping.Load() {
		_ = s.lis.Close()
		return
	}
	_ = tl.SetDeadline(time.Now())
	select {
	case <-s.done:
	case <-time.After(time.Second): // the loop is stuck dispatching: close under it
		_ = s.lis.Close()
	}
}

// takeQueued accepts, without waiting, the connections already queued on the socket and
// dispatches them.
func (s *socket) takeQueued(m *Manager) {
	tl, ok := s.lis.(*net.TCPListener)
	if !ok {
		return
	}
	raw, err := tl.SyscallConn()
	if err != nil {
		return
	}
	var conns []net.Conn
	_ = raw.Control(func(fd uintptr) {
		for {
			nfd, _, err := unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			if err != nil {
				return // EAGAIN: nothing more is queued
			}
			f := os.NewFile(uintptr(nfd), "accepted")
			c, err := net.FileConn(f)
			_ = f.Close()
			if err == nil {
				conns = append(conns, c)
			}
		}
	})
	l := m.get(s.name)
	for _, c := range conns {
		if l == nil || l.sock != s {
			_ = c.Close()
			continue
		}
		m.dispatch(l, c)
	}
}

// serve runs a connection on this listener's filter chains.
func (l *Listener) serve(m *Manager, conn net.Conn) {
	if !m.admit() {
		l.st.overflow.Inc()
		_ = conn.Close()
		return
	}
	l.st.cxTotal.Inc()
	l.st.cxActive.Inc()
	tc := &countedConn{Conn: conn, onClose: func() {
		l.st.cxActive.Dec()
		l.st.cxDestroy.Inc()
		m.release()
	}}
	if l.needsInspection() {
		l.handoffs.Add()
		go func() {
			defer l.handoffs.Done()
			l.inspectAndServe(m, tc)
		}()
		return
	}
	c := l.pickChain(facts(conn))
	if c == nil {
		l.st.noChain.Inc()
		_ = tc.Close()
		return
	}
	c.filter.ServeConn(tc)
}

type countedConn struct {
	net.Conn
	once    sync.Once
	onClose func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.onClose)
	return c.Conn.Close()
}

// stopAccepting closes the listening socket of this process. With hot restart the
// socket lives on in the child, which holds a duplicate of the descriptor.
func (l *Listener) stopAccepting() { l.sock.stop() }

// allChains are the listener's filter chains and its default chain, if any.
func (l *Listener) allChains() []*filterChain {
	out := append([]*filterChain(nil), l.chains...)
	if l.defaultChain != nil {
		out = append(out, l.defaultChain)
	}
	return out
}

// shutdown drains the listener's connections (until ctx ends) and stops it.
func (l *Listener) shutdown(ctx context.Context) {
	chains := l.allChains()
	for _, c := range chains {
		c.drain.Start()
	}
	l.stopAccepting()
	// Nothing is accepted any more: what was accepted reaches its chain (or ctx ends)
	// before the chains stop taking connections.
	l.handoffs.Wait(ctx)
	var wg sync.WaitGroup
	for _, c := range chains {
		wg.Add(1)
		go func(c *filterChain) {
			defer wg.Done()
			_ = c.filter.Shutdown(ctx)
			c.stop()
		}(c)
	}
	wg.Wait()
	if l.cancel != nil {
		l.cancel()
	}
}

// stop closes the chain's remaining connections.
func (c *filterChain) stop() {
	if c.cancel != nil {
		c.cancel()
	}
}
