package router

import (
	"context"
	"net/http"
	"time"

	"github.com/wasmesh/wasmesh/testenv/proxy/route"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
)

// retryState decides, attempt by attempt, whether the router tries again (Envoy's
// RetryState). The forwarding loop asks it after every attempt.
type retryState interface {
	// PerTryTimeout bounds one attempt (0: only the route timeout).
	PerTryTimeout() time.Duration
	// ShouldRetry reports whether res should be retried before deadline; it may wait
	// (back-off) and returns false when ctx ends.
	ShouldRetry(ctx context.Context, res *attemptResult, deadline time.Time) bool
	// NextRequest returns the request for the next attempt (with a replayable body).
	NextRequest(prev *http.Request) *http.Request
	// ExhaustedFlag is URX when retries ran out, else 0.
	ExhaustedFlag() streaminfo.Flag
}

// newRetryState returns the route's retry state. Without a retry policy no attempt is
// retried.
func newRetryState(_ *route.Route, _ *upstream.Cluster, _ *http.Request) retryState {
	return noRetry{}
}

type noRetry struct{}

func (noRetry) PerTryTimeout() time.Duration                                { return 0 }
func (noRetry) ShouldRetry(context.Context, *attemptResult, time.Time) bool { return false }
func (noRetry) NextRequest(prev *http.Request) *http.Request                { return prev }
func (noRetry) ExhaustedFlag() streaminfo.Flag                              { return 0 }
