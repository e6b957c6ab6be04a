package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// loadResult counts a steady load's outcomes.
type loadResult struct {
	mu       sync.Mutex
	ok, fail int
	errs     map[string]int
}

func (r *loadResult) add(err string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == "" {
		r.ok++
		return
	}
	r.fail++
	r.errs[err]++
}

func (r *loadResult) counts() (int, int, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	errs := map[string]int{}
	for k, v := range r.errs {
		errs[k] = v
	}
	return r.ok, r.fail, errs
}

// steadyLoad sends GETs to url from workers keep-alive clients until ctx ends.
func steadyLoad(ctx context.Context, url string, workers int) (*loadResult, *sync.WaitGroup) {
	res := &loadResult{errs: map[string]int{}}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			for ctx.Err() == nil {
				resp, err := c.Get(url)
				if err != nil {
					res.add(err.Error())
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					res.add(fmt.Sprintf("%d %s", resp.StatusCode, b))
					continue
				}
				res.add("")
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	return res, &wg
}

// TestFilterChainOnlyUpdateUnderLoad: a sidecar's steady mTLS load to a peer whose
// inbound listener's filter chains change fails no request, as with Envoy's filter chain
// only update: the listen socket stays; switching between PERMISSIVE (mTLS and plaintext
// chains) and STRICT (the mTLS chain only) keeps the unchanged mTLS chain with its
// connections; a changed mTLS chain drains (Connection: close on the next response, the
// idle connections closed after the drain time) while the new one takes new connections.
func TestFilterChainOnlyUpdateUnderLoad(t *testing.T) {
	t.Run("unchanged mTLS chain", func(t *testing.T) {
		a, b := chainUpdateUnderLoad(t, func(i int) *listenerv3.Listener {
			return inboundListener(t, "in", "r-in", i%2 == 0) // odd: STRICT, even: PERMISSIVE
		})
		// The mTLS chain is the same in every version: its connections were never
		// drained, so the client kept its first connections.
		assert.LessOrEqual(t, a.Stat("cluster.b.upstream_cx_total"), int64(loadWorkers+2),
			"connections of the unchanged mTLS chain were closed")
		assert.Zero(t, b.Stat("http.in.downstream_cx_drain_close"))
	})
	t.Run("changed mTLS chain", func(t *testing.T) {
		a, b := chainUpdateUnderLoad(t, func(i int) *listenerv3.Listener {
			l := inboundListener(t, "in", "r-in", false)
			l.FilterChains[0].Name = fmt.Sprintf("mtls-%d", i%2)
			return l
		})
		assert.Greater(t, a.Stat("cluster.b.upstream_cx_total"), int64(loadWorkers+2),
			"connections of the changed mTLS chain were not drained")
		assert.Positive(t, b.Stat("http.in.downstream_cx_drain_close"), "no response closed a draining connection")
	})
}

const loadWorkers = 8

// inboundPeer runs proxy b (identity "b" from pk) with the inbound listener l routing to
// an app; set replaces the listener.
func inboundPeer(t *testing.T, pk *pki, l *listenerv3.Listener, args ...string) (b *proxytest.Proxy, set func(version string, l *listenerv3.Listener)) {
	t.Helper()
	app := newUpstream(t, "app", false, nil)
	_, bPath := startSDS(t, pk.bundle(t, "b", time.Now(), time.Hour))
	cp := newControlPlane(t, "")
	set = func(version string, l *listenerv3.Listener) {
		cp.set(version, map[resourcev3.Type][]types.Resource{
			resourcev3.ClusterType:  {edsCluster("app")},
			resourcev3.EndpointType: {endpoints("app", addr(app))},
			resourcev3.ListenerType: {l},
			resourcev3.RouteType:    {routeTo("r-in", "app")},
		})
	}
	set("v0", l)
	b = proxytest.Start(t, proxytest.Options{Bootstrap: sdsBootstrap(cp.addr, bPath), NoWait: true, Args: args})
	b.WaitReady(20 * time.Second)
	return b, set
}

// chainUpdateUnderLoad runs proxy b with listener "in" as version(0), proxy a sending to
// it over mutual TLS, a steady load through a, and ten updates of b's listener to
// version(i). It requires that no request failed and that the socket stayed.
func chainUpdateUnderLoad(t *testing.T, version func(i int) *listenerv3.Listener) (a, b *proxytest.Proxy) {
	t.Helper()
	pk := newPKI(t)
	now := time.Now()
	b, setB := inboundPeer(t, pk, version(0))
	bConfig := func(i int) { setB(fmt.Sprintf("v%d", i), version(i)) }
	in := b.ListenerAddr("in")

	_, aPath := startSDS(t, pk.bundle(t, "a", now, time.Hour))
	cpA := newControlPlane(t, "")
	cpA.set("v1", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {mtlsCluster(t, "b", spiffe("b"))},
		resourcev3.EndpointType: {istioEndpoints("b", in)},
		resourcev3.ListenerType: {httpListener(t, "out", "r-out", corev3.TrafficDirection_OUTBOUND)},
		resourcev3.RouteType:    {routeTo("r-out", "b")},
	})
	a = proxytest.Start(t, proxytest.Options{Bootstrap: sdsBootstrap(cpA.addr, aPath), NoWait: true})
	a.WaitReady(20 * time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	res, wg := steadyLoad(ctx, "http://"+a.ListenerAddr("out")+"/", loadWorkers)
	defer func() { cancel(); wg.Wait() }()
	time.Sleep(300 * time.Millisecond)
	for i := 1; i <= 10; i++ {
		bConfig(i)
		want := int64(i)
		b.Eventually(10*time.Second, "the listener update applied", func() bool {
			return b.Stat("listener_manager.listener_modified") >= want
		})
		time.Sleep(300 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	ok, failed, errs := res.counts()
	t.Logf("load: ok %d, failed %d, errors %v", ok, failed, errs)
	require.Greater(t, ok, 200, "the load ran")
	assert.Zero(t, failed, "requests failed while the listener's filter chains changed: %v", errs)
	assert.Equal(t, in, b.ListenerAddr("in"), "the listen socket stays")
	return a, b
}

// TestFilterChainOnlyUpdateDrainsRemovedChainGracefully: PERMISSIVE to STRICT, seen
// from a keep-alive connection on each chain. The plaintext chain is removed: its idle
// connection is not closed under the client; its next request is answered with
// Connection: close (Envoy's drain sequence); new plaintext connections, and one whose
// first bytes arrive after the update, are refused.
// The mTLS chain is unchanged: its connection serves on as if nothing happened.
func TestFilterChainOnlyUpdateDrainsRemovedChainGracefully(t *testing.T) {
	pk := newPKI(t)
	now := time.Now()
	// A long drain time: whatever closes a connection here is not its end.
	b, setB := inboundPeer(t, pk, inboundListener(t, "in", "r-in", true), "--drain-time-s", "30")
	in := b.ListenerAddr("in")

	plain, err := net.DialTimeout("tcp", in, 5*time.Second)
	require.NoError(t, err)
	defer plain.Close()
	secure, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", in,
		&tls.Config{Certificates: clientCert(pk.bundle(t, "a", now, time.Hour)), InsecureSkipVerify: true, //nolint:gosec // a test peer
			NextProtos: []string{"http/1.1"}})
	require.NoError(t, err)
	defer secure.Close()
	// A plaintext connection whose first bytes come after the update: its chain is picked
	// from the version active once the TLS inspector has read them.
	pending, err := net.DialTimeout("tcp", in, 5*time.Second)
	require.NoError(t, err)
	defer pending.Close()
	plainR, secureR := bufio.NewReader(plain), bufio.NewReader(secure)
	for _, c := range []struct {
		conn net.Conn
		r    *bufio.Reader
	}{{plain, plainR}, {secure, secureR}} {
		resp, err := getOn(c.conn, c.r)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.False(t, resp.Close)
	}

	setB("v2", inboundListener(t, "in", "r-in", false))
	b.Eventually(10*time.Second, "the listener update applied", func() bool {
		return b.Stat("listener_manager.listener_modified") == 1
	})
	time.Sleep(200 * time.Millisecond) // a close of the idle connections would have arrived

	resp, err := getOn(secure, secureR)
	require.NoError(t, err, "the unchanged mTLS chain's connection")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.False(t, resp.Close, "the unchanged mTLS chain's connection is drained")

	resp, err = getOn(plain, plainR)
	require.NoError(t, err, "the removed chain's idle connection was closed before the drain time")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.True(t, resp.Close, "the removed chain's response does not close the connection")
	_, err = plainR.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "the server closes the connection after its Connection: close response")

	_, err = getOn(pending, bufio.NewReader(pending))
	assert.Error(t, err, "a connection inspected after the update was served by the removed plaintext chain")
	_, err = plaintextRequest(in)
	assert.Error(t, err, "a new plaintext connection is served by a STRICT listener")
	assert.Equal(t, in, b.ListenerAddr("in"))
}

// getOn sends a GET over conn and reads its response.
func getOn(conn net.Conn, r *bufio.Reader) (*http.Response, error) {
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp, err
}

// plaintextRequest is a GET over a new plaintext connection.
func plaintextRequest(addr string) (*http.Response, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return getOn(conn, bufio.NewReader(conn))
}
