package listener

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

// Listener filter type URLs.
const (
	tlsInspectorType  = "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"
	httpInspectorType = "type.googleapis.com/envoy.extensions.filters.listener.http_inspector.v3.HttpInspector"
	originalDstType   = "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"
)

// defaultListenerFiltersTimeout is Envoy's listener_filters_timeout default.
const defaultListenerFiltersTimeout = 15 * time.Second

// hello is what the TLS inspector saw of a connection's first bytes.
type hello struct {
	tls  bool
	sni  string
	alpn []string
}

// listenerFilters reads the listener filters: whether the TLS inspector runs, and its
// timeout. The HTTP inspector's detection is what matchChain assumes of plaintext;
// original_dst is use_original_dst's.
func listenerFilters(p *listenerv3.Listener) (inspect bool, err error) {
	for i, f := range p.GetListenerFilters() {
		switch f.GetTypedConfig().GetTypeUrl() {
		case tlsInspectorType:
			inspect = true
		case httpInspectorType, originalDstType:
		case "":
			switch f.GetName() {
			case "envoy.filters.listener.tls_inspector":
				inspect = true
			case "envoy.filters.listener.http_inspector", "envoy.filters.listener.original_dst":
			default:
				return false, fmt.Errorf("listener_filters[%d] (%s): no typed_config", i, f.GetName())
			}
		default:
			return false, fmt.Errorf("listener_filters[%d]: didn't find a registered implementation for '%s' with type URL: '%s'",
				i, f.GetName(), f.GetTypedConfig().GetTypeUrl())
		}
	}
	return inspect, nil
}

// errPeeked stops the handshake once the ClientHello was read.
var errPeeked = errors.New("client hello peeked")

// recorder keeps what was read from the connection, and drops what the TLS stack writes
// (its alerts): peeking must leave the client's stream untouched.
type recorder struct {
	net.Conn
	buf bytes.Buffer
}

func (r *recorder) Read(b []byte) (int, error) {
	n, err := r.Conn.Read(b)
	r.buf.Write(b[:n])
	return n, err
}

func (r *recorder) Write(b []byte) (int, error) { return len(b), nil }

// peekHello reads the connection's first bytes as the TLS inspector does: a ClientHello
// gives "tls" with its SNI and ALPN, anything else "raw_buffer". The returned connection
// replays what was read. timedOut reports that the client sent too little in time.
func peekHello(conn net.Conn, timeout time.Duration) (net.Conn, hello, bool) {
	rec := &recorder{Conn: conn}
	var h hello
	if timeout > 0 {
		_ = conn.SetReadDeadline(time.Now().Add(timeout))
	}
	err := tls.Server(rec, &tls.Config{GetConfigForClient: func(ch *tls.ClientHelloInfo) (*tls.Config, error) {
		h = hello{tls: true, sni: ch.ServerName, alpn: ch.SupportedProtos}
		return nil, errPeeked
	}}).Handshake()
	_ = conn.SetReadDeadline(time.Time{})
	var ne net.Error
	timedOut := !h.tls && errors.As(err, &ne) && ne.Timeout()
	return &replayConn{Conn: conn, buf: rec.buf.Bytes()}, h, timedOut
}

// replayConn reads the peeked bytes before the rest of the connection.
type replayConn struct {
	net.Conn
	buf []byte
}

func (c *replayConn) Read(b []byte) (int, error) {
	if len(c.buf) > 0 {
		n := copy(b, c.buf)
		c.buf = c.buf[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// SecureConn is a downstream connection after its TLS handshake: the HTTP connection
// manager reads its TLS description (streaminfo, XFCC) from it.
type SecureConn struct {
	*tls.Conn
	info *streaminfo.TLS
}

// DownstreamTLS describes the connection's TLS.
func (c *SecureConn) DownstreamTLS() *streaminfo.TLS { return c.info }

// PeerChain is the peer's certificate chain as it sent it (XFCC's Chain).
func (c *SecureConn) PeerChain() []*x509.Certificate {
	return c.Conn.ConnectionState().PeerCertificates
}
