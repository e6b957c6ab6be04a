package hcm

import (
	"context"
	"net"
	"net/http"

	"github.com/wasmesh/wasmesh/testenv/proxy/internal/pending"
)

// freshConns counts the accepted connections whose first request has not reached the
// handler yet. net/http's Server.Shutdown drops a request that it reads after the shutdown
// began (conn.serve checks for it after reading, and closes the connection), so a client
// whose connection the proxy accepted before it was told to stop would read a close
// instead of its answer. Envoy serves such a request, and the drain closes the connection
// after it. Shutdown therefore waits for these connections to reach the handler, or to
// close, before it shuts the server down.
type freshConns struct{ n pending.Count }

// add counts c from its hand-over to the server (which marks it new only once it takes it).
func (f *freshConns) add(c *trackedConn) {
	c.fresh.Store(true)
	f.n.Add()
}

// done stops counting c (it may be done several times: first request, idle, close).
func (f *freshConns) done(c *trackedConn) {
	if c.fresh.Swap(false) {
		f.n.Done()
	}
}

// connState is the server's ConnState hook. A connection stops being fresh once idle (an
// HTTP/2 connection is idle as soon as its preface is read), closed or hijacked, but not
// when active: an HTTP/1.1 connection is active once its request's first bytes are read,
// before the check that would drop it.
func (f *freshConns) connState(c net.Conn, st http.ConnState) {
	tc, ok := c.(*trackedConn)
	if !ok {
		return
	}
	switch st {
	case http.StateIdle, http.StateClosed, http.StateHijacked:
		f.done(tc)
	}
}

// wait returns once no connection is fresh, or when ctx ends.
func (f *freshConns) wait(ctx context.Context) { f.n.Wait(ctx) }
