package loadgen

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func server(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.URL
}

func get(url string) func(int) (*http.Request, error) {
	return func(i int) (*http.Request, error) {
		return http.NewRequest(http.MethodGet, url+"/"+strconv.Itoa(i), nil)
	}
}

func TestCountsStatusesAndClasses(t *testing.T) {
	var n atomic.Int64
	url := server(t, func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if i%4 == 0 {
			w.WriteHeader(503)
			return
		}
		w.Header().Set("x-version", map[bool]string{true: "v1", false: "v2"}[i%2 == 1])
	})
	res, err := Run(context.Background(), Config{Requests: 200, Concurrency: 4, Request: get(url),
		Classify: func(r *http.Response, _ []byte) string { return r.Header.Get("x-version") }})
	require.NoError(t, err)
	assert.Equal(t, 200, res.Sent)
	assert.Equal(t, 150, res.Succeeded)
	assert.Equal(t, 50, res.Failed)
	assert.Equal(t, map[int]int{200: 150, 503: 50}, res.Status)
	assert.Equal(t, 100, res.Classes["v1"])
	assert.Equal(t, 50, res.Classes["v2"])
	assert.InDelta(t, 100.0/150, res.Fraction("v1"), 1e-9)
	assert.Greater(t, res.Quantile(0.99), time.Duration(0))
	assert.GreaterOrEqual(t, res.Quantile(0.99), res.Quantile(0.5))
}

func TestTransportErrorsAreFailures(t *testing.T) {
	s := httptest.NewServer(http.NotFoundHandler())
	url := s.URL
	s.Close() // nothing listens any more
	res, err := Run(context.Background(), Config{Requests: 5, Request: get(url)})
	require.NoError(t, err)
	assert.Equal(t, 5, res.Failed)
	assert.Equal(t, 0, res.Succeeded)
	assert.NotEmpty(t, res.Errors)
}

// The open loop paces requests: ten at 50 per second cannot take less than 9/50 s.
func TestRateIsPaced(t *testing.T) {
	url := server(t, func(http.ResponseWriter, *http.Request) {})
	res, err := Run(context.Background(), Config{Rate: 50, Requests: 10, Request: get(url)})
	require.NoError(t, err)
	assert.Equal(t, 10, res.Succeeded)
	assert.GreaterOrEqual(t, res.Elapsed, 180*time.Millisecond)
}

func TestStopAndSnapshotWhileRunning(t *testing.T) {
	url := server(t, func(http.ResponseWriter, *http.Request) {})
	g, err := Start(context.Background(), Config{Rate: 200, Request: get(url)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { s := g.Snapshot(); return s.Succeeded >= 10 }, 10*time.Second, 5*time.Millisecond)
	res := g.Stop()
	assert.GreaterOrEqual(t, res.Succeeded, 10)
	assert.Equal(t, res.Sent, res.Succeeded+res.Failed, "Stop waits for the requests in flight")
	<-g.Done()
}

func TestBadConfig(t *testing.T) {
	_, err := Run(context.Background(), Config{Requests: 1})
	assert.ErrorContains(t, err, "Request is required")
	_, err = Run(context.Background(), Config{Request: get("http://x")})
	assert.ErrorContains(t, err, "Requests or Duration")
	_, err = Start(context.Background(), Config{Rate: -1, Request: get("http://x")})
	assert.ErrorContains(t, err, "negative")
}
