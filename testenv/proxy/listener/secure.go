package listener

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/sds"
	"github.com/wasmesh/wasmesh/testenv/proxy/tlsctx"
)

// handshakeTimeout bounds a downstream TLS handshake (a client that stalls mid-handshake
// must not hold a goroutine forever).
const handshakeTimeout = 15 * time.Second

// tlsState is a listener's TLS: the inspector's settings and whether any chain
// terminates TLS.
type tlsState struct {
	inspect           bool
	filtersTimeout    time.Duration
	continueOnTimeout bool
	any               bool
}

// compileTLS reads the listener filters and each filter chain's transport socket.
func (l *Listener) compileTLS(d Deps, p *listenerv3.Listener, prefix string) error {
	inspect, err := listenerFilters(p)
	if err != nil {
		return err
	}
	l.tls = tlsState{inspect: inspect, filtersTimeout: defaultListenerFiltersTimeout,
		continueOnTimeout: p.GetContinueOnListenerFiltersTimeout()}
	if t := p.GetListenerFiltersTimeout(); t != nil {
		l.tls.filtersTimeout = t.AsDuration()
	}
	sc := d.Store.Scope(prefix + ".ssl")
	for _, c := range append(append([]*filterChain(nil), l.chains...), l.defaultChain) {
		if c == nil {
			continue
		}
		dtc, err := tlsctx.DownstreamContext(c.proto.GetTransportSocket())
		if err != nil {
			return chainError(l, c, err)
		}
		if dtc == nil {
			continue
		}
		if d.Secrets == nil {
			return chainError(l, c, errNoSecrets)
		}
		if c.tls, err = tlsctx.NewServer(dtc, d.Secrets, sc); err != nil {
			return chainError(l, c, err)
		}
		l.tls.any = true
	}
	return nil
}

// secretProviders are the secrets the listener's chains wait for.
func (l *Listener) secretProviders() []*sds.Provider {
	var out []*sds.Provider
	for _, c := range append(append([]*filterChain(nil), l.chains...), l.defaultChain) {
		if c != nil && c.tls != nil {
			out = append(out, c.tls.Providers()...)
		}
	}
	return out
}

// TLSContexts are the listener's TLS contexts (admin /certs).
func (l *Listener) TLSContexts() []tlsctx.Context {
	var out []tlsctx.Context
	for _, c := range append(append([]*filterChain(nil), l.chains...), l.defaultChain) {
		if c != nil && c.tls != nil {
			out = append(out, c.tls)
		}
	}
	return out
}

// secretsReady: every secret of the listener arrived (or its initial fetch timed out).
func (l *Listener) secretsReady() bool {
	for _, p := range l.secretProviders() {
		if !p.Done() {
			return false
		}
	}
	return true
}

// needsInspection: the connection's first bytes or handshake must be read before it is
// served, off the accept loop.
func (l *Listener) needsInspection() bool { return l.tls.inspect || l.tls.any }

func facts(conn net.Conn) *connFacts {
	local, _ := netip.ParseAddrPort(conn.LocalAddr().String())
	remote, _ := netip.ParseAddrPort(conn.RemoteAddr().String())
	return &connFacts{local: local, remote: remote, transport: "raw_buffer", alpn: plaintextALPN}
}

// inspectAndServe runs the TLS inspector, picks the chain, terminates TLS when the chain
// has a TLS transport socket, and hands the connection to the chain's network filter.
// The chain is picked from the listener's version active once the inspector is done: a
// filter chain only update during the inspection serves the connection on the new chains,
// as Envoy's listener filters hand the socket to the current filter chain manager.
func (l *Listener) inspectAndServe(m *Manager, conn net.Conn) {
	f := facts(conn)
	if l.tls.inspect {
		var h hello
		var timedOut bool
		conn, h, timedOut = peekHello(conn, l.tls.filtersTimeout)
		if timedOut && !l.tls.continueOnTimeout {
			l.st.preCxTimeout.Inc()
			_ = conn.Close()
			return
		}
		if h.tls {
			f.transport, f.sni, f.alpn = "tls", h.sni, h.alpn
		}
	}
	l = m.current(l)
	c := l.pickChain(f)
	if c == nil {
		l.st.noChain.Inc()
		_ = conn.Close()
		return
	}
	if c.tls != nil {
		ctx, cancel := context.WithTimeout(l.ctx, handshakeTimeout)
		tc, info, err := c.tls.Handshake(ctx, conn)
		cancel()
		if err != nil {
			l.log.Debug("downstream TLS handshake failed", "listener", l.Name, "peer", conn.RemoteAddr().String(), "err", err)
			_ = conn.Close()
			return
		}
		conn = &SecureConn{Conn: tc, info: info}
	}
	c.filter.ServeConn(conn)
}

var errNoSecrets = errors.New("TLS transport sockets need the secret manager")

func chainError(l *Listener, c *filterChain, err error) error {
	if c == l.defaultChain {
		return fmt.Errorf("listener %s: default_filter_chain: transport_socket: %w", l.Name, err)
	}
	return fmt.Errorf("listener %s: filter chain %s: transport_socket: %w", l.Name, c.proto.GetName(), err)
}
