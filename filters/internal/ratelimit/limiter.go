// Package ratelimit is the decision core of the quota filter: token buckets (Envoy's local
// rate limit) and fixed or rolling windows (Istio's memquota) whose state lives in a
// compare-and-swap key-value store such as proxy-wasm shared data, behind a Limiter
// interface that a remote backend (Envoy's rate limit service, Istio's redisquota) can
// implement later. It imports neither the SDK nor the host, so it is tested as plain Go.
package ratelimit

import (
	"fmt"
	"time"
)

// Algorithm selects how a policy counts.
type Algorithm uint8

// The algorithms. Their values are also the first byte of the encoded state, so they
// must never be renumbered: a changed tag would make every VM re-initialise its buckets.
const (
	// TokenBucket starts full with MaxTokens and adds TokensPerFill every FillInterval,
	// never above MaxTokens (Envoy's type.v3.TokenBucket).
	TokenBucket Algorithm = 1
	// FixedWindow allows MaxAmount per ValidDuration window, windows aligned to the Unix
	// epoch so that every VM agrees on where a window starts without talking.
	FixedWindow Algorithm = 2
	// RollingWindow allows MaxAmount in any ValidDuration, counted in slots of
	// BucketDuration (Istio's memquota rollingWindow, redisquota's ROLLING_WINDOW).
	RollingWindow Algorithm = 3
)

// String names the algorithm as the configuration does.
func (a Algorithm) String() string {
	switch a {
	case TokenBucket:
		return "token_bucket"
	case FixedWindow:
		return "fixed_window"
	case RollingWindow:
		return "rolling_window"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// MaxSlots bounds a rolling window's slots: every decision reads and writes all of them.
const MaxSlots = 64

// Policy is one bucket's settings. Callers validate it (the filter's configuration does,
// naming the offending field); the limiter assumes a valid policy.
type Policy struct {
	Algorithm Algorithm
	// Token bucket.
	MaxTokens     uint32
	TokensPerFill uint32
	FillInterval  time.Duration
	// Windows.
	MaxAmount      uint32
	ValidDuration  time.Duration
	BucketDuration time.Duration // rolling only
}

// Limit is the most a client can use at once: the bucket's capacity or the window's amount.
func (p *Policy) Limit() uint32 {
	if p.Algorithm == TokenBucket {
		return p.MaxTokens
	}
	return p.MaxAmount
}

// Period is how often the policy's state changes on its own: the fill interval, the window,
// or the rolling window's slot. The filter derives its tick period from it.
func (p *Policy) Period() time.Duration {
	switch p.Algorithm {
	case TokenBucket:
		return p.FillInterval
	case RollingWindow:
		return p.BucketDuration
	}
	return p.ValidDuration
}

// slots is the number of slots of a rolling window.
func (p *Policy) slots() int { return int(p.ValidDuration / p.BucketDuration) }

// Entry is one key/value pair of a descriptor, as in Envoy's RateLimitDescriptor.
type Entry struct{ Key, Value string }

// Request is one descriptor's claim on quota.
type Request struct {
	// Key names the bucket: requests with the same key share one bucket in every VM.
	Key string
	// Policy is the bucket's settings (the descriptor's, or a matching override's).
	Policy *Policy
	// Hits is how much to take; 0 is treated as 1.
	Hits uint32
	// Descriptor and Entries describe the request for a backend that keys its buckets
	// itself (a rate limit service gets a domain and descriptor entries, not our key).
	// The shared-data limiter uses Key only.
	Descriptor string
	Entries    []Entry
}

// FailOpen says why a decision allowed a request without consulting the bucket.
type FailOpen uint8

const (
	// NotFailedOpen: the decision came from the bucket.
	NotFailedOpen FailOpen = iota
	// CASExhausted: every compare-and-swap attempt lost to another writer.
	CASExhausted
	// StoreError: the store failed in a way retrying does not fix.
	StoreError
)

// String is the value used for the fail-open metric's reason tag.
func (f FailOpen) String() string {
	switch f {
	case NotFailedOpen:
		return "none"
	case CASExhausted:
		return "cas_exhausted"
	case StoreError:
		return "store_error"
	}
	return fmt.Sprintf("fail_open(%d)", uint8(f))
}

// Decision is a limiter's answer for one Request.
type Decision struct {
	// Allowed is false when the request is over the limit.
	Allowed bool
	// Limit and Remaining are the x-ratelimit-limit and x-ratelimit-remaining values:
	// the policy's limit and what is left after this request.
	Limit, Remaining uint32
	// Reset is how long until the quota next grows: the next fill, the end of the fixed
	// window, or the expiry of the oldest used slot of a rolling window. Zero when there
	// is nothing to wait for. A denied request can be retried after Reset.
	Reset time.Duration
	// FailOpen is set when the request was allowed because the state could not be read
	// or updated; Allowed is then true.
	FailOpen FailOpen
}

// Limiter decides requests. Decide must be cheap and must not block: the filter calls it
// on the request path. A remote backend would be asynchronous (DispatchHttpCall): it
// would implement Limiter with a local answer (allow, or a cached verdict) and report
// the remote one through the same Decision type when the call returns, so the filter's
// handling of decisions (metrics, headers, the 429) is shared.
type Limiter interface {
	Decide(req *Request, now time.Time) Decision
}

// Refresher is implemented by limiters that keep state and can bring a bucket up to date
// without taking from it (refill on the tick). It reports whether it wrote.
type Refresher interface {
	Refresh(key string, p *Policy, now time.Time) bool
}
