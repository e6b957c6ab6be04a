package rbac

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	rbacnet "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

// NetworkTypeURL is the network filter's type URL.
const NetworkTypeURL = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC"

// NetworkFilter is a configured envoy.filters.network.rbac. Envoy decides at the
// connection's first byte; meshproxy decides as the connection is handed to the chain,
// before the terminal filter (tcp_proxy, the connection manager) sees it, so a denied
// connection never reaches upstream. For client-first protocols the two are the same; a
// denied client of a server-first protocol gets no greeting here, where Envoy would have
// connected upstream and forwarded it.
type NetworkFilter struct {
	engines
	st *counters
}

// NewNetworkFilter builds the filter from its typed_config; stats go to
// <stat_prefix>rbac.allowed and denied (Istio's stat_prefix "tcp." gives tcp.rbac.allowed).
func NewNetworkFilter(store *stats.Store, a *anypb.Any) (*NetworkFilter, error) {
	p := &rbacnet.RBAC{}
	if err := a.UnmarshalTo(p); err != nil {
		return nil, err
	}
	if err := p.ValidateAll(); err != nil {
		return nil, err
	}
	if p.GetDelayDeny() != nil {
		return nil, fmt.Errorf("rbac: delay_deny is not supported")
	}
	e, err := compileEngines(p.GetRules(), p.GetShadowRules(), p.GetMatcher() != nil, p.GetShadowMatcher() != nil)
	if err != nil {
		return nil, fmt.Errorf("rbac: %w", err)
	}
	return &NetworkFilter{engines: e, st: newCounters(store, p.GetStatPrefix(), "", p.GetShadowRulesStatPrefix())}, nil
}

// Allow decides a connection, counting the decision (and the shadow rules' decision).
func (f *NetworkFilter) Allow(conn net.Conn) bool {
	in := &Input{DirectRemote: addrOf(conn.RemoteAddr()).Addr(), Local: addrOf(conn.LocalAddr()), TLS: ConnTLS(conn)}
	in.Remote = in.DirectRemote
	if e := f.shadow; e != nil {
		if e.Evaluate(in).Allowed {
			f.st.shadowAllowed.Inc()
		} else {
			f.st.shadowDenied.Inc()
		}
	}
	if f.rules == nil {
		return true
	}
	if f.rules.Evaluate(in).Allowed {
		f.st.allowed.Inc()
		return true
	}
	f.st.denied.Inc()
	return false
}

// TLSConn is a connection that knows its TLS (the listener's TLS transport socket).
type TLSConn interface {
	DownstreamTLS() *streaminfo.TLS
}

// ConnTLS is the TLS of a connection: its own, or that of the connection it wraps
// (NetConn, as crypto/tls and the listener's wrappers expose it); nil for plaintext.
func ConnTLS(c net.Conn) *streaminfo.TLS {
	for c != nil {
		if t, ok := c.(TLSConn); ok {
			return t.DownstreamTLS()
		}
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = w.NetConn()
	}
	return nil
}

func addrOf(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		ap := t.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	if a == nil {
		return netip.AddrPort{}
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// Terminal is a filter chain's terminal network filter (listener.NetworkFilter).
type Terminal interface {
	Start(ctx context.Context)
	ServeConn(conn net.Conn)
	Shutdown(ctx context.Context) error
}

// Gate puts RBAC network filters in front of a chain's terminal filter: a connection any
// of them denies is closed before the terminal filter sees it.
func Gate(next Terminal, filters []*NetworkFilter) Terminal {
	if len(filters) == 0 {
		return next
	}
	return &gate{Terminal: next, filters: filters}
}

type gate struct {
	Terminal
	filters []*NetworkFilter
}

func (g *gate) ServeConn(conn net.Conn) {
	for _, f := range g.filters {
		if !f.Allow(conn) {
			_ = conn.Close()
			return
		}
	}
	g.Terminal.ServeConn(conn)
}
