package sidecar_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
)

type result struct {
	code int
	body string
	err  error
	at   time.Time
}

// request sends one request on its own connection and reports when it finished.
func request(url string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get(url)
		if err != nil {
			ch <- result{err: err, at: time.Now()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ch <- result{code: resp.StatusCode, body: string(b), at: time.Now()}
	}()
	return ch
}

// drainCloses sends one request that asks for keep-alive on a new connection and reports
// whether the response said Connection: close.
func drainCloses(url string) (bool, error) {
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: tr}).Get(url)
	if err != nil {
		return false, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
	}
	return resp.Close, nil
}

// closes is drainCloses for a request that must succeed.
func closes(t *testing.T, url string) bool {
	t.Helper()
	c, err := drainCloses(url)
	require.NoError(t, err)
	return c
}

// slowApp is the pod's application: it answers 200, after ?ms=<n> milliseconds on /slow.
func slowApp(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ms, err := strconv.Atoi(r.URL.Query().Get("ms")); err == nil && r.URL.Path == "/slow" {
			select {
			case <-time.After(time.Duration(ms) * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// configured starts a pod whose proxy gets an inbound (18080) and an outbound (19080)
// listener routing to the pod's application, and records the admin POSTs it receives
// (meshproxy's test hook) in the file it returns.
func configured(t *testing.T, proxyConfig string, env ...string) (*running, string) {
	posts := filepath.Join(t.TempDir(), "admin-posts")
	r := start(t, pod{env: env, proxyConfig: proxyConfig, proxyEnv: []string{proxytest.EnvAdminPosts + "=" + posts}})
	require.Eventually(t, r.readyIs(503, "INITIALIZING"), 10*time.Second, 20*time.Millisecond, "the proxy waits for config")
	r.discovery.Configure(proxytest.Config{Inbound: []string{r.ip + ":18080"}, Outbound: []string{r.ip + ":19080"},
		Upstream: slowApp(t)})
	require.Eventually(t, r.readyIs(200, ""), 5*time.Second, 20*time.Millisecond)
	return r, posts
}

func TestDrainFixedDuration(t *testing.T) {
	const drain = 800 * time.Millisecond
	r, postsFile := configured(t, `"terminationDrainDuration":"0.8s"`)

	inbound, outbound := fmt.Sprintf("http://%s:18080/", r.ip), fmt.Sprintf("http://%s:19080/", r.ip)
	require.False(t, closes(t, inbound), "no Connection: close before SIGTERM")
	inflight := request(inbound + "slow?ms=400")
	require.Eventually(t, func() bool {
		n, err := r.agent.Admin().ActiveConnections(t.Context())
		return err == nil && n >= 1
	}, 5*time.Second, 5*time.Millisecond, "the request is in flight")
	sigterm := time.Now()
	r.cancel()

	require.Eventually(t, r.readyIs(503, "draining"), 5*time.Second, 5*time.Millisecond)
	var posts []string
	require.Eventually(t, func() bool {
		p, err := proxytest.AdminPosts(postsFile)
		posts = p
		return err == nil && len(p) > 0
	}, 5*time.Second, 5*time.Millisecond, "the agent asks the proxy to drain")
	assert.Equal(t, []string{"/drain_listeners?inboundonly&graceful"}, posts,
		"inbound listeners only, gracefully (Istio's call), and nothing else before the drain time")
	// The proxy drains gradually (Envoy's default strategy, which the agent's command
	// line leaves in force): ever more new inbound connections are told to close.
	assert.Eventually(t, func() bool { c, err := drainCloses(inbound); return err == nil && c }, drain, 5*time.Millisecond,
		"a new inbound connection is told to close while the proxy drains")
	assert.False(t, closes(t, outbound), "outbound listeners are not drained")
	out := <-request(outbound)
	require.NoError(t, out.err)
	assert.Equal(t, 200, out.code, "outbound traffic keeps working while inbound drains")

	in := <-inflight
	require.NoError(t, in.err)
	assert.Equal(t, 200, in.code, "the in-flight inbound request completes")

	require.NoError(t, r.wait(t, 10*time.Second))
	took := r.stopped.Sub(sigterm)
	assert.GreaterOrEqual(t, took, drain, "the agent waits terminationDrainDuration")
	assert.Less(t, took, drain+2*time.Second, "and then stops the proxy")
	posts, err := proxytest.AdminPosts(postsFile)
	require.NoError(t, err)
	assert.Equal(t, []string{"/drain_listeners?inboundonly&graceful", "/quitquitquit"}, posts, "then it asks the proxy to quit")
}

func TestDrainExitOnZeroActiveConnections(t *testing.T) {
	const minimum = 200 * time.Millisecond
	r, _ := configured(t,
		// A long fixed drain, to show it is not what ends this mode.
		`"terminationDrainDuration":"30s"`,
		"EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true", "MINIMUM_DRAIN_DURATION=200ms")

	inflight := request(fmt.Sprintf("http://%s:18080/slow?ms=1500", r.ip))
	require.Eventually(t, func() bool {
		n, err := r.agent.Admin().ActiveConnections(t.Context())
		return err == nil && n >= 1
	}, 5*time.Second, 5*time.Millisecond)
	sigterm := time.Now()
	r.cancel()

	in := <-inflight
	require.NoError(t, in.err)
	assert.Equal(t, 200, in.code, "the request outlives SIGTERM and completes")

	require.NoError(t, r.wait(t, 10*time.Second))
	assert.GreaterOrEqual(t, r.stopped.Sub(sigterm), minimum, "never before MINIMUM_DRAIN_DURATION")
	assert.False(t, r.stopped.Before(in.at), "not before the last connection closed")
	// The poll runs every 50 ms; quitting and reaping the proxy takes a little more.
	assert.Less(t, r.stopped.Sub(in.at), 2*time.Second, "soon after the connections reach zero")
}

func TestDrainExitOnZeroWithoutConnectionsStopsAfterMinimum(t *testing.T) {
	r := start(t, pod{env: []string{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS=1", "MINIMUM_DRAIN_DURATION=300ms"},
		proxyConfig: `"terminationDrainDuration":"30s"`, configured: true})
	require.Eventually(t, r.epochLive(0), 10*time.Second, 20*time.Millisecond)
	sigterm := time.Now()
	r.cancel()
	require.NoError(t, r.wait(t, 10*time.Second))
	took := r.stopped.Sub(sigterm)
	assert.GreaterOrEqual(t, took, 300*time.Millisecond)
	assert.Less(t, took, 3*time.Second)
}
