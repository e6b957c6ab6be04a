package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/testenv/proxy/sds"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
	"github.com/wasmesh/wasmesh/testenv/proxy/tlsctx"
)

// transportSocketMatchKey is the endpoint metadata namespace transport_socket_matches read.
const transportSocketMatchKey = "envoy.transport_socket_match"

// socketMatch is one transport_socket_matches entry: its TLS client (nil: plaintext).
type socketMatch struct {
	name  string
	match *structpb.Struct
	tls   *tlsctx.Client
	count *stats.Counter
}

// transports are a cluster's transport sockets.
type transports struct {
	matches []socketMatch
	def     *tlsctx.Client
}

func compileTransports(cfg *clusterv3.Cluster, secrets *sds.Manager, sc stats.Scope) (*transports, error) {
	t := &transports{}
	ssl := sc.Scope("ssl")
	utc, err := tlsctx.UpstreamContext(cfg.GetTransportSocket())
	if err != nil {
		return nil, err
	}
	if t.def, err = newClient(utc, secrets, ssl); err != nil {
		return nil, fmt.Errorf("transport_socket: %w", err)
	}
	for i, m := range cfg.GetTransportSocketMatches() {
		utc, err := tlsctx.UpstreamContext(m.GetTransportSocket())
		if err != nil {
			return nil, fmt.Errorf("transport_socket_matches[%d] (%s): %w", i, m.GetName(), err)
		}
		c, err := newClient(utc, secrets, ssl)
		if err != nil {
			return nil, fmt.Errorf("transport_socket_matches[%d] (%s): %w", i, m.GetName(), err)
		}
		t.matches = append(t.matches, socketMatch{name: m.GetName(), match: m.GetMatch(), tls: c,
			count: sc.Counter("transport_socket_match." + m.GetName() + ".total_match_count")})
	}
	return t, nil
}

func newClient(utc *tlsv3.UpstreamTlsContext, secrets *sds.Manager, sc stats.Scope) (*tlsctx.Client, error) {
	if utc == nil {
		return nil, nil
	}
	if secrets == nil {
		return nil, errors.New("TLS transport sockets need the secret manager")
	}
	return tlsctx.NewClient(utc, secrets, sc)
}

// providers are the secrets the cluster waits for.
func (t *transports) providers() []*sds.Provider {
	var out []*sds.Provider
	if t.def != nil {
		out = append(out, t.def.Providers()...)
	}
	for _, m := range t.matches {
		if m.tls != nil {
			out = append(out, m.tls.Providers()...)
		}
	}
	return out
}

// TLSContexts are the cluster's TLS contexts (admin /certs).
func (c *Cluster) TLSContexts() []tlsctx.Context {
	var out []tlsctx.Context
	if c.transports.def != nil {
		out = append(out, c.transports.def)
	}
	for _, m := range c.transports.matches {
		if m.tls != nil {
			out = append(out, m.tls)
		}
	}
	return out
}

// ready: every secret's initialization ended.
func (t *transports) ready() bool {
	for _, p := range t.providers() {
		if !p.Done() {
			return false
		}
	}
	return true
}

// forHost picks the host's transport socket: the first match whose fields all equal the
// endpoint's envoy.transport_socket_match metadata, else the cluster's transport_socket.
func (t *transports) forHost(h *Host) *tlsctx.Client {
	if len(t.matches) == 0 {
		return t.def
	}
	md := h.Metadata.GetFilterMetadata()[transportSocketMatchKey].GetFields()
	for _, m := range t.matches {
		ok := true
		for k, v := range m.match.GetFields() {
			if got, present := md[k]; !present || !proto.Equal(got, v) {
				ok = false
				break
			}
		}
		if ok {
			m.count.Inc()
			return m.tls
		}
	}
	return t.def
}

// secureConn is an upstream TLS connection; ConnectionState lets the HTTP/2 transport
// report it on responses.
type secureConn struct {
	*tls.Conn
	info *streaminfo.TLS
}

// UpstreamTLS describes the connection's TLS.
func (c *secureConn) UpstreamTLS() *streaminfo.TLS { return c.info }

// ConnTLS describes an upstream connection's TLS (nil for plaintext): the router records
// it on the stream (streaminfo's upstream TLS) when the connection is picked.
func ConnTLS(c net.Conn) *streaminfo.TLS {
	if cc, ok := c.(*countedConn); ok {
		c = cc.Conn
	}
	if sc, ok := c.(*secureConn); ok {
		return sc.info
	}
	return nil
}

// DialTCP connects to a host for a TCP proxy: within the connect timeout, with the
// host's transport socket (TLS for an mTLS endpoint). Statistics are the caller's.
func (c *Cluster) DialTCP(ctx context.Context, h *Host) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, c.connectTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dctx, h.DialNetwork(), h.Address)
	if err != nil {
		return nil, err
	}
	return c.handshake(dctx, conn, h)
}

// handshake runs the host's TLS, if any, on a new connection.
func (c *Cluster) handshake(ctx context.Context, conn net.Conn, h *Host) (net.Conn, error) {
	cl := c.transports.forHost(h)
	if cl == nil {
		return conn, nil
	}
	tc, info, err := cl.Handshake(ctx, conn)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("TLS error: %w", err)
	}
	return &secureConn{Conn: tc, info: info}, nil
}
