package drain_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/wasmesh/wasmesh/agent/admin"
	"github.com/wasmesh/wasmesh/agent/drain"
)

// fakeAdmin is a proxy's admin API as the drain sees it: it records the drain request and
// answers each connection poll with the next count (-1: no such stat; -2: an error).
type fakeAdmin struct {
	mu     sync.Mutex
	counts []int
	posts  []string
	polls  int
	// drainFails makes the drain request fail (a 503).
	drainFails bool
}

func (f *fakeAdmin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Method == http.MethodPost {
		f.posts = append(f.posts, r.URL.RequestURI())
		if f.drainFails {
			http.Error(w, "no admin", http.StatusServiceUnavailable)
		}
		return
	}
	n := f.counts[min(f.polls, len(f.counts)-1)]
	f.polls++
	switch n {
	case -2:
		http.Error(w, "stats unavailable", http.StatusServiceUnavailable)
	case -1:
		fmt.Fprintln(w, "listener.admin.downstream_cx_active: 1")
	default:
		// The admin listener's own connection is not counted.
		fmt.Fprintf(w, "listener.admin.downstream_cx_active: 1\nlistener.0.0.0.0_15006.downstream_cx_active: %d\n", n)
	}
}

func (f *fakeAdmin) seen() ([]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.posts...), f.polls
}

// serve serves fa over HTTP for the test and returns an admin client of it.
func serve(t *testing.T, fa *fakeAdmin) *admin.Client {
	srv := httptest.NewServer(fa)
	t.Cleanup(srv.Close)
	a := admin.New(strings.TrimPrefix(srv.URL, "http://"), time.Second)
	t.Cleanup(func() { a.Close() })
	return a
}

// A terminating sidecar drains its inbound listeners, then waits: the fixed drain duration,
// or (EXIT_ON_ZERO_ACTIVE_CONNECTIONS) the minimum drain duration and then until no
// connection is left, polling; a proxy that reports no connection stat, or whose stats
// cannot be read, is not waited for; the kubelet's grace period (the context) ends any wait.
func TestDrainWaitsAsThePolicySays(t *testing.T) {
	const ms = time.Millisecond
	cases := []struct {
		name     string
		policy   drain.Policy
		counts   []int
		deadline time.Duration // the context's (the grace period)
		polls    int           // connection polls made (-1: more than one, as many as time allows)
		atLeast  time.Duration // the wait before Run returns
	}{
		{name: "fixed duration", policy: drain.Policy{TerminationDrainDuration: 50 * ms, PollInterval: ms}, counts: []int{5},
			deadline: 10 * time.Second, atLeast: 50 * ms},
		{name: "until the last connection ends", policy: drain.Policy{ExitOnZeroActiveConnections: true, MinimumDrainDuration: 20 * ms,
			PollInterval: 5 * ms}, counts: []int{3, 3, 3, 3, 3, 3, 3, 3, 1, 0}, deadline: 3 * time.Second, polls: 10, atLeast: 65 * ms},
		{name: "no connection stat", policy: drain.Policy{ExitOnZeroActiveConnections: true, MinimumDrainDuration: 20 * ms,
			PollInterval: 5 * ms}, counts: []int{-1}, deadline: time.Second, polls: 1, atLeast: 20 * ms},
		{name: "stats unreadable", policy: drain.Policy{ExitOnZeroActiveConnections: true, MinimumDrainDuration: 20 * ms,
			PollInterval: 5 * ms}, counts: []int{-2}, deadline: time.Second, polls: 1, atLeast: 20 * ms},
		{name: "grace period ends during the minimum", policy: drain.Policy{ExitOnZeroActiveConnections: true,
			MinimumDrainDuration: time.Hour, PollInterval: 5 * ms}, counts: []int{0}, deadline: 50 * ms, atLeast: 50 * ms},
		{name: "grace period ends with connections left", policy: drain.Policy{ExitOnZeroActiveConnections: true,
			MinimumDrainDuration: ms, PollInterval: 20 * ms}, counts: []int{2}, deadline: 200 * ms, polls: -1, atLeast: 200 * ms},
		{name: "grace period ends during the fixed duration", policy: drain.Policy{TerminationDrainDuration: time.Hour},
			counts: []int{0}, deadline: 50 * ms, atLeast: 50 * ms},
		{name: "no poll interval polls every second", policy: drain.Policy{ExitOnZeroActiveConnections: true, MinimumDrainDuration: ms},
			counts: []int{1, 0}, deadline: 5 * time.Second, polls: 2, atLeast: time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fa := &fakeAdmin{counts: tc.counts}
			a := serve(t, fa)
			start := time.Now() // before the grace period starts: took is at least its length
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			drain.Run(ctx, a, tc.policy, slog.New(slog.NewTextHandler(io.Discard, nil)))
			took := time.Since(start)
			posts, polls := fa.seen()
			assert.Equal(t, []string{"/drain_listeners?inboundonly&graceful"}, posts, "the inbound listeners are drained first")
			if tc.polls < 0 {
				assert.Greater(t, polls, 1, "polled until the grace period ended")
			} else {
				assert.Equal(t, tc.polls, polls, "connection polls")
			}
			assert.GreaterOrEqual(t, took, tc.atLeast)
		})
	}
}

// A drain request the proxy refuses is logged as a warning and the wait goes on as the
// policy says; one that succeeds logs no warning.
func TestFailedListenerDrainIsLoggedAndTheWaitGoesOn(t *testing.T) {
	for _, fails := range []bool{false, true} {
		t.Run(fmt.Sprintf("drain fails %v", fails), func(t *testing.T) {
			fa := &fakeAdmin{counts: []int{0}, drainFails: fails}
			a := serve(t, fa)
			var warnings bytes.Buffer
			log := slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))
			start := time.Now()
			drain.Run(context.Background(), a, drain.Policy{TerminationDrainDuration: 30 * time.Millisecond}, log)
			assert.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "the drain duration is waited for")
			posts, _ := fa.seen()
			assert.Len(t, posts, 1, "the drain was requested")
			if fails {
				assert.Contains(t, warnings.String(), "drain listeners failed")
			} else {
				assert.Empty(t, warnings.String())
			}
		})
	}
}

// The default policy is Istio's: a 5 s drain, or a 5 s minimum before waiting for zero
// connections polled each second.
func TestDefaultPolicyIsIstios(t *testing.T) {
	assert.Equal(t, drain.Policy{TerminationDrainDuration: 5 * time.Second, MinimumDrainDuration: 5 * time.Second, PollInterval: time.Second},
		drain.DefaultPolicy())
}
