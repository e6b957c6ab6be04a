package listener

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"google.golang.org/protobuf/proto"

	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// Manager owns the listeners of the process.
type Manager struct {
	ctx  context.Context
	deps Deps

	mu       sync.Mutex
	active   map[string]*Listener
	warming  map[string]*Listener
	static   map[string]bool
	draining []*Listener
	onChange []func()

	// workers: accept loops run. Envoy's workers, which accept, start once the server is
	// initialized; sockets bound before then are held (their connections wait in the listen
	// backlog, or in a hot restart go to the previous epoch, still accepting on them).
	workers bool
	held    []*socket

	conns atomic.Int64
	st    struct {
		added, modified, removed, createFail *stats.Counter
		total, warmingG, draining            *stats.Gauge
	}
}

// NewManager returns an empty listener manager; listeners stop with ctx.
func NewManager(ctx context.Context, d Deps) *Manager {
	m := &Manager{ctx: ctx, deps: d, active: map[string]*Listener{}, warming: map[string]*Listener{}, static: map[string]bool{}}
	sc := d.Store.Scope("listener_manager")
	m.st.added = sc.Counter("listener_added")
	m.st.modified = sc.Counter("listener_modified")
	m.st.removed = sc.Counter("listener_removed")
	m.st.createFail = sc.Counter("listener_create_failure")
	m.st.total = sc.Gauge("total_listeners_active")
	m.st.warmingG = sc.Gauge("total_listeners_warming")
	m.st.draining = sc.Gauge("total_listeners_draining")
	return m
}

// OnChange registers f, called when a listener became active or was removed.
func (m *Manager) OnChange(f func()) {
	m.mu.Lock()
	m.onChange = append(m.onChange, f)
	m.mu.Unlock()
}

func (m *Manager) notify() {
	m.mu.Lock()
	fs := append([]func(){}, m.onChange...)
	m.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// Validate builds a listener without installing it.
func (m *Manager) Validate(p *listenerv3.Listener) error {
	_, err := Build(m.deps, p, "")
	return err
}

// AddOrUpdate installs a listener. A listener whose RDS routes or ECDS filter configs are
// not there yet warms (the previous version keeps serving); Recheck activates it once
// they arrived. An identical listener is left alone.
func (m *Manager) AddOrUpdate(p *listenerv3.Listener, version string, static bool) error {
	m.mu.Lock()
	if old := m.active[p.GetName()]; old != nil && proto.Equal(old.Proto, p) {
		m.mu.Unlock()
		return nil
	}
	m.mu.Unlock()
	l, err := Build(m.deps, p, version)
	if err != nil {
		m.st.createFail.Inc()
		return err
	}
	m.mu.Lock()
	if static {
		m.static[l.Name] = true
	}
	if old := m.active[l.Name]; old != nil && old.Address != l.Address && old.Bound && l.Bound {
		m.mu.Unlock()
		return fmt.Errorf("listener %s: cannot change the address of a listener from %s to %s", l.Name, old.Address, l.Address)
	}
	for n, other := range m.active {
		if n != l.Name && other.Bound && l.Bound && other.Address == l.Address && !strings.HasSuffix(l.Address, ":0") {
			m.mu.Unlock()
			return fmt.Errorf("listener %s: address %s is already used by listener %s", l.Name, l.Address, n)
		}
	}
	m.warming[l.Name] = l
	m.mu.Unlock()
	for _, p := range l.secretProviders() {
		p.OnDone(func() { _ = m.Recheck() })
	}
	return m.Recheck()
}

// Recheck activates warming listeners whose dependencies arrived.
func (m *Manager) Recheck() error {
	m.mu.Lock()
	var ready []*Listener
	for name, l := range m.warming {
		if l.Ready() {
			ready = append(ready, l)
			delete(m.warming, name)
		}
	}
	sort.Slice(ready, func(i, j int) bool { return ready[i].Name < ready[j].Name })
	var errs []error
	changed := len(ready) > 0
	for _, l := range ready {
		old := m.active[l.Name]
		var inherited *socket
		if old != nil && old.sock != nil && old.Address == l.Address {
			// In-place update: the socket stays.
			inherited = old.sock
		}
		// The old version's chains drain, but for a filter chain only update, which keeps
		// the unchanged ones.
		var removed []*filterChain
		if old != nil {
			removed = old.allChains()
			if filterChainOnlyChange(old.Proto, l.Proto) {
				removed = l.keepChains(old)
			}
		}
		if err := l.start(m, inherited); err != nil {
			errs = append(errs, err)
			m.st.createFail.Inc()
			continue
		}
		m.active[l.Name] = l
		if old != nil {
			m.st.modified.Inc()
			m.drainOld(old, removed)
		} else {
			m.st.added.Inc()
		}
	}
	m.gauges()
	m.mu.Unlock()
	if changed {
		m.notify()
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// accept starts a socket's accept loop, or holds it until StartWorkers (m.mu held).
func (m *Manager) accept(s *socket) {
	if !m.workers {
		m.held = append(m.held, s)
		return
	}
	go s.acceptLoop(m)
}

// StartWorkers starts accepting, on the sockets bound so far and on every one bound
// later: the server calls it once initialized (LIVE), as Envoy starts its workers.
func (m *Manager) StartWorkers() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.workers {
		return
	}
	m.workers = true
	for _, s := range m.held {
		go s.acceptLoop(m)
	}
	m.held = nil
}

// drainOld drains the chains of an updated listener that its new version does not keep,
// as Envoy drains a listener (or, in a filter chain only update, the removed and changed
// chains): their HTTP/1 responses close the connection and HTTP/2 connections get a
// GOAWAY for the drain time, then the connections left are closed. Idle connections are
// not closed before then: a client may be writing a request on one, and Envoy does not
// retry a request reset by a peer closing its connection (envoyproxy/envoy#2324). The
// accept loop is left to the new version sharing the socket. m.mu must be held.
func (m *Manager) drainOld(old *Listener, removed []*filterChain) {
	m.draining = append(m.draining, old)
	for _, c := range removed {
		c.drain.Start()
	}
	go func() {
		select {
		case <-time.After(m.deps.DrainTime):
		case <-m.ctx.Done():
		}
		ctx, cancel := context.WithTimeout(m.ctx, drainCloseGrace)
		defer cancel()
		var wg sync.WaitGroup
		for _, c := range removed {
			wg.Add(1)
			go func(c *filterChain) {
				defer wg.Done()
				_ = c.filter.Shutdown(ctx)
				c.stop()
			}(c)
		}
		wg.Wait()
		old.cancel()
		m.mu.Lock()
		for i, d := range m.draining {
			if d == old {
				m.draining = append(m.draining[:i], m.draining[i+1:]...)
				break
			}
		}
		m.gauges()
		m.mu.Unlock()
	}()
}

// drainCloseGrace is how long, once the drain time is over, a draining chain's requests in
// flight have to complete before their connections are closed.
const drainCloseGrace = time.Second

// filterChainOnlyChange reports whether two versions of a listener differ in their filter
// chains only (Envoy's ListenerMessageUtil::filterChainOnlyChange): such an update keeps
// the unchanged chains and their connections.
func filterChainOnlyChange(a, b *listenerv3.Listener) bool {
	strip := func(p *listenerv3.Listener) *listenerv3.Listener {
		c := proto.Clone(p).(*listenerv3.Listener)
		c.FilterChains, c.DefaultFilterChain, c.FilterChainMatcher = nil, nil, nil
		return c
	}
	return proto.Equal(strip(a), strip(b))
}

// keepChains takes over old's filter chains that are the same message in l (Envoy: "the
// corresponding filter chain runtime info survives", connections included), in place of
// the ones l built, and returns old's other chains, which drain.
func (l *Listener) keepChains(old *Listener) []*filterChain {
	kept := map[*filterChain]bool{}
	take := func(c *filterChain) *filterChain {
		for _, o := range old.allChains() {
			if !kept[o] && proto.Equal(o.proto, c.proto) {
				kept[o] = true
				return o
			}
		}
		return c
	}
	for i, c := range l.chains {
		l.chains[i] = take(c)
	}
	if l.defaultChain != nil {
		l.defaultChain = take(l.defaultChain)
	}
	var removed []*filterChain
	for _, o := range old.allChains() {
		if !kept[o] {
			removed = append(removed, o)
		}
	}
	return removed
}

// current is the version of l's listener to serve a connection l accepted: the active
// one when a filter chain only update replaced l since (the connection is not l's yet: it
// was being inspected), else l.
func (m *Manager) current(l *Listener) *Listener {
	cur := m.get(l.Name)
	if cur == nil || cur == l || cur.sock != l.sock || !filterChainOnlyChange(cur.Proto, l.Proto) {
		return l
	}
	return cur
}

// Remove deletes a dynamic listener: it stops accepting and drains.
func (m *Manager) Remove(name string) {
	m.mu.Lock()
	delete(m.warming, name)
	l := m.active[name]
	if l == nil || m.static[name] {
		m.gauges()
		m.mu.Unlock()
		return
	}
	delete(m.active, name)
	m.st.removed.Inc()
	m.draining = append(m.draining, l)
	m.gauges()
	m.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(m.ctx, m.deps.DrainTime)
		defer cancel()
		l.shutdown(ctx)
		m.mu.Lock()
		for i, d := range m.draining {
			if d == l {
				m.draining = append(m.draining[:i], m.draining[i+1:]...)
				break
			}
		}
		m.gauges()
		m.mu.Unlock()
	}()
	m.notify()
}

func (m *Manager) gauges() {
	m.st.total.Set(int64(len(m.active)))
	m.st.warmingG.Set(int64(len(m.warming)))
	m.st.draining.Set(int64(len(m.draining)))
}

// Active returns the active listeners sorted by name.
func (m *Manager) Active() []*Listener { return m.list(m.active) }

// Warming returns the warming listeners sorted by name.
func (m *Manager) Warming() []*Listener { return m.list(m.warming) }

func (m *Manager) list(src map[string]*Listener) []*Listener {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Listener, 0, len(src))
	for _, l := range src {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// DynamicNames lists listeners that did not come from the bootstrap (active or warming).
func (m *Manager) DynamicNames() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	seen := map[string]bool{}
	for _, src := range []map[string]*Listener{m.active, m.warming} {
		for n := range src {
			if !m.static[n] && !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	sort.Strings(out)
	return out
}

// StopAccepting closes every listening socket (the hot-restart parent hands over).
func (m *Manager) StopAccepting() {
	for _, l := range m.Active() {
		l.stopAccepting()
	}
}

// Shutdown drains every listener until ctx ends, the outbound ones last: they keep
// accepting until the other listeners' connections are done, since a request still in
// flight on an inbound listener may need its application's calls out through the sidecar.
func (m *Manager) Shutdown(ctx context.Context) {
	var first, outbound []*Listener
	for _, l := range m.Active() {
		if l.Direction == int(corev3.TrafficDirection_OUTBOUND) {
			outbound = append(outbound, l)
		} else {
			first = append(first, l)
		}
	}
	shutdownAll(ctx, first)
	shutdownAll(ctx, outbound)
}

// shutdownAll drains listeners together until ctx ends.
func shutdownAll(ctx context.Context, ls []*Listener) {
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Add(1)
		go func(l *Listener) {
			defer wg.Done()
			l.shutdown(ctx)
		}(l)
	}
	wg.Wait()
}

// Sockets returns the listening sockets by SocketKey (for the hot-restart handover).
func (m *Manager) Sockets() map[string]net.Listener {
	out := map[string]net.Listener{}
	for _, l := range m.Active() {
		if l.sock != nil {
			out[SocketKey(l.Name, l.Address)] = l.sock.lis
		}
	}
	return out
}

func (m *Manager) get(name string) *Listener {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.active[name]
}

func (m *Manager) admit() bool {
	n := m.conns.Add(1)
	if m.deps.MaxConns > 0 && n > m.deps.MaxConns {
		m.conns.Add(-1)
		return false
	}
	return true
}

func (m *Manager) release() { m.conns.Add(-1) }

// ActiveConnections is the number of downstream connections open on all listeners.
func (m *Manager) ActiveConnections() int64 { return m.conns.Load() }

// dispatch serves a connection accepted by l, first following use_original_dst.
func (m *Manager) dispatch(l *Listener, conn net.Conn) {
	if l.Proto.GetUseOriginalDst().GetValue() {
		if dst, ok := originalDst(conn); ok && dst != l.Address {
			if target := m.byAddress(dst); target != nil {
				target.serve(m, &dstConn{Conn: conn, local: dst})
				return
			}
		}
	}
	l.serve(m, conn)
}

func (m *Manager) byAddress(addr string) *Listener {
	m.mu.Lock()
	defer m.mu.Unlock()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil
	}
	var wildcard *Listener
	for _, l := range m.active {
		if l.Address == addr {
			return l
		}
		lp, err := netip.ParseAddrPort(l.Address)
		if err == nil && lp.Port() == ap.Port() && lp.Addr().IsUnspecified() {
			wildcard = l
		}
	}
	return wildcard
}

// dstConn reports the original destination as its local address.
type dstConn struct {
	net.Conn
	local string
}

func (c *dstConn) LocalAddr() net.Addr {
	if a, err := net.ResolveTCPAddr("tcp", c.local); err == nil {
		return a
	}
	return c.Conn.LocalAddr()
}

func inRanges(ranges []*corev3.CidrRange, a netip.Addr) bool {
	for _, r := range ranges {
		p, err := netip.ParsePrefix(r.GetAddressPrefix() + "/" + strconv.Itoa(int(r.GetPrefixLen().GetValue())))
		if err != nil {
			continue
		}
		if p.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

// StopListener closes one listener's socket; its connections stay until they drain.
func (m *Manager) StopListener(l *Listener) { l.stopAccepting() }
