package e2e

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
)

// 4b. Seed 004: on SIGTERM the agent drains the proxy's inbound listeners
// (POST /drain_listeners?inboundonly&graceful) and the proxy drains them Envoy's way: for
// --drain-time-s the listener keeps accepting while responses tell clients to go away
// (HTTP/1.1 Connection: close, HTTP/2 GOAWAY; every one of them, with the immediate strategy
// the agent asks for as pilot-agent does), then it stops accepting. The outbound listeners of the same proxy are not drained: the
// application keeps calling out until the proxy quits.
//
// The scale-down tests cannot see this: discovery takes the stopping pod out of EDS, so no
// mesh client opens a connection to it after SIGTERM. Here a client outside the mesh keeps
// opening new inbound connections, and reuses kept-alive ones, after SIGTERM.
func TestInboundDrainOnSIGTERM(t *testing.T) {
	const backendHost = "backend.default.svc.cluster.local:9081"
	m, ctx := startMesh(t, frontBack())
	back, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	// --drain-time-s 1 (drainDuration), and the proxy quits terminationDrainDuration after
	// the drain began: time to see the inbound drain end while the proxy still serves.
	front, err := m.AddPod(ctx, frontendPod(func(s *localmesh.PodSpec) {
		s.TerminationDrainDuration = 6 * time.Second
		s.Env = []string{`PROXY_CONFIG={"terminationDrainDuration":"6s","drainDuration":"1s"}`}
		// Istio's stats inclusion leaves the HTTP connection managers' stats out.
		s.Annotations = map[string]string{"sidecar.istio.io/statsInclusionSuffixes": "downstream_cx_drain_close"}
	}))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return inClusters(front, back.IP) }, 30*time.Second, 20*time.Millisecond)

	inbound := front.IP + ":" + strconv.Itoa(front.Spec.Port)
	outbound := front.Localhost + ":9081"
	// Connections opened before SIGTERM and kept alive: their responses carry no
	// Connection: close yet (otherwise the close below would prove nothing).
	inKept, outKept := dialHTTP1(t, inbound), dialHTTP1(t, outbound)
	for _, c := range []struct {
		conn       *http1Conn
		host, path string
	}{{inKept, inbound, "/healthz"}, {outKept, backendHost, "/"}} {
		resp, err := c.conn.get(c.host, c.path)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.False(t, resp.Close, "no drain before SIGTERM")
	}
	inH2 := dialH2C(t, inbound)
	resp, err := inH2.get(inbound, "/healthz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.False(t, inH2.cc.State().Closing, "no GOAWAY before SIGTERM")

	require.NoError(t, front.Agent().Signal(syscall.SIGTERM))
	d := probeInboundDrain(t, inbound, inKept, inH2)
	t.Logf("after SIGTERM: %d new inbound connections answered, %d with Connection: close; %d accepted after the first close",
		d.answered, d.drainClosed, d.acceptedAfterClose)
	require.Positive(t, d.drainClosed,
		"no new inbound connection was told to close (Connection: close) before the listener stopped accepting: the inbound listeners were never drained")
	assert.Positive(t, d.acceptedAfterClose, "the listener keeps accepting new connections while it drains, as Envoy's")
	assert.True(t, d.keptClosed, "the kept-alive inbound connection was told to close (Connection: close) and closed; it broke instead: %v", d.keptErr)
	require.Eventually(t, func() bool { return inH2.cc.State().Closing }, 5*time.Second, 10*time.Millisecond,
		"the HTTP/2 inbound connection got a GOAWAY")

	// The inbound drain is over (its listener refuses connections): the outbound
	// listeners, had they been drained too, would now close every connection.
	require.True(t, front.Running(), "the agent waits terminationDrainDuration before stopping the proxy")
	resp, err = outKept.get(backendHost, "/")
	require.NoError(t, err, "the kept-alive outbound connection still works")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.False(t, resp.Close, "outbound responses carry no Connection: close: the outbound listeners are not drained")
	fresh := dialHTTP1(t, outbound)
	resp, err = fresh.get(backendHost, "/")
	require.NoError(t, err, "a new outbound connection is accepted")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.False(t, resp.Close, "outbound responses carry no Connection: close: the outbound listeners are not drained")

	stats := drainCloseStats(t, ctx, front)
	assert.Positive(t, stats["inbound"], "the proxy counts the inbound drain closes: %v", stats)
	assert.Zero(t, stats["outbound"], "no outbound connection was drain-closed: %v", stats)
}

// inboundDrain is what probeInboundDrain saw after SIGTERM.
type inboundDrain struct {
	answered, drainClosed int   // new connections answered; of those, told to close
	acceptedAfterClose    int   // new connections accepted after the first drain close
	keptClosed            bool  // the kept-alive HTTP/1.1 connection was told to close
	keptErr               error // how the kept-alive connection broke instead
}

// probeInboundDrain opens a new inbound connection every 10 ms, and reuses kept and h2,
// until the listener refuses connections (the drain time is over), checking that every
// connection told to close is closed by the proxy.
func probeInboundDrain(t *testing.T, addr string, kept *http1Conn, h2 *h2cConn) inboundDrain {
	t.Helper()
	var d inboundDrain
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-deadline:
			t.Fatalf("the inbound listener still accepts 30 s after SIGTERM (%+v)", d)
		case <-tick.C:
		}
		c, err := tryHTTP1(addr)
		if errors.Is(err, syscall.ECONNREFUSED) {
			return d
		}
		require.NoError(t, err, "a new inbound connection after SIGTERM")
		resp, err := c.get(addr, "/healthz")
		require.NoError(t, err, "a new inbound connection after SIGTERM is served (%+v)", d)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		d.answered++
		if d.drainClosed > 0 {
			d.acceptedAfterClose++
		}
		if resp.Close {
			d.drainClosed++
			assert.True(t, c.closedByPeer(), "a connection told to close is closed by the proxy")
		}
		c.close()
		if !d.keptClosed && d.keptErr == nil {
			resp, err := kept.get(addr, "/healthz")
			switch {
			case err != nil:
				d.keptErr = err
			case resp.Close:
				d.keptClosed = true
				assert.True(t, kept.closedByPeer(), "the kept-alive connection told to close is closed by the proxy")
			}
		}
		if h2.cc.CanTakeNewRequest() {
			_, _ = h2.get(addr, "/healthz") // a GOAWAY may race this request; the state tells
		}
	}
}

// drainCloseStats sums the proxy's http.<prefix>.downstream_cx_drain_close counters by
// direction (the stat prefixes are inbound_... and outbound_...).
func drainCloseStats(t *testing.T, ctx context.Context, p *localmesh.Pod) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for name, n := range proxyCounters(t, ctx, p, "downstream_cx_drain_close$") {
		for _, dir := range []string{"inbound", "outbound"} {
			if strings.HasPrefix(name, "http."+dir+"_") {
				out[dir] += n
			}
		}
	}
	return out
}

// http1Conn is one HTTP/1.1 client connection, so the test decides which requests share
// a connection and sees the Connection header of each response.
type http1Conn struct {
	c net.Conn
	r *bufio.Reader
}

func tryHTTP1(addr string) (*http1Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &http1Conn{c: c, r: bufio.NewReader(c)}, nil
}

func dialHTTP1(t *testing.T, addr string) *http1Conn {
	t.Helper()
	c, err := tryHTTP1(addr)
	require.NoError(t, err)
	t.Cleanup(c.close)
	return c
}

func (h *http1Conn) close() { _ = h.c.Close() }

// get sends GET path with Host host and reads the whole response.
func (h *http1Conn) get(host, path string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+host+path, nil)
	if err != nil {
		return nil, err
	}
	_ = h.c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := req.Write(h.c); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(h.r, req)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, err
}

// closedByPeer reports whether the other side closes the connection (EOF) within 5 s.
func (h *http1Conn) closedByPeer() bool {
	_ = h.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := h.r.ReadByte()
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// h2cConn is one HTTP/2 (prior knowledge, cleartext) client connection.
type h2cConn struct{ cc *http2.ClientConn }

func dialH2C(t *testing.T, addr string) *h2cConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	cc, err := (&http2.Transport{AllowHTTP: true}).NewClientConn(c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return &h2cConn{cc: cc}
}

func (h *h2cConn) get(host, path string) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := h.cc.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, err
}
