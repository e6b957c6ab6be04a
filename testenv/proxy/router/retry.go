package router

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
)

// retryOn is a set of Envoy retry conditions (RetryPolicy.retry_on, x-envoy-retry-on,
// x-envoy-retry-grpc-on).
type retryOn uint32

const (
	retry5xx retryOn = 1 << iota
	retryGatewayError
	retryConnectFailure
	retryRetriable4xx
	retryRefusedStream
	retryRetriableStatusCodes
	retryReset
	retryGrpcCancelled
	retryGrpcDeadlineExceeded
	retryGrpcResourceExhausted
	retryGrpcUnavailable
	retryGrpcInternal
)

var retryOnNames = map[string]retryOn{
	"5xx": retry5xx, "gateway-error": retryGatewayError, "connect-failure": retryConnectFailure,
	"retriable-4xx": retryRetriable4xx, "refused-stream": retryRefusedStream,
	"retriable-status-codes": retryRetriableStatusCodes, "reset": retryReset,
	"cancelled": retryGrpcCancelled, "deadline-exceeded": retryGrpcDeadlineExceeded,
	"resource-exhausted": retryGrpcResourceExhausted, "unavailable": retryGrpcUnavailable,
	"internal": retryGrpcInternal,
}

// parseRetryOn reads a comma-separated list; unknown names are ignored, as Envoy does.
func parseRetryOn(s string) retryOn {
	var out retryOn
	for _, p := range strings.Split(s, ",") {
		out |= retryOnNames[strings.TrimSpace(p)]
	}
	return out
}

// Envoy's default back-off base interval; the maximum defaults to ten times the base.
const defaultRetryBase = 25 * time.Millisecond

// retryPolicy is a compiled RetryPolicy (route or virtual host).
type retryPolicy struct {
	on               retryOn
	numRetries       uint32
	perTry           time.Duration
	codes            []int
	base, max        time.Duration
	previousHosts    bool
	hostSelectionMax int
}

func compileRetryPolicy(p *routev3.RetryPolicy) (*retryPolicy, error) {
	if p == nil {
		return nil, nil
	}
	rp := &retryPolicy{on: parseRetryOn(p.GetRetryOn()), numRetries: 1, base: defaultRetryBase, hostSelectionMax: 1}
	if n := p.GetNumRetries(); n != nil {
		rp.numRetries = n.GetValue()
	}
	if d := p.GetPerTryTimeout(); d != nil {
		rp.perTry = d.AsDuration()
	}
	for _, c := range p.GetRetriableStatusCodes() {
		rp.codes = append(rp.codes, int(c))
	}
	if bo := p.GetRetryBackOff(); bo != nil {
		rp.base = bo.GetBaseInterval().AsDuration()
		if rp.base <= 0 {
			return nil, fmt.Errorf("retry_back_off.base_interval must be greater than zero")
		}
	}
	rp.max = 10 * rp.base
	if m := p.GetRetryBackOff().GetMaxInterval(); m != nil {
		rp.max = m.AsDuration()
		if rp.max < rp.base {
			return nil, fmt.Errorf("retry_back_off.max_interval must be greater than or equal to the base_interval")
		}
	}
	for _, hp := range p.GetRetryHostPredicate() {
		if hp.GetName() == "envoy.retry_host_predicates.previous_hosts" ||
			strings.HasSuffix(hp.GetTypedConfig().GetTypeUrl(), ".PreviousHostsPredicate") {
			rp.previousHosts = true
		}
	}
	if n := p.GetHostSelectionRetryMaxAttempts(); n > 0 {
		rp.hostSelectionMax = int(n)
	}
	return rp, nil
}

// failure is why an attempt ended without a response.
type failure int

const (
	failNone failure = iota
	failNoHost
	failOverflow
	failConnect
	failReset
	failRefusedStream
	failPerTryTimeout
	failGlobalTimeout
	failIdleTimeout
	failDownstream
)

// retryStatus is Envoy's RetryStatus.
type retryStatus int

const (
	retryNo retryStatus = iota
	retryYes
	retryNoLimitExceeded
	retryNoOverflow
)

// retryState decides, attempt by attempt, whether the router tries again (Envoy's
// RetryStateImpl): the route's or virtual host's policy merged with the x-envoy-retry-on,
// x-envoy-retry-grpc-on, x-envoy-max-retries and x-envoy-retriable-status-codes request
// headers, limited by the cluster's max_retries circuit breaker, with fully jittered
// exponential back-off.
type retryState struct {
	mu        sync.Mutex
	on        retryOn
	remaining uint32
	codes     []int
	base, max time.Duration
	breakers  *upstream.Breakers
	stats     *upstream.ClusterStats
	armed     bool // holding one of max_retries
	retries   int  // retries so far (back-off exponent)
	disabled  bool
}

// newRetryState builds the request's retry state and strips the retry headers from the
// upstream request, as Envoy does. nil means the request is never retried.
func newRetryState(pol *retryPolicy, h http.Header, br *upstream.Breakers, st *upstream.ClusterStats) *retryState {
	hOn, hGrpc := h.Get("x-envoy-retry-on"), h.Get("x-envoy-retry-grpc-on")
	hMax, hCodes := h.Get("x-envoy-max-retries"), h.Get("x-envoy-retriable-status-codes")
	for _, k := range []string{"x-envoy-retry-on", "x-envoy-retry-grpc-on", "x-envoy-max-retries"} {
		h.Del(k)
	}
	if pol == nil && hOn == "" && hGrpc == "" {
		return nil
	}
	rs := &retryState{remaining: 1, base: defaultRetryBase, max: 10 * defaultRetryBase, breakers: br, stats: st}
	if pol != nil {
		rs.on, rs.remaining, rs.base, rs.max = pol.on, pol.numRetries, pol.base, pol.max
		rs.codes = append(rs.codes, pol.codes...)
	}
	rs.on |= parseRetryOn(hOn) | parseRetryOn(hGrpc)
	if rs.on != 0 && hMax != "" {
		if n, err := strconv.ParseUint(hMax, 10, 32); err == nil {
			rs.remaining = uint32(n)
		}
	}
	for _, c := range strings.Split(hCodes, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(c)); err == nil {
			rs.codes = append(rs.codes, n)
		}
	}
	if rs.on == 0 {
		return nil
	}
	return rs
}

// disable gives up retrying (the request body no longer fits the buffer).
func (r *retryState) disable() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.disabled = true
	r.mu.Unlock()
}

// wouldRetry is Envoy's wouldRetryFromHeaders / wouldRetryFromReset.
func (r *retryState) wouldRetry(res *attemptResult) bool {
	if res.resp != nil {
		h := res.resp.Header
		if h.Get("x-envoy-overloaded") != "" || h.Get("x-envoy-ratelimited") != "" {
			return false
		}
		code := res.resp.StatusCode
		switch {
		case r.on&retry5xx != 0 && code >= 500 && code < 600:
			return true
		case r.on&retryGatewayError != 0 && (code == 502 || code == 503 || code == 504):
			return true
		case r.on&retryRetriable4xx != 0 && code == http.StatusConflict:
			return true
		}
		if r.on&retryRetriableStatusCodes != 0 {
			for _, c := range r.codes {
				if c == code {
					return true
				}
			}
		}
		if gs := h.Get("grpc-status"); gs != "" {
			switch gs {
			case "1":
				return r.on&retryGrpcCancelled != 0
			case "4":
				return r.on&retryGrpcDeadlineExceeded != 0
			case "8":
				return r.on&retryGrpcResourceExhausted != 0
			case "13":
				return r.on&retryGrpcInternal != 0
			case "14":
				return r.on&retryGrpcUnavailable != 0
			}
		}
		return false
	}
	resetLike := retry5xx | retryGatewayError | retryReset
	switch res.fail {
	case failConnect:
		return r.on&(resetLike|retryConnectFailure) != 0
	case failRefusedStream:
		return r.on&(resetLike|retryRefusedStream) != 0
	case failReset, failPerTryTimeout:
		return r.on&resetLike != 0
	}
	// Overflow, no host, route timeout, idle timeout and a gone downstream are never retried.
	return false
}

// shouldRetry is Envoy's RetryStateImpl::shouldRetry: the retry count and the max_retries
// breaker decide; the flag to record is returned with the status.
func (r *retryState) shouldRetry(would bool) retryStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.armed && !would {
		r.stats.UpstreamRqRetrySuccess.Inc()
	}
	r.releaseLocked()
	if !would || r.disabled {
		return retryNo
	}
	if r.remaining == 0 {
		r.stats.UpstreamRqRetryLimitExceeded.Inc()
		return retryNoLimitExceeded
	}
	r.remaining--
	if !r.breakers.TryRetry() {
		r.stats.UpstreamRqRetryOverflow.Inc()
		return retryNoOverflow
	}
	r.armed = true
	r.retries++
	r.stats.UpstreamRqRetry.Inc()
	r.stats.UpstreamRqRetryBackoffExp.Inc()
	return retryYes
}

func (r *retryState) releaseLocked() {
	if r.armed {
		r.breakers.ReleaseRetry()
		r.armed = false
	}
}

// release gives back the max_retries unit a retry holds, at the end of the request.
func (r *retryState) release() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.releaseLocked()
	r.mu.Unlock()
}

// backOff is Envoy's fully jittered exponential back-off: the n-th retry waits a random
// time in [0, (2^n - 1) * base), the range capped at max. It returns ctx's error when ctx
// ends first.
func (r *retryState) backOff(ctx context.Context) error {
	r.mu.Lock()
	n := r.retries
	r.mu.Unlock()
	interval := backOffRange(n, r.base, r.max)
	d := time.Duration(0)
	if ms := interval.Milliseconds(); ms > 0 {
		d = time.Duration(rand.Int64N(ms)) * time.Millisecond
	}
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// backOffRange is the upper bound of the n-th retry's back-off: (2^n - 1) * base, capped
// at max.
func backOffRange(n int, base, max time.Duration) time.Duration {
	if n < 30 {
		if m := time.Duration((1<<n)-1) * base; m < max {
			return m
		}
	}
	return max
}

// flagFor is the response flag a non-retry records (Envoy's URX and UO).
func flagFor(st retryStatus) streaminfo.Flag {
	switch st {
	case retryNoLimitExceeded:
		return streaminfo.UpstreamRetryLimitExceeded
	case retryNoOverflow:
		return streaminfo.UpstreamOverflow
	}
	return 0
}
