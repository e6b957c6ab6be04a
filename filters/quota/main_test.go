//go:build !wasip1

// These tests drive the filter through the SDK's proxytest emulator, which only the
// forwarding (non-wasip1) build of the proxywasm package talks to. The emulator keeps
// shared data with proxy-wasm's CAS semantics; the clock is the test's.

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/wasmesh/wasmesh/filters/internal/emulator"
	"github.com/wasmesh/wasmesh/filters/internal/ratelimit"
)

// clock is the test's controllable time.
type clock struct{ t time.Time }

func newClock() *clock                   { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }
func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

// recorder is a VM context that remembers the plugin contexts it made, so that tests can
// read their state (known buckets) after the fact.
type recorder struct {
	vmContext
	plugins []*pluginContext
}

func (r *recorder) NewPluginContext(uint32) types.PluginContext {
	p := r.newPlugin()
	r.plugins = append(r.plugins, p)
	return p
}

type env struct {
	host   proxytest.HostEmulator
	status types.OnPluginStartStatus
	clock  *clock
	vm     *recorder
}

const principal = "spiffe://cluster.local/ns/default/sa/productpage"

func newEnv(t testing.TB, cfg string, wrap func(ratelimit.Store) ratelimit.Store) *env {
	t.Helper()
	c := newClock()
	vm := &recorder{vmContext: vmContext{now: c.now, wrapStore: wrap}}
	opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(cfg)).
		WithProperty([]string{"plugin_name"}, []byte("quota-test")).
		WithProperty(principalProperty, []byte(principal))
	host := emulator.Start(t, opt)
	return &env{host: host, status: host.StartPlugin(), clock: c, vm: vm}
}

func start(t testing.TB, cfg string) *env {
	t.Helper()
	e := newEnv(t, cfg, nil)
	require.Equal(t, types.OnPluginStartStatusOK, e.status, "critical logs: %v", e.host.GetCriticalLogs())
	return e
}

// result is what one request got.
type result struct {
	status  uint32            // 200 when forwarded
	headers map[string]string // the 429's headers, or the forwarded response's
	body    string
	action  types.Action
	grpc    int32 // the local reply's gRPC status (-1: none)
}

// do sends one request with the given extra headers and, if it is forwarded, a 200
// response back through the filter.
func (e *env) do(t testing.TB, path string, extra ...string) result {
	t.Helper()
	require.True(t, len(extra)%2 == 0)
	hs := [][2]string{{":method", "GET"}, {":path", path}, {":authority", "reviews:9080"}}
	for i := 0; i < len(extra); i += 2 {
		hs = append(hs, [2]string{extra[i], extra[i+1]})
	}
	id := e.host.InitializeHttpContext()
	r := result{action: e.host.CallOnRequestHeaders(id, hs, true), headers: map[string]string{}}
	if resp := e.host.GetSentLocalResponse(id); resp != nil {
		r.status, r.body, r.grpc = resp.StatusCode, string(resp.Data), resp.GRPCStatus
		for _, h := range resp.Headers {
			r.headers[h[0]] = h[1]
		}
		// Envoy runs local replies through the response callbacks as well.
		e.host.CallOnResponseHeaders(id, [][2]string{{":status", "429"}}, false)
		assert.Empty(t, e.host.GetCurrentResponseHeaders(id)[1:], "nothing added to the local reply twice")
		return r
	}
	require.Equal(t, types.ActionContinue, r.action)
	e.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	r.status = 200
	for _, h := range e.host.GetCurrentResponseHeaders(id) {
		if h[0] != ":status" {
			r.headers[h[0]] = h[1]
		}
	}
	return r
}

func (e *env) counter(t *testing.T, name string) uint64 {
	t.Helper()
	n, err := e.host.GetCounterMetric(name)
	require.NoError(t, err, name)
	return n
}

// req is one request of a sequence: after advancing the clock by wait.
type req struct {
	wait      time.Duration
	path      string
	headers   []string
	status    uint32
	remaining string // x-ratelimit-remaining; "" when the response must not carry it
}

func TestAllowDenySequences(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg string
		// asIs runs cfg as it is; otherwise with rate_limit_headers on, unless cfg sets it.
		asIs bool
		reqs []req
	}{
		"one bucket for everything": {
			cfg: `{"descriptors": [{"name": "all", "token_bucket": {"max_tokens": 2, "fill_interval": "1s"}}]}`,
			reqs: []req{
				{path: "/a", status: 200, remaining: "1"},
				{path: "/b", status: 200, remaining: "0"},
				{path: "/c", status: 429, remaining: "0"},
				{wait: 999 * time.Millisecond, path: "/a", status: 429, remaining: "0"},
				{wait: time.Millisecond, path: "/a", status: 200, remaining: "0"},
			},
		},
		"a bucket per header value; no header, no limit": {
			cfg: `{"descriptors": [{"name": "user", "entries": [{"key": "u", "source": "header", "header": "x-user"}],
				"token_bucket": {"max_tokens": 1, "fill_interval": "1m"}}]}`,
			reqs: []req{
				{path: "/", headers: []string{"x-user", "alice"}, status: 200, remaining: "0"},
				{path: "/", headers: []string{"x-user", "alice"}, status: 429, remaining: "0"},
				{path: "/", headers: []string{"x-user", "bob"}, status: 200, remaining: "0"},
				{path: "/", status: 200},
				{path: "/", status: 200},
			},
		},
		"a default value collects requests without the header": {
			cfg: `{"descriptors": [{"name": "user", "entries": [{"key": "u", "source": "header", "header": "x-user", "default": "anonymous"}],
				"token_bucket": {"max_tokens": 1, "fill_interval": "1m"}}]}`,
			reqs: []req{
				{path: "/", status: 200, remaining: "0"},
				{path: "/", status: 429, remaining: "0"},
				{path: "/", headers: []string{"x-user", "anonymous"}, status: 429, remaining: "0"},
				{path: "/", headers: []string{"x-user", "alice"}, status: 200, remaining: "0"},
			},
		},
		"longest path prefix; unmatched paths are not limited": {
			cfg: `{"descriptors": [{"name": "api", "entries": [{"key": "p", "source": "path_prefix", "prefixes": ["/api/", "/api/v1/"]}],
				"token_bucket": {"max_tokens": 1, "fill_interval": "1m"}}]}`,
			reqs: []req{
				{path: "/api/v1/items", status: 200, remaining: "0"},
				{path: "/api/v1/other", status: 429, remaining: "0"},
				{path: "/api/v2", status: 200, remaining: "0"},
				{path: "/api/v3", status: 429, remaining: "0"},
				{path: "/api/", status: 429, remaining: "0"}, // the prefix itself
				{path: "/static", status: 200},
			},
		},
		"method, destination service and source principal": {
			cfg: `{"descriptors": [{"name": "d", "entries": [
				{"key": "m", "source": "method"}, {"key": "dst", "source": "destination_service"},
				{"key": "src", "source": "source_principal"}],
				"quota": {"max_amount": 2, "valid_duration": "1m"},
				"overrides": [{"match": {"dst": "reviews", "src": "` + principal + `"}, "quota": {"max_amount": 3, "valid_duration": "1m"}}]}]}`,
			reqs: []req{
				{path: "/", status: 200, remaining: "2"},
				{path: "/", status: 200, remaining: "1"},
				{path: "/", status: 200, remaining: "0"},
				{path: "/", status: 429, remaining: "0"},
			},
		},
		"an absent property makes the descriptor not apply": {
			cfg: `{"descriptors": [{"name": "d", "entries": [{"key": "w", "source": "source_workload"}],
				"token_bucket": {"max_tokens": 0, "fill_interval": "1s"}}]}`,
			reqs: []req{{path: "/", status: 200}},
		},
		"zero max_tokens denies everything": {
			cfg:  `{"descriptors": [{"name": "d", "token_bucket": {"max_tokens": 0, "fill_interval": "1s"}}]}`,
			reqs: []req{{path: "/", status: 429, remaining: "0"}, {wait: time.Hour, path: "/", status: 429, remaining: "0"}},
		},
		"overrides: first match wins": {
			cfg: `{"descriptors": [{"name": "user", "entries": [{"key": "u", "source": "header", "header": "x-user"}],
				"token_bucket": {"max_tokens": 1, "fill_interval": "1m"},
				"overrides": [
					{"match": {"u": "batch"}, "token_bucket": {"max_tokens": 3, "fill_interval": "1m"}},
					{"match": {"u": "batch"}, "token_bucket": {"max_tokens": 100, "fill_interval": "1m"}}]}]}`,
			reqs: []req{
				{path: "/", headers: []string{"x-user", "batch"}, status: 200, remaining: "2"},
				{path: "/", headers: []string{"x-user", "batch"}, status: 200, remaining: "1"},
				{path: "/", headers: []string{"x-user", "batch"}, status: 200, remaining: "0"},
				{path: "/", headers: []string{"x-user", "batch"}, status: 429, remaining: "0"},
				{path: "/", headers: []string{"x-user", "alice"}, status: 200, remaining: "0"},
				{path: "/", headers: []string{"x-user", "alice"}, status: 429, remaining: "0"},
			},
		},
		"no headers on allowed responses by default": {
			cfg:  `{"descriptors": [{"name": "d", "token_bucket": {"max_tokens": 1, "fill_interval": "1s"}}]}`,
			asIs: true,
			reqs: []req{{path: "/", status: 200}, {path: "/", status: 429, remaining: "0"}},
		},
		"headers on allowed responses can be turned off": {
			cfg:  `{"rate_limit_headers": false, "descriptors": [{"name": "d", "token_bucket": {"max_tokens": 1, "fill_interval": "1s"}}]}`,
			reqs: []req{{path: "/", status: 200}, {path: "/", status: 429, remaining: "0"}},
		},
		"headers describe the descriptor with the fewest remaining": {
			cfg: `{"descriptors": [
				{"name": "big", "token_bucket": {"max_tokens": 10, "fill_interval": "1s"}},
				{"name": "small", "token_bucket": {"max_tokens": 3, "fill_interval": "1s"}},
				{"name": "medium", "token_bucket": {"max_tokens": 5, "fill_interval": "1s"}}]}`,
			reqs: []req{{path: "/", status: 200, remaining: "2"}, {path: "/", status: 200, remaining: "1"}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := tc.cfg
			if !tc.asIs {
				cfg = headersOn(cfg)
			}
			e := start(t, cfg)
			for i, r := range tc.reqs {
				e.clock.advance(r.wait)
				got := e.do(t, r.path, r.headers...)
				assert.Equal(t, r.status, got.status, "request %d", i)
				remaining, ok := got.headers["x-ratelimit-remaining"]
				if r.remaining == "" {
					assert.False(t, ok, "request %d: no rate limit headers", i)
				} else {
					assert.Equal(t, r.remaining, remaining, "request %d", i)
				}
			}
		})
	}
}

func TestTooManyRequestsResponse(t *testing.T) {
	e := start(t, headersOn(`{"descriptors": [{"name": "per_user", "entries": [{"key": "u", "source": "header", "header": "x-user"}],
		"token_bucket": {"max_tokens": 2, "tokens_per_fill": 1, "fill_interval": "10s"}}]}`))
	require.Equal(t, 200, int(e.do(t, "/", "x-user", "alice").status))
	e.clock.advance(2500 * time.Millisecond)
	ok := e.do(t, "/", "x-user", "alice")
	require.Equal(t, 200, int(ok.status))
	assert.Equal(t, map[string]string{"x-ratelimit-limit": "2", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "8"}, ok.headers)

	got := e.do(t, "/", "x-user", "alice")
	assert.Equal(t, types.ActionPause, got.action)
	assert.Equal(t, uint32(429), got.status)
	assert.Equal(t, map[string]string{
		"content-type":          "text/plain; charset=utf-8",
		"x-ratelimit-limit":     "2",
		"x-ratelimit-remaining": "0",
		"x-ratelimit-reset":     "8", // 7.5s to the next fill, rounded up
		"retry-after":           "8",
	}, got.headers)
	assert.Equal(t, "too many requests: quota per_user exhausted\n", got.body)
	assert.Equal(t, int32(-1), got.grpc, "a plain HTTP 429: no gRPC status")

	assert.Equal(t, uint64(2), e.counter(t, requestsMetric("per_user", "allowed")))
	assert.Equal(t, uint64(1), e.counter(t, requestsMetric("per_user", "denied")))
	assert.Equal(t, uint64(0), e.counter(t, requestsMetric("per_user", "shadow_denied")))
}

func TestAnEnforcedDenialStopsLaterDescriptors(t *testing.T) {
	e := start(t, `{"descriptors": [
		{"name": "first", "token_bucket": {"max_tokens": 1, "fill_interval": "1m"}},
		{"name": "second", "token_bucket": {"max_tokens": 5, "fill_interval": "1m"}}]}`)
	assert.Equal(t, uint32(200), e.do(t, "/").status)
	assert.Equal(t, uint32(429), e.do(t, "/").status)
	assert.Equal(t, uint32(429), e.do(t, "/").status)
	assert.Equal(t, uint64(1), e.counter(t, requestsMetric("second", "allowed")), "second is charged only when first allows")
	assert.Equal(t, uint64(2), e.counter(t, requestsMetric("first", "denied")))
}

// The rate-limit headers are those of the descriptor closest to its limit, the first of
// those equally close; starting the filter logs no warning.
func TestHeadersComeFromTheClosestDescriptor(t *testing.T) {
	e := start(t, headersOn(`{"descriptors": [
		{"name": "slow", "token_bucket": {"max_tokens": 5, "fill_interval": "10s"}},
		{"name": "slower", "token_bucket": {"max_tokens": 5, "fill_interval": "1m"}},
		{"name": "small", "token_bucket": {"max_tokens": 3, "fill_interval": "30s"}}]}`))
	assert.Empty(t, e.host.GetWarnLogs())
	assert.Equal(t, map[string]string{"x-ratelimit-limit": "3", "x-ratelimit-remaining": "2", "x-ratelimit-reset": "30"}, e.do(t, "/").headers,
		"small is the closest")

	e = start(t, headersOn(`{"descriptors": [
		{"name": "slow", "token_bucket": {"max_tokens": 5, "fill_interval": "10s"}},
		{"name": "slower", "token_bucket": {"max_tokens": 5, "fill_interval": "1m"}}]}`))
	assert.Equal(t, map[string]string{"x-ratelimit-limit": "5", "x-ratelimit-remaining": "4", "x-ratelimit-reset": "10"}, e.do(t, "/").headers,
		"equally close: the first")
}

func TestShadowMode(t *testing.T) {
	for name, cfg := range map[string]string{
		"global":         `{"shadow": true, "descriptors": [{"name": "d", "token_bucket": {"max_tokens": 1, "fill_interval": "1m"}}]}`,
		"per descriptor": `{"descriptors": [{"name": "d", "shadow": true, "token_bucket": {"max_tokens": 1, "fill_interval": "1m"}}]}`,
		"per override": `{"descriptors": [{"name": "d", "entries": [{"key": "m", "source": "method"}],
			"token_bucket": {"max_tokens": 1, "fill_interval": "1m"}, "overrides": [{"match": {"m": "GET"}, "shadow": true}]}]}`,
		"headers off still shows shadow denials": `{"shadow": true, "rate_limit_headers": false,
			"descriptors": [{"name": "d", "token_bucket": {"max_tokens": 1, "fill_interval": "1m"}}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			e := start(t, cfg)
			e.do(t, "/")
			for range 3 {
				got := e.do(t, "/")
				assert.Equal(t, uint32(200), got.status, "never rejected")
				assert.Equal(t, "0", got.headers["x-ratelimit-remaining"])
				assert.Equal(t, "1", got.headers["x-ratelimit-limit"])
				assert.Equal(t, "60", got.headers["x-ratelimit-reset"])
			}
			assert.Equal(t, uint64(1), e.counter(t, requestsMetric("d", "allowed")))
			assert.Equal(t, uint64(3), e.counter(t, requestsMetric("d", "shadow_denied")))
			assert.Equal(t, uint64(0), e.counter(t, requestsMetric("d", "denied")))
		})
	}
	t.Run("an enforced descriptor still rejects", func(t *testing.T) {
		e := start(t, `{"shadow": true, "descriptors": [
			{"name": "dry_run", "token_bucket": {"max_tokens": 1, "fill_interval": "1m"}},
			{"name": "enforced", "shadow": false, "token_bucket": {"max_tokens": 2, "fill_interval": "1m"}}]}`)
		statuses := []uint32{e.do(t, "/").status, e.do(t, "/").status, e.do(t, "/").status}
		assert.Equal(t, []uint32{200, 200, 429}, statuses)
		assert.Equal(t, uint64(2), e.counter(t, requestsMetric("dry_run", "shadow_denied")))
	})
}

// bucketValue reads a bucket's shared-data value the way another VM would.
func bucketValue(t *testing.T, key string, p *ratelimit.Policy) (uint32, time.Time) {
	t.Helper()
	v, _, err := proxywasm.GetSharedData(key)
	require.NoError(t, err, key)
	n, at, ok := ratelimit.Inspect(v, p)
	require.True(t, ok, "value %x", v)
	return n, at
}

func TestRefillOnTick(t *testing.T) {
	e := start(t, `{"descriptors": [{"name": "d", "token_bucket": {"max_tokens": 3, "tokens_per_fill": 1, "fill_interval": "1s"}}]}`)
	assert.Equal(t, uint32(1000), e.host.GetTickPeriod(), "ticks at the fill interval")
	start := e.clock.now()
	for range 3 {
		e.do(t, "/")
	}
	const key = "wasmesh.quota/quota-test/d"
	// The configured bucket, written here rather than read back from the filter's parse.
	policy := &ratelimit.Policy{Algorithm: ratelimit.TokenBucket, MaxTokens: 3, TokensPerFill: 1, FillInterval: time.Second}
	tokens, _ := bucketValue(t, key, policy)
	require.Equal(t, uint32(0), tokens)

	e.clock.advance(2 * time.Second)
	tokens, _ = bucketValue(t, key, policy)
	assert.Equal(t, uint32(0), tokens, "without a request or a tick the stored value is stale")
	e.host.Tick()
	tokens, at := bucketValue(t, key, policy)
	assert.Equal(t, uint32(2), tokens, "the tick wrote two fills")
	assert.Equal(t, start.Add(2*time.Second), at)

	e.clock.advance(10 * time.Second)
	e.host.Tick()
	tokens, _ = bucketValue(t, key, policy)
	assert.Equal(t, uint32(3), tokens, "capped at max_tokens")
}

func TestTickRefreshesWindows(t *testing.T) {
	e := start(t, `{"descriptors": [{"name": "d", "quota": {"max_amount": 5, "valid_duration": "10s", "rolling_window": true}}]}`)
	assert.Equal(t, uint32(1000), e.host.GetTickPeriod(), "ticks at the slot")
	e.do(t, "/")
	e.clock.advance(5 * time.Second)
	e.do(t, "/")
	const key = "wasmesh.quota/quota-test/d"
	// The configured window (slots of a tenth of it), written here rather than read back
	// from the filter's parse.
	policy := &ratelimit.Policy{Algorithm: ratelimit.RollingWindow, MaxAmount: 5, ValidDuration: 10 * time.Second, BucketDuration: time.Second}
	used, _ := bucketValue(t, key, policy)
	require.Equal(t, uint32(2), used)
	e.clock.advance(5 * time.Second)
	e.host.Tick()
	used, _ = bucketValue(t, key, policy)
	assert.Equal(t, uint32(1), used, "the first slot left the window")
}

func TestLazyRefillFromTheClock(t *testing.T) {
	// Ticks are never driven here: requests alone see the refills.
	e := start(t, `{"descriptors": [{"name": "d", "token_bucket": {"max_tokens": 2, "tokens_per_fill": 2, "fill_interval": "1s"}}]}`)
	got := []uint32{e.do(t, "/").status, e.do(t, "/").status, e.do(t, "/").status}
	assert.Equal(t, []uint32{200, 200, 429}, got)
	e.clock.advance(time.Second)
	got = []uint32{e.do(t, "/").status, e.do(t, "/").status, e.do(t, "/").status}
	assert.Equal(t, []uint32{200, 200, 429}, got)
}

func TestFixedAndRollingWindowsThroughTheFilter(t *testing.T) {
	// Three requests just before a minute boundary and three just after.
	run := func(quota string) []uint32 {
		e := start(t, `{"descriptors": [{"name": "d", "quota": `+quota+`}]}`)
		e.clock.t = e.clock.t.Truncate(time.Minute).Add(59 * time.Second)
		var got []uint32
		for i := range 6 {
			if i == 3 {
				e.clock.advance(time.Second)
			}
			got = append(got, e.do(t, "/").status)
		}
		return got
	}
	assert.Equal(t, []uint32{200, 200, 200, 200, 200, 200},
		run(`{"max_amount": 3, "valid_duration": "1m"}`), "a fixed window starts afresh on the minute")
	assert.Equal(t, []uint32{200, 200, 200, 429, 429, 429},
		run(`{"max_amount": 3, "valid_duration": "1m", "rolling_window": true}`), "a rolling window remembers the last minute")
}

// twoVMs is a VM context whose single plugin context (proxytest makes only one) fans out
// to two independent plugin contexts, each with its own limiter, buffers and bucket
// cache, as two VMs of one proxy would have. HTTP streams go to whichever is current.
type twoVMs struct {
	types.DefaultVMContext
	vms [2]*pluginContext
	cur int
}

func (v *twoVMs) NewPluginContext(uint32) types.PluginContext { return &fanout{v: v} }

type fanout struct {
	types.DefaultPluginContext
	v *twoVMs
}

func (f *fanout) OnPluginStart(n int) types.OnPluginStartStatus {
	for _, p := range f.v.vms {
		if s := p.OnPluginStart(n); s != types.OnPluginStartStatusOK {
			return s
		}
	}
	return types.OnPluginStartStatusOK
}

func (f *fanout) NewHttpContext(id uint32) types.HttpContext {
	return f.v.vms[f.v.cur].NewHttpContext(id)
}

func TestTwoVMsShareOneBucket(t *testing.T) {
	c := newClock()
	vm := &vmContext{now: c.now}
	v := &twoVMs{vms: [2]*pluginContext{vm.newPlugin(), vm.newPlugin()}}
	opt := proxytest.NewEmulatorOption().WithVMContext(v).WithProperty([]string{"plugin_name"}, []byte("q")).
		WithPluginConfiguration([]byte(headersOn(`{"descriptors": [{"name": "user", "entries": [{"key": "u", "source": "header", "header": "x-user"}],
			"token_bucket": {"max_tokens": 3, "fill_interval": "1m"}}]}`)))
	host := emulator.Start(t, opt)
	require.Equal(t, types.OnPluginStartStatusOK, host.StartPlugin())
	require.NotSame(t, v.vms[0].limiter, v.vms[1].limiter)
	e := &env{host: host, clock: c}

	var got []string
	for _, cur := range []int{0, 1, 0, 1, 1} {
		v.cur = cur
		r := e.do(t, "/", "x-user", "alice")
		got = append(got, string(rune('A'+cur))+":"+r.headers["x-ratelimit-remaining"]+":"+uitoa(r.status))
	}
	assert.Equal(t, []string{"A:2:200", "B:1:200", "A:0:200", "B:0:429", "B:0:429"}, got)
	v.cur = 0
	assert.Equal(t, uint32(200), e.do(t, "/", "x-user", "bob").status, "other values have their own bucket")
}

// conflicting is a store whose every Set is preceded by another writer rewriting the same
// key, which moves its CAS on: the interleaving two VMs produce when they charge one
// bucket at the same time.
type conflicting struct {
	ratelimit.Store
	conflicts *int // how many Sets to disturb
	writes    int
}

func (c *conflicting) Set(key string, value []byte, cas uint32) error {
	if *c.conflicts > 0 {
		*c.conflicts--
		cur, curCAS, err := c.Store.Get(key)
		if err == nil {
			c.writes++
			if err := c.Store.Set(key, append([]byte(nil), cur...), curCAS); err != nil {
				panic(err)
			}
		}
	}
	return c.Store.Set(key, value, cas)
}

func TestCASConflictsRetryThenFailOpen(t *testing.T) {
	conflicts := 0
	var store *conflicting
	// start cannot pass a store wrapper: newEnv with one.
	e := newEnv(t, `{"rate_limit_headers": true, "cas_retries": 2, "descriptors": [{"name": "d", "token_bucket": {"max_tokens": 5, "fill_interval": "1m"}}]}`,
		func(s ratelimit.Store) ratelimit.Store {
			store = &conflicting{Store: s, conflicts: &conflicts}
			return store
		})
	require.Equal(t, types.OnPluginStartStatusOK, e.status)
	const key = "wasmesh.quota/quota-test/d"
	policy := &ratelimit.Policy{Algorithm: ratelimit.TokenBucket, MaxTokens: 5, TokensPerFill: 1, FillInterval: time.Minute}
	failOpen := failOpenMetric("d", ratelimit.CASExhausted)

	require.Equal(t, uint32(200), e.do(t, "/").status) // creates the bucket: 4 left

	conflicts = 2 // within cas_retries: the third attempt wins
	got := e.do(t, "/")
	assert.Equal(t, uint32(200), got.status)
	assert.Equal(t, "3", got.headers["x-ratelimit-remaining"])
	assert.Equal(t, uint64(0), e.counter(t, failOpen))
	tokens, _ := bucketValue(t, key, policy)
	assert.Equal(t, uint32(3), tokens)

	conflicts = 3 // one more than cas_retries allows
	got = e.do(t, "/")
	assert.Equal(t, uint32(200), got.status, "fails open")
	assert.Equal(t, uint64(1), e.counter(t, failOpen))
	assert.Equal(t, uint64(3), e.counter(t, requestsMetric("d", "allowed")), "a fail-open request is allowed too")
	tokens, _ = bucketValue(t, key, policy)
	assert.Equal(t, uint32(3), tokens, "the fail-open request took nothing")
	assert.Equal(t, 5, store.writes)
	assert.Equal(t, 0, conflicts)
}

// failing is a store that always errors.
type failing struct{ ratelimit.Store }

func (failing) Get(string) ([]byte, uint32, error) { return nil, 0, types.ErrorStatusBadArgument }

func TestStoreErrorsFailOpenAndLogOnce(t *testing.T) {
	e := newEnv(t, `{"descriptors": [{"name": "d", "token_bucket": {"max_tokens": 0, "fill_interval": "1m"}}]}`,
		func(s ratelimit.Store) ratelimit.Store { return failing{s} })
	require.Equal(t, types.OnPluginStartStatusOK, e.status)
	for range 3 {
		assert.Equal(t, uint32(200), e.do(t, "/").status)
	}
	assert.Equal(t, uint64(3), e.counter(t, failOpenMetric("d", ratelimit.StoreError)))
	assert.Len(t, e.host.GetErrorLogs(), 1)
}

func TestPluginStartFailsOnBadConfiguration(t *testing.T) {
	for name, tc := range map[string]struct{ cfg, want string }{
		"none":             {``, `quota: plugin configuration: empty`},
		"zero fill":        {bucketConfig(`"token_bucket": {"max_tokens": 1, "fill_interval": "0s"}`), `descriptors[0].token_bucket.fill_interval`},
		"negative tokens":  {bucketConfig(`"token_bucket": {"max_tokens": -3, "fill_interval": "1s"}`), `descriptors[0].token_bucket.max_tokens: must not be negative`},
		"bad source":       {bucketConfig(okBucket + `, "entries": [{"key": "k", "source": "query"}]`), `descriptors[0].entries[0].source: unknown source "query"`},
		"unknown field":    {`{"shadow_mode": true}`, `shadow_mode: unknown field`},
		"nested unknown":   {bucketConfig(`"quota": {"max_amount": 1, "validDuration": "1s"}`), `descriptors[0].quota.validDuration: unknown field`},
		"rolling mismatch": {bucketConfig(`"quota": {"max_amount": 1, "valid_duration": "1s", "rolling_window": true, "bucket_duration": "3ms"}`), `bucket_duration`},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, tc.cfg, nil)
			assert.Equal(t, types.OnPluginStartStatusFailed, e.status)
			require.Len(t, e.host.GetCriticalLogs(), 1)
			assert.Contains(t, e.host.GetCriticalLogs()[0], tc.want)
		})
	}
}

func TestScope(t *testing.T) {
	e := start(t, `{"name": "edge", "descriptors": [{"name": "d", "entries": [{"key": "m", "source": "method"}],
		"token_bucket": {"max_tokens": 1, "fill_interval": "1m"}}]}`)
	e.do(t, "/")
	_, _, err := proxywasm.GetSharedData("wasmesh.quota/edge/d/3:GET")
	assert.NoError(t, err, "the configured name scopes the key")

	e = start(t, `{"descriptors": [{"name": "d", "token_bucket": {"max_tokens": 1, "fill_interval": "1m"}}]}`)
	e.do(t, "/")
	_, _, err = proxywasm.GetSharedData("wasmesh.quota/quota-test/d")
	assert.NoError(t, err, "else the plugin_name property does")
}

func TestRequestPathAllocations(t *testing.T) {
	// The emulator allocates per call; what is measured is the filter's decision with its
	// keys cached, against a store that does not allocate.
	e := start(t, `{"descriptors": [{"name": "d", "entries": [{"key": "m", "source": "method"}],
		"token_bucket": {"max_tokens": 4000000000, "fill_interval": "1m"}}]}`)
	p := e.vm.plugins[0]
	p.limiter = ratelimit.NewShared(&memStore{}, 5)
	d := p.cfg.descriptors[0]
	p.scratch.reset()
	p.scratch.read[0], p.scratch.vals[0] = attrPresent, "GET"
	b, ok := p.bucketFor(d)
	require.True(t, ok)
	now := e.clock.now()
	allocs := testing.AllocsPerRun(100, func() {
		b, _ = p.bucketFor(d)
		req := &p.scratch.req
		*req = ratelimit.Request{Key: b.key, Policy: b.policy, Hits: 1, Descriptor: d.name, Entries: p.scratch.entries}
		p.limiter.Decide(req, now)
	})
	assert.Zero(t, allocs)
}

// memStore is a minimal non-allocating store for the allocation test.
type memStore struct {
	value []byte
	cas   uint32
}

func (m *memStore) Get(string) ([]byte, uint32, error) {
	if m.cas == 0 {
		return nil, 0, ratelimit.ErrNotFound
	}
	return m.value, m.cas, nil
}

func (m *memStore) Set(_ string, v []byte, cas uint32) error {
	if cas != 0 && cas != m.cas {
		return ratelimit.ErrCASMismatch
	}
	m.value = append(m.value[:0], v...)
	m.cas++
	return nil
}

// headersOn turns rate_limit_headers on in cfg (a JSON object), unless cfg sets it: for
// tests that read the headers of allowed responses.
func headersOn(cfg string) string {
	if strings.Contains(cfg, `"rate_limit_headers"`) {
		return cfg
	}
	return strings.Replace(cfg, "{", `{"rate_limit_headers": true, `, 1)
}
