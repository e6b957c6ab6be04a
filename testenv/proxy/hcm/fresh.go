package hcm

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// freshConns are the accepted connections whose first request has not reached the handler
// yet. net/http's Server.Shutdown drops a request that it reads after the shutdown began
// (conn.serve checks for it after reading, and closes the connection), so a client whose
// connection the proxy accepted before it was told to stop would read a close instead of
// its answer. Envoy serves such a request, and the drain closes the connection after it.
// Shutdown therefore waits for these connections to reach the handler, or to close,
// before it shuts the server down.
type freshConns struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// connState is the server's ConnState hook. A connection stops being fresh once idle (an
// HTTP/2 connection is idle as soon as its preface is read), closed or hijacked, but not
// when active: an HTTP/1.1 connection is active once its request's first bytes are read,
// before the check that would drop it.
func (f *freshConns) connState(c net.Conn, st http.ConnState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch st {
	case http.StateNew:
		if f.conns == nil {
			f.conns = map[net.Conn]struct{}{}
		}
		f.conns[c] = struct{}{}
	case http.StateIdle, http.StateClosed, http.StateHijacked:
		delete(f.conns, c)
	}
}

// served marks c's request as handled.
func (f *freshConns) served(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

func (f *freshConns) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// wait returns once no connection is fresh, or when ctx ends.
func (f *freshConns) wait(ctx context.Context) {
	for f.count() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}
