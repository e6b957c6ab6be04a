package upstream

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// drainingServer is an HTTP/1.1 server that keeps its connections alive until
// closeAll closes every one of them at once, as a peer ending a drain does.
type drainingServer struct {
	lis   net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newDrainingServer(t *testing.T) *drainingServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &drainingServer{lis: lis}
	t.Cleanup(func() { _ = lis.Close(); s.closeAll() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			go s.serve(c)
		}
	}()
	return s
}

func (s *drainingServer) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

func (s *drainingServer) accepted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *drainingServer) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.conns = nil
}

func get(t *testing.T, c *Cluster, h *Host) (int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://x/", nil)
	require.NoError(t, err)
	resp, err := c.RoundTrip(req, h, false)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// TestH1PoolPeerClosedEveryIdleConnection: the peer closed all the pooled connections
// while they were idle (the end of its drain). A request without a body that finds its
// reused connection closed before any response byte is replayed on a new connection,
// not on the next pooled one, which the peer closed too.
func TestH1PoolPeerClosedEveryIdleConnection(t *testing.T) {
	srv := newDrainingServer(t)
	c, err := newCluster(&clusterv3.Cluster{Name: "c"}, "", stats.NewStore(nil, nil).Scope("cluster.c"), nil)
	require.NoError(t, err)
	c.transports = &transports{} // plaintext
	t.Cleanup(c.Close)
	h := &Host{Address: srv.lis.Addr().String(), st: &hostState{}}

	// Three connections in the pool, idle.
	const n = 3
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pc, err := c.h1.dial(context.Background(), h)
			if !assert.NoError(t, err) {
				return
			}
			c.h1.put(pc)
		}()
	}
	wg.Wait()
	require.Len(t, c.h1.idle[h.Address], n)
	require.Eventually(t, func() bool { return srv.accepted() == n }, 5*time.Second, time.Millisecond)
	srv.closeAll()
	time.Sleep(50 * time.Millisecond) // the FINs arrive

	for i := range n {
		code, err := get(t, c, h)
		require.NoError(t, err, "request %d after the peer closed the pooled connections", i)
		assert.Equal(t, http.StatusOK, code)
	}
	assert.Equal(t, uint64(n+1), c.Stats.UpstreamCxTotal.Value(), "one new connection, kept for the next requests")
}
