package server

import (
	"net"
	"time"
)

// ProxyReadTimeout is how long a connected proxy may leave what the server sent it unread
// before the kernel gives up on the connection (TCP_USER_TIMEOUT). gRPC would set it to the
// keepalive timeout, 10 s (gRFC A18), which cuts a live proxy that is busy applying a large
// config or starved of CPU: it reconnects and is sent everything again, at the worst moment.
// A dead proxy is still found by the keepalive pings on a quiet connection (30 s, then 10 s
// for the answer), and by this timeout on one with data outstanding.
const ProxyReadTimeout = time.Minute

// readTimeoutListener gives every accepted TCP connection ProxyReadTimeout, and hands it to
// gRPC as a plain net.Conn: gRPC sets its own TCP_USER_TIMEOUT only on a *net.TCPConn.
type readTimeoutListener struct{ net.Listener }

func (l readTimeoutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	if err := setUserTimeout(tc, ProxyReadTimeout); err != nil {
		return c, nil //nolint:nilerr // the option is not essential: gRPC's then applies
	}
	return acceptedConn{tc}, nil
}

// acceptedConn is a TCP connection that gRPC does not take for one.
type acceptedConn struct{ net.Conn }
