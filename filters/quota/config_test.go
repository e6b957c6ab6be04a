package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/filters/internal/ratelimit"
)

// docExample extracts the JSON example from the package documentation, so the example
// users copy is proven to parse.
func docExample(t *testing.T) string { return docExampleAfter(t, "") }

// docExampleAfter is the first JSON example of the package documentation after the line
// that starts with heading ("": the first example).
func docExampleAfter(t *testing.T, heading string) string {
	t.Helper()
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	var b strings.Builder
	in, after := false, heading == ""
	for _, line := range strings.Split(string(src), "\n") {
		after = after || strings.HasPrefix(line, heading)
		switch {
		case after && strings.HasPrefix(line, "//\t{"):
			in = true
		case in && !strings.HasPrefix(line, "//\t"):
			return b.String()
		}
		if in {
			b.WriteString(strings.TrimPrefix(line, "//\t"))
			b.WriteByte('\n')
		}
	}
	t.Fatal("no JSON example in the package documentation")
	return ""
}

func TestDocExampleParses(t *testing.T) {
	s, err := parseConfig([]byte(docExample(t)))
	require.NoError(t, err)
	assert.Equal(t, "ingress", s.name)
	assert.True(t, s.headers)
	assert.Equal(t, 5, s.casRetries)
	assert.Equal(t, time.Second, s.tickPeriod)
	require.Len(t, s.descriptors, 3)

	user := s.descriptors[0]
	assert.Equal(t, &ratelimit.Policy{Algorithm: ratelimit.TokenBucket, MaxTokens: 100, TokensPerFill: 10, FillInterval: time.Second}, user.policy)
	require.Len(t, user.overrides, 2)
	assert.Equal(t, uint32(1000), user.overrides[0].policy.MaxTokens)
	assert.False(t, user.overrides[0].shadow)
	assert.Same(t, user.policy, user.overrides[1].policy, "a shadow-only override keeps the descriptor's bucket settings")
	assert.True(t, user.overrides[1].shadow)

	source := s.descriptors[1]
	assert.Equal(t, &ratelimit.Policy{Algorithm: ratelimit.RollingWindow, MaxAmount: 600, ValidDuration: time.Minute, BucketDuration: 6 * time.Second}, source.policy)
	require.NotNil(t, source.entries[0].def)
	assert.Equal(t, "unknown", *source.entries[0].def)
	assert.Equal(t, &ratelimit.Policy{Algorithm: ratelimit.FixedWindow, MaxAmount: 10000, ValidDuration: time.Second}, s.descriptors[2].policy)
	assert.Empty(t, s.descriptors[2].entries)
}

func TestParseConfigDefaults(t *testing.T) {
	s, err := parseConfig([]byte(`{"descriptors": [
		{"name": "a", "token_bucket": {"max_tokens": 1, "fill_interval": "10s"}},
		{"name": "b", "entries": [{"key": "m", "source": "method"}, {"key": "m2", "source": "method"}],
		 "quota": {"max_amount": 1, "valid_duration": "2s", "rolling_window": true}}
	]}`))
	require.NoError(t, err)
	assert.Equal(t, "", s.name, "scope from plugin_name at start")
	assert.False(t, s.headers, "none on allowed responses, as Envoy's enable_x_ratelimit_headers")
	assert.Equal(t, defaultCASRetries, s.casRetries)
	assert.Equal(t, 200*time.Millisecond, s.tickPeriod, "the shortest period: b's 200ms slot")
	assert.Equal(t, uint32(1), s.descriptors[0].policy.TokensPerFill, "Envoy's default")
	assert.Equal(t, 200*time.Millisecond, s.descriptors[1].policy.BucketDuration, "ten slots")
	assert.Len(t, s.attrs, 1, "two entries reading :method share one read")
	assert.False(t, s.descriptors[0].shadow)
}

func TestTickPeriodBounds(t *testing.T) {
	for in, want := range map[string]time.Duration{
		`"fill_interval": "1ms"`: minTickPeriod,
		`"fill_interval": "1h"`:  maxTickPeriod,
		`"fill_interval": "3s"`:  3 * time.Second,
	} {
		s, err := parseConfig([]byte(`{"descriptors": [{"name": "a", "token_bucket": {"max_tokens": 1, ` + in + `}}]}`))
		require.NoError(t, err)
		assert.Equal(t, want, s.tickPeriod, in)
	}
}

// bucketConfig wraps a descriptor's JSON fragment into a configuration.
func bucketConfig(descriptor string) string {
	return `{"descriptors": [{"name": "d", ` + descriptor + `}]}`
}

const okBucket = `"token_bucket": {"max_tokens": 1, "fill_interval": "1s"}`

func TestParseConfigErrorsNameTheField(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"empty":                   {``, `empty; at least one entry in "descriptors" is required`},
		"not JSON":                {`limit everything`, `invalid character`},
		"trailing data":           {`{} {}`, `unexpected data after the JSON value`},
		"no descriptors":          {`{}`, `descriptors: at least one descriptor is required`},
		"unknown top-level field": {`{"descriptor": []}`, `descriptor: unknown field`},
		"unknown nested field":    {bucketConfig(`"token_bucket": {"max_token": 1, "fill_interval": "1s"}`), `descriptors[0].token_bucket.max_token: unknown field`},
		"unknown entry field":     {bucketConfig(okBucket + `, "entries": [{"key": "u", "source": "method", "values": "x"}]`), `descriptors[0].entries[0].values: unknown field`},
		"unknown override field":  {bucketConfig(okBucket + `, "entries": [{"key": "u", "source": "method"}], "overrides": [{"match": {"u": "GET"}, "shadows": true}]`), `descriptors[0].overrides[0].shadows: unknown field`},
		"field name in capitals":  {`{"Descriptors": []}`, `Descriptors: unknown field`},
		"wrong type":              {`{"cas_retries": "5", "descriptors": []}`, `plugin configuration: cas_retries: want a number, not a string`},
		"bad scope name":          {`{"name": "a/b", "descriptors": []}`, `name: "a/b" must be`},
		"negative cas_retries":    {`{"cas_retries": -1, "descriptors": []}`, `cas_retries: must be between 0 and 100, got -1`},
		"bad tick_period":         {`{"tick_period": "soon", "descriptors": []}`, `tick_period: "soon" is not a duration`},
		"descriptor without name": {`{"descriptors": [{` + okBucket + `}]}`, `descriptors[0].name: required`},
		"bad descriptor name":     {`{"descriptors": [{"name": "a;.;b", ` + okBucket + `}]}`, `descriptors[0].name: "a;.;b" must be`},
		"duplicate descriptor": {`{"descriptors": [{"name": "d", ` + okBucket + `}, {"name": "d", ` + okBucket + `}]}`,
			`descriptors[1].name: "d" is used by an earlier descriptor`},
		"no bucket":             {bucketConfig(`"shadow": true`), `descriptors[0]: one of "token_bucket" and "quota" is required`},
		"two buckets":           {bucketConfig(okBucket + `, "quota": {"max_amount": 1, "valid_duration": "1s"}`), `descriptors[0]: set only one of "token_bucket" and "quota"`},
		"missing max_tokens":    {bucketConfig(`"token_bucket": {"fill_interval": "1s"}`), `descriptors[0].token_bucket.max_tokens: required`},
		"negative max_tokens":   {bucketConfig(`"token_bucket": {"max_tokens": -1, "fill_interval": "1s"}`), `descriptors[0].token_bucket.max_tokens: must not be negative, got -1`},
		"huge max_tokens":       {bucketConfig(`"token_bucket": {"max_tokens": 4294967296, "fill_interval": "1s"}`), `descriptors[0].token_bucket.max_tokens: must be at most 4294967295`},
		"zero tokens_per_fill":  {bucketConfig(`"token_bucket": {"max_tokens": 1, "tokens_per_fill": 0, "fill_interval": "1s"}`), `descriptors[0].token_bucket.tokens_per_fill: must be at least 1, got 0`},
		"missing fill_interval": {bucketConfig(`"token_bucket": {"max_tokens": 1}`), `descriptors[0].token_bucket.fill_interval: required`},
		"zero fill_interval":    {bucketConfig(`"token_bucket": {"max_tokens": 1, "fill_interval": "0s"}`), `descriptors[0].token_bucket.fill_interval: "0s" must be at least 1ms`},
		"negative fill_interval": {bucketConfig(`"token_bucket": {"max_tokens": 1, "fill_interval": "-1s"}`),
			`descriptors[0].token_bucket.fill_interval: "-1s" must be at least 1ms`},
		"fill_interval as a number": {bucketConfig(`"token_bucket": {"max_tokens": 1, "fill_interval": 1}`), `fill_interval`},
		"missing max_amount":        {bucketConfig(`"quota": {"valid_duration": "1s"}`), `descriptors[0].quota.max_amount: required`},
		"negative max_amount":       {bucketConfig(`"quota": {"max_amount": -5, "valid_duration": "1s"}`), `descriptors[0].quota.max_amount: must not be negative, got -5`},
		"zero valid_duration":       {bucketConfig(`"quota": {"max_amount": 1, "valid_duration": "0s"}`), `descriptors[0].quota.valid_duration: "0s" must be at least 1ms`},
		"bucket_duration on a fixed window": {bucketConfig(`"quota": {"max_amount": 1, "valid_duration": "1s", "bucket_duration": "100ms"}`),
			`descriptors[0].quota.bucket_duration: only used with "rolling_window": true`},
		"bucket_duration not dividing": {bucketConfig(`"quota": {"max_amount": 1, "valid_duration": "1s", "rolling_window": true, "bucket_duration": "300ms"}`),
			`descriptors[0].quota.bucket_duration: 300ms must divide valid_duration 1s`},
		"too many slots": {bucketConfig(`"quota": {"max_amount": 1, "valid_duration": "1m", "rolling_window": true, "bucket_duration": "100ms"}`),
			`descriptors[0].quota.bucket_duration: 100ms makes 600 slots of valid_duration 1m0s; at most 64`},
		"entry without key":    {bucketConfig(okBucket + `, "entries": [{"source": "method"}]`), `descriptors[0].entries[0].key: required`},
		"entry without source": {bucketConfig(okBucket + `, "entries": [{"key": "m"}]`), `descriptors[0].entries[0].source: required`},
		"bad source":           {bucketConfig(okBucket + `, "entries": [{"key": "c", "source": "cookie"}]`), `descriptors[0].entries[0].source: unknown source "cookie"`},
		"header source without header": {bucketConfig(okBucket + `, "entries": [{"key": "u", "source": "header"}]`),
			`descriptors[0].entries[0].header: required by source "header"`},
		"header on another source": {bucketConfig(okBucket + `, "entries": [{"key": "m", "source": "method", "header": "x"}]`),
			`descriptors[0].entries[0].header: not used by source "method"`},
		"upper-case header": {bucketConfig(okBucket + `, "entries": [{"key": "u", "source": "header", "header": "X-User"}]`),
			`descriptors[0].entries[0].header: "X-User" must be a lower-case header name`},
		"empty prefixes": {bucketConfig(okBucket + `, "entries": [{"key": "p", "source": "path_prefix", "prefixes": []}]`),
			`descriptors[0].entries[0].prefixes: must not be empty`},
		"relative prefix": {bucketConfig(okBucket + `, "entries": [{"key": "p", "source": "path_prefix", "prefixes": ["/a", "api"]}]`),
			`descriptors[0].entries[0].prefixes[1]: "api" must start with '/'`},
		"property without path": {bucketConfig(okBucket + `, "entries": [{"key": "p", "source": "property"}]`),
			`descriptors[0].entries[0].path: required by source "property"`},
		"property with empty segment": {bucketConfig(okBucket + `, "entries": [{"key": "p", "source": "property", "path": ["a", ""]}]`),
			`descriptors[0].entries[0].path: must be a non-empty list of non-empty segments`},
		"duplicate entry key": {bucketConfig(okBucket + `, "entries": [{"key": "m", "source": "method"}, {"key": "m", "source": "authority"}]`),
			`descriptors[0].entries[1].key: "m" is used by an earlier entry`},
		"override without match": {bucketConfig(okBucket + `, "overrides": [{"shadow": true}]`), `descriptors[0].overrides[0].match: must name at least one entry key`},
		"override on unknown key": {bucketConfig(okBucket + `, "entries": [{"key": "m", "source": "method"}], "overrides": [{"match": {"user": "a"}, "shadow": true}]`),
			`descriptors[0].overrides[0].match.user: the descriptor has no entry with key "user"`},
		"override setting nothing": {bucketConfig(okBucket + `, "entries": [{"key": "m", "source": "method"}], "overrides": [{"match": {"m": "GET"}}]`),
			`descriptors[0].overrides[0]: sets nothing`},
		"override with a bad bucket": {bucketConfig(okBucket + `, "entries": [{"key": "m", "source": "method"}], "overrides": [{"match": {"m": "GET"}, "token_bucket": {"max_tokens": 1, "fill_interval": "0"}}]`),
			`descriptors[0].overrides[0].token_bucket.fill_interval: "0" must be at least 1ms`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseConfig([]byte(tc.in))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.True(t, strings.HasPrefix(err.Error(), "plugin configuration: "), err.Error())
		})
	}
}

func TestHostOnly(t *testing.T) {
	for in, want := range map[string]string{
		"reviews":                   "reviews",
		"reviews:9080":              "reviews",
		"reviews.default.svc:80":    "reviews.default.svc",
		"[::1]:8080":                "[::1]",
		"[::1]":                     "[::1]",
		"weird:port":                "weird:port",
		"":                          "",
		":8080":                     "",
		"reviews.default.svc.local": "reviews.default.svc.local",
	} {
		assert.Equal(t, want, string(hostOnly([]byte(in))), in)
	}
}

func TestKeyValuesAreUnambiguous(t *testing.T) {
	key := func(vals ...string) string {
		var b []byte
		for _, v := range vals {
			b = appendKeyValue(b, v)
		}
		return string(b)
	}
	assert.Equal(t, "/5:alice/3:GET", key("alice", "GET"))
	assert.NotEqual(t, key("a/1:b"), key("a", "b"), "a value cannot forge a separator")
	assert.NotEqual(t, key("", "x"), key("x", ""))
	long := strings.Repeat("x", maxValueInKey+1)
	assert.Equal(t, "/#"+"", key(long)[:2])
	assert.Len(t, key(long), 2+16)
	assert.NotEqual(t, key(long), key(long+"y"))
}

func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "0", time.Millisecond: "1", time.Second: "1", 1001 * time.Millisecond: "2", time.Minute: "60",
		1023 * time.Second: "1023", 1024 * time.Second: "1024", time.Hour: "3600"} {
		assert.Equal(t, want, seconds(d), d.String())
	}
}

// Header numbers come from the table up to 1023 and are formatted past it.
func TestUitoa(t *testing.T) {
	for n, want := range map[uint32]string{0: "0", 1023: "1023", 1024: "1024", 4294967295: "4294967295"} {
		assert.Equal(t, want, uitoa(n))
	}
}

func TestMetricNames(t *testing.T) {
	assert.Equal(t, "descriptor=.=per_user;.;decision=.=shadow_denied;.;wasmesh_quota_requests_total", requestsMetric("per_user", "shadow_denied"))
	assert.Equal(t, "descriptor=.=global;.;reason=.=cas_exhausted;.;wasmesh_quota_fail_open_total", failOpenMetric("global", ratelimit.CASExhausted))
}

// The bounds of cas_retries (0 to 100) and tick_period (up to 2^32-1 ms, what a proxy-wasm
// tick takes) hold both ends; one past either end is refused naming the field.
func TestGlobalBoundsAreInclusive(t *testing.T) {
	for in, refused := range map[string]string{
		`"cas_retries": 0`:              "",
		`"cas_retries": 100`:            "",
		`"cas_retries": 101`:            "cas_retries: must be between 0 and 100, got 101",
		`"tick_period": "4294967295ms"`: "",
		`"tick_period": "4294967296ms"`: `tick_period: "4294967296ms" is too long`,
	} {
		_, err := parseConfig([]byte(`{` + in + `, "descriptors": [{"name": "d", ` + okBucket + `}]}`))
		if refused == "" {
			assert.NoError(t, err, in)
		} else if assert.Error(t, err, in) {
			assert.Contains(t, err.Error(), refused)
		}
	}
}

// The configuration's limits hold both ends: 64 descriptors, 16 entries each, a rolling
// window split into ten slots of at least 1 ms when no bucket_duration is set, at most 64
// slots when it is; one past any of them is refused naming the field.
func TestConfigLimitsHoldBothEnds(t *testing.T) {
	descriptors := func(n int) string {
		var ds []string
		for i := range n {
			ds = append(ds, fmt.Sprintf(`{"name": "d%d", %s}`, i, okBucket))
		}
		return `{"descriptors": [` + strings.Join(ds, ", ") + `]}`
	}
	entries := func(n int) string {
		var es []string
		for i := range n {
			es = append(es, fmt.Sprintf(`{"key": "k%d", "source": "method"}`, i))
		}
		return bucketConfig(okBucket + `, "entries": [` + strings.Join(es, ", ") + `]`)
	}
	rolling := func(valid, bucket string) string {
		q := `"quota": {"max_amount": 1, "valid_duration": "` + valid + `", "rolling_window": true`
		if bucket != "" {
			q += `, "bucket_duration": "` + bucket + `"`
		}
		return bucketConfig(q + `}`)
	}
	for name, tc := range map[string]struct{ in, refused string }{
		"64 descriptors":      {in: descriptors(64)},
		"65 descriptors":      {descriptors(65), "descriptors: at most 64 descriptors, got 65"},
		"16 entries":          {in: entries(16)},
		"17 entries":          {entries(17), "descriptors[0].entries: at most 16 entries, got 17"},
		"ten 1ms slots":       {in: rolling("10ms", "")},
		"ten slots under 1ms": {rolling("9ms", ""), "descriptors[0].quota.bucket_duration: required: valid_duration 9ms does not split into 10 slots"},
		"64 slots":            {in: rolling("64ms", "1ms")},
		"65 slots":            {rolling("65ms", "1ms"), "descriptors[0].quota.bucket_duration: 1ms makes 65 slots"},
		"a property entry":    {in: bucketConfig(okBucket + `, "entries": [{"key": "p", "source": "property", "path": ["a", "b"]}]`)},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseConfig([]byte(tc.in))
			if tc.refused == "" {
				assert.NoError(t, err)
			} else if assert.Error(t, err) {
				assert.Contains(t, err.Error(), tc.refused)
			}
		})
	}
}

// Names take letters, digits, '_', '-' and '.'; header names lower-case letters, digits and
// the other characters of an HTTP token. The characters next to each range are refused.
func TestNameAndHeaderCharacters(t *testing.T) {
	assert.True(t, validName("azAZ09_-."))
	for _, c := range []string{"`", "{", "@", "[", "/", ":", "a;b"} {
		assert.False(t, validName(c), c)
	}
	assert.True(t, validHeaderName("az09!#$%&'*+-.^_`|~"))
	for _, c := range []string{"A", "Z", "{", "/", ":", " ", `"`, "`{"} {
		assert.False(t, validHeaderName(c), c)
	}
}
