package sidecar_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
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

// closes sends one request that asks for keep-alive on a new connection and reports
// whether the response said Connection: close.
func closes(t *testing.T, url string) bool {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: tr}).Get(url)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return resp.Close
}

// adminPosts lists the admin POSTs the test proxy received (its /testproxy/admin_posts),
// none while the proxy does not answer.
func (r *running) adminPosts() []string {
	code, body := r.getFrom(r.agent.Admin().Address(), "/testproxy/admin_posts")
	if code != http.StatusOK {
		return nil
	}
	return strings.Fields(body)
}

// configured starts a pod whose proxy has an inbound (8080) and an outbound (9080) listener.
func configured(t *testing.T, env ...string) *running {
	r := start(t, pod{env: env})
	require.Eventually(t, r.readyIs(503, "INITIALIZING"), 10*time.Second, 20*time.Millisecond, "the proxy waits for config")
	r.adminPost(t, "/testproxy/xds", fmt.Sprintf(`{"inbound":["%s:18080"],"outbound":["%s:19080"]}`, r.ip, r.ip))
	require.Eventually(t, r.readyIs(200, ""), 5*time.Second, 20*time.Millisecond)
	return r
}

func TestDrainFixedDuration(t *testing.T) {
	proxytest.RequireKnobs(t)
	const drain = 800 * time.Millisecond
	r := configured(t, `PROXY_CONFIG={"discoveryAddress":"127.0.0.1:15010","terminationDrainDuration":"0.8s"}`)

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
	require.Eventually(t, func() bool { posts = r.adminPosts(); return len(posts) > 0 }, 5*time.Second, 5*time.Millisecond,
		"the agent asks the proxy to drain")
	assert.Equal(t, []string{"/drain_listeners?inboundonly&graceful"}, posts,
		"inbound listeners only, gracefully (Istio's call), and nothing else before the drain time")
	assert.True(t, closes(t, inbound), "a new inbound connection is told to close while the proxy drains")
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
}

func TestDrainExitOnZeroActiveConnections(t *testing.T) {
	proxytest.RequireKnobs(t)
	const minimum = 200 * time.Millisecond
	r := configured(t, "EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true", "MINIMUM_DRAIN_DURATION=200ms",
		// A long fixed drain, to show it is not what ends this mode.
		`PROXY_CONFIG={"discoveryAddress":"127.0.0.1:15010","terminationDrainDuration":"30s"}`)

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
	proxytest.RequireKnobs(t)
	r := start(t, pod{env: []string{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS=1", "MINIMUM_DRAIN_DURATION=300ms",
		`PROXY_CONFIG={"discoveryAddress":"127.0.0.1:15010","terminationDrainDuration":"30s"}`},
		proxyEnv: []string{"TESTPROXY_CONFIG_ON_START=1"}})
	require.Eventually(t, r.epochLive(0), 10*time.Second, 20*time.Millisecond)
	sigterm := time.Now()
	r.cancel()
	require.NoError(t, r.wait(t, 10*time.Second))
	took := r.stopped.Sub(sigterm)
	assert.GreaterOrEqual(t, took, 300*time.Millisecond)
	assert.Less(t, took, 3*time.Second)
}
