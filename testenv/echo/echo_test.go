package echo

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// start serves cfg on a fresh loopback port and returns its address.
func start(t *testing.T, cfg Config) string {
	t.Helper()
	return startOn(t, cfg, "127.0.0.1:0")
}

func startOn(t *testing.T, cfg Config, addr string) string {
	t.Helper()
	srv, err := New(cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

func get(t *testing.T, url string, headers ...string) (int, *Answer, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var a Answer
	if strings.HasPrefix(resp.Header.Get("content-type"), "application/json") {
		require.NoError(t, json.Unmarshal(body, &a), string(body))
	}
	return resp.StatusCode, &a, resp.Header
}

func TestAnswersWhoItIsAndWhatItGot(t *testing.T) {
	addr := start(t, Config{Service: "ratings", Version: "v1", Pod: "ratings-1"})
	status, a, h := get(t, "http://"+addr+"/ratings/7?x=1", "x-user", "alice")
	assert.Equal(t, 200, status)
	assert.Equal(t, "ratings", a.Service)
	assert.Equal(t, "v1", a.Version)
	assert.Equal(t, "ratings-1", a.Pod)
	assert.Equal(t, "/ratings/7?x=1", a.Path)
	assert.Equal(t, "alice", a.Headers["x-user"])
	assert.Equal(t, "v1", h.Get("x-echo-version"))
}

func TestCallsChainAndPropagateHeaders(t *testing.T) {
	ratings := start(t, Config{Service: "ratings", Version: "v1"})
	reviews := start(t, Config{Service: "reviews", Version: "v2", Calls: []string{"http://" + ratings + "/"}})
	front := start(t, Config{Service: "productpage", Calls: []string{"http://" + reviews + "/"}})

	status, a, _ := get(t, "http://"+front+"/", "x-request-id", "r-1", "x-not-propagated", "no")
	require.Equal(t, 200, status)
	require.Len(t, a.Upstream, 1)
	rv := a.Upstream[0].Answer
	require.NotNil(t, rv)
	assert.Equal(t, "reviews", rv.Service)
	assert.Equal(t, "r-1", rv.Headers["x-request-id"])
	assert.Empty(t, rv.Headers["x-not-propagated"])
	require.Len(t, rv.Upstream, 1)
	assert.Equal(t, "ratings", rv.Upstream[0].Answer.Service)
}

// With an outbound address, calls go there and the URL's host:port is the Host header:
// the sidecar's outbound listener routes by it.
func TestOutboundAddressKeepsTheServiceAsHost(t *testing.T) {
	// A "sidecar" on 127.0.0.2 that records the Host it was asked for.
	got := make(chan string, 1)
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	sidecar := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Host
		w.Header().Set("content-type", "application/json")
		_ = json.NewEncoder(w).Encode(Answer{Service: "reviews"})
	})}
	go func() { _ = sidecar.Serve(ln) }()
	t.Cleanup(func() { _ = sidecar.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())

	front := start(t, Config{Service: "productpage", OutboundAddress: "127.0.0.2",
		Calls: []string{"http://reviews.default.svc.cluster.local:" + port + "/"}})
	status, a, _ := get(t, "http://"+front+"/")
	require.Equal(t, 200, status, a)
	assert.Equal(t, "reviews.default.svc.cluster.local:"+port, <-got)
	assert.Equal(t, "reviews", a.Upstream[0].Answer.Service)
}

func TestFailedCallIsABadGateway(t *testing.T) {
	back := start(t, Config{Service: "reviews"})
	front := start(t, Config{Service: "productpage", Calls: []string{"http://" + back + "/status/503"}})
	// Calls go to the URL's path; "/status/503" makes the back end fail.
	status, a, _ := get(t, "http://"+front+"/")
	assert.Equal(t, http.StatusBadGateway, status)
	assert.Equal(t, 503, a.Upstream[0].Status)
}

func TestKnobs(t *testing.T) {
	addr := start(t, Config{Service: "reviews", Version: "v1", FailEvery: 3})
	var statuses []int
	for i := 0; i < 6; i++ {
		s, _, _ := get(t, "http://"+addr+"/x")
		statuses = append(statuses, s)
	}
	assert.Equal(t, []int{200, 200, 503, 200, 200, 503}, statuses, "one request in three fails")

	s, _, _ := get(t, "http://"+addr+"/status/418")
	assert.Equal(t, 418, s)
	s, _, _ = get(t, "http://"+addr+"/x", "x-echo-status", "429")
	assert.Equal(t, 429, s)
	s, _, _ = get(t, "http://"+addr+"/status/abc")
	assert.Equal(t, 400, s)

	begin := time.Now()
	s, _, _ = get(t, "http://"+addr+"/delay/150ms")
	assert.Equal(t, 200, s)
	assert.GreaterOrEqual(t, time.Since(begin), 150*time.Millisecond)

	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(body), `echo_requests_total{service="reviews",version="v1"}`)
	assert.Contains(t, string(body), `echo_failed_requests_total{service="reviews",version="v1"} 2`)
}

func TestBadConfig(t *testing.T) {
	for _, c := range []Config{
		{Calls: []string{"reviews:9080"}},
		{Calls: []string{"https://reviews/"}},
		{OutboundAddress: "localhost"},
		{FailEvery: -1},
	} {
		_, err := New(c)
		assert.Error(t, err, "%+v", c)
	}
}

// Shutdown lets the request in flight finish.
func TestShutdownFinishesRequestsInFlight(t *testing.T) {
	srv, err := New(Config{Service: "reviews"})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, 5*time.Second) }()

	result := make(chan int, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/delay/300ms")
		if err != nil {
			result <- 0
			return
		}
		resp.Body.Close()
		result <- resp.StatusCode
	}()
	require.Eventually(t, func() bool { return srv.count.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	cancel()
	assert.Equal(t, 200, <-result)
	assert.NoError(t, <-done)
}

func TestStartupCall(t *testing.T) {
	back := start(t, Config{Service: "reviews"})
	ok, err := New(Config{StartupCall: "http://" + back + "/"})
	require.NoError(t, err)
	assert.NoError(t, ok.Start(context.Background()))

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := l.Addr().String()
	l.Close()
	bad, err := New(Config{StartupCall: "http://" + gone + "/"})
	require.NoError(t, err)
	assert.ErrorContains(t, bad.Start(context.Background()), "start-up call to http://"+gone)

	failing, err := New(Config{StartupCall: "http://" + back + "/status/503"})
	require.NoError(t, err)
	assert.ErrorContains(t, failing.Start(context.Background()), "503")
}

// A TCP application echoes lines; a tcp:// call is one line's round trip, and a call to
// something that does not echo fails the request.
func TestTCPServiceAndCalls(t *testing.T) {
	db := start(t, Config{Service: "mongodb", Version: "v1", TCP: true})
	front := start(t, Config{Service: "ratings", Calls: []string{"tcp://" + db}})
	status, a, _ := get(t, "http://"+front+"/", "x-request-id", "r1")
	assert.Equal(t, 200, status)
	require.Len(t, a.Upstream, 1)
	assert.Equal(t, CallResult{URL: "tcp://" + db, Status: 200}, a.Upstream[0])

	notEcho := start(t, Config{Service: "reviews"}) // HTTP: answers a line with a 400
	front = start(t, Config{Service: "ratings", Calls: []string{"tcp://" + notEcho}})
	status, a, _ = get(t, "http://"+front+"/")
	assert.Equal(t, http.StatusBadGateway, status)
	assert.NotEmpty(t, a.Upstream[0].Error)
}
