package router

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Envoy's router documentation: with the default 25ms base the first retry waits 0-24ms,
// the second 0-74ms, the third 0-174ms, capped at ten times the base.
func TestBackOffRange(t *testing.T) {
	base, maxI := 25*time.Millisecond, 250*time.Millisecond
	for n, want := range map[int]time.Duration{1: 25 * time.Millisecond, 2: 75 * time.Millisecond,
		3: 175 * time.Millisecond, 4: 250 * time.Millisecond, 40: 250 * time.Millisecond} {
		assert.Equal(t, want, backOffRange(n, base, maxI), "retry %d", n)
	}
}

func TestRetryOnParsing(t *testing.T) {
	assert.Equal(t, retry5xx|retryConnectFailure|retryRetriableStatusCodes, parseRetryOn("5xx, connect-failure,retriable-status-codes,bogus"))
	h := http.Header{"X-Envoy-Retry-On": {"gateway-error"}, "X-Envoy-Max-Retries": {"4"}}
	rs := newRetryState(nil, h, nil, nil)
	if assert.NotNil(t, rs) {
		assert.Equal(t, retryGatewayError, rs.on)
		assert.Equal(t, uint32(4), rs.remaining)
	}
	assert.Empty(t, h.Get("x-envoy-retry-on"), "the retry headers are not forwarded")
	assert.Nil(t, newRetryState(nil, http.Header{}, nil, nil), "no policy, no header: no retry state")
}

func TestShadowHost(t *testing.T) {
	assert.Equal(t, "svc-shadow", shadowHost("svc"))
	assert.Equal(t, "svc-shadow:8080", shadowHost("svc:8080"))
	assert.Equal(t, "[::1]-shadow:80", shadowHost("[::1]:80"))
}
