//go:build !wasip1

package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	okService = `"rate_limit_service": {"cluster": "rls", "domain": "mesh"}`
	okGeneric = `"entries": [{"key": "generic_key", "source": "generic_key", "value": "front"}]`
)

func TestGlobalConfigDefaults(t *testing.T) {
	s, err := parseConfig([]byte(`{` + okService + `, "descriptors": [{"name": "g", "mode": "global", ` + okGeneric + `},
		{"name": "l", "token_bucket": {"max_tokens": 1, "fill_interval": "250ms"}}]}`))
	require.NoError(t, err)
	assert.Equal(t, &service{cluster: "rls", grpcService: appendGrpcService(nil, "rls", ""), domain: "mesh",
		timeout: 20 * time.Millisecond, statusOnError: 500}, s.service,
		"Envoy's ratelimit filter defaults: 20 ms, fail open, 500 on error when denying, both request types")
	assert.Equal(t, modeGlobal, s.descriptors[0].mode)
	assert.Nil(t, s.descriptors[0].policy)
	assert.Equal(t, modeLocal, s.descriptors[1].mode)
	assert.Equal(t, 250*time.Millisecond, s.tickPeriod, "a global descriptor has no bucket to tick for")

	s, err = parseConfig([]byte(`{"rate_limit_service": {"cluster": "rls", "authority": "rls.example", "domain": "mesh", "timeout": "0s", "failure_mode_deny": true,
		"status_on_error": 503, "request_type": "external"}, "descriptors": [{"name": "g", "mode": "both", ` + okGeneric + `,
		"quota": {"max_amount": 5, "valid_duration": "1s"}}]}`))
	require.NoError(t, err)
	assert.Equal(t, &service{cluster: "rls", authority: "rls.example", grpcService: appendGrpcService(nil, "rls", "rls.example"),
		domain: "mesh", failureModeDeny: true, statusOnError: 503, requestType: requestExternal}, s.service)
	assert.NotNil(t, s.descriptors[0].policy)
}

func TestGlobalConfigErrorsNameTheField(t *testing.T) {
	global := func(svc, d string) string {
		return `{"rate_limit_service": {` + svc + `}, "descriptors": [{"name": "g", "mode": "global", ` + d + `}]}`
	}
	const cr = `"cluster": "rls", "domain": "mesh"`
	for name, tc := range map[string]struct{ in, want string }{
		"mode misspelt":          {`{"descriptors": [{"name": "g", "mode": "Global", ` + okGeneric + `}]}`, `descriptors[0].mode: unknown mode "Global"; one of "local", "global", "both"`},
		"global with a limit":    {global(cr, okGeneric+`, "token_bucket": {"max_tokens": 1, "fill_interval": "1s"}`), `descriptors[0]: a limit is not used in mode "global"`},
		"global without entry":   {global(cr, `"shadow": true`), `descriptors[0].entries: mode "global" needs at least one entry`},
		"both without a limit":   {`{` + okService + `, "descriptors": [{"name": "g", "mode": "both", ` + okGeneric + `}]}`, `descriptors[0]: mode "both" needs the local bucket`},
		"no service":             {`{"descriptors": [{"name": "l", "token_bucket": {"max_tokens": 1, "fill_interval": "1s"}}, {"name": "g", "mode": "global", ` + okGeneric + `}]}`, `descriptors[1].mode: "global" needs "rate_limit_service"`},
		"service unused":         {`{` + okService + `, "descriptors": [{"name": "l", "token_bucket": {"max_tokens": 1, "fill_interval": "1s"}}]}`, `rate_limit_service: not used`},
		"no cluster":             {global(`"domain": "mesh"`, okGeneric), `rate_limit_service.cluster: required`},
		"no domain":              {global(`"cluster": "rls"`, okGeneric), `rate_limit_service.domain: required`},
		"authority with a space": {global(cr+`, "authority": "rls example"`, okGeneric), `rate_limit_service.authority: "rls example" is not a host name: byte 3 is 0x20`},
		"bad timeout":            {global(cr+`, "timeout": "soon"`, okGeneric), `rate_limit_service.timeout: "soon" is not a duration`},
		"sub-millisecond":        {global(cr+`, "timeout": "1500us"`, okGeneric), `rate_limit_service.timeout: "1500us" must be whole milliseconds`},
		"status_on_error 200":    {global(cr+`, "status_on_error": 200`, okGeneric), `rate_limit_service.status_on_error: must be an HTTP error status, 400 to 599, got 200`},
		"bad request_type":       {global(cr+`, "request_type": "all"`, okGeneric), `rate_limit_service.request_type: unknown request type "all"`},
		"stage is not a field":   {global(cr+`, "stage": 1`, okGeneric), `rate_limit_service.stage: unknown field`},
		"limit in an override":   {global(cr, okGeneric+`, "overrides": [{"match": {"generic_key": "front"}, "token_bucket": {"max_tokens": 1, "fill_interval": "1s"}}]`), `descriptors[0].overrides[0]: a limit is not used in mode "global"`},
		"generic_key no value":   {global(cr, `"entries": [{"key": "k", "source": "generic_key"}]`), `descriptors[0].entries[0].value: required by source "generic_key"`},
		"generic_key empty":      {global(cr, `"entries": [{"key": "k", "source": "generic_key", "value": ""}]`), `descriptors[0].entries[0].value: must not be empty`},
		"generic_key default":    {global(cr, `"entries": [{"key": "k", "source": "generic_key", "value": "v", "default": "d"}]`), `descriptors[0].entries[0].default: not used by source "generic_key"`},
		"value on a header one":  {global(cr, `"entries": [{"key": "k", "source": "header", "header": "x-a", "value": "v"}]`), `descriptors[0].entries[0].value: not used by source "header"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseConfig([]byte(tc.in))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A shadow override is allowed in mode global: the filter decides what to enforce.
func TestGlobalShadowOverride(t *testing.T) {
	s, err := parseConfig([]byte(`{` + okService + `, "descriptors": [{"name": "g", "mode": "global", ` + okGeneric + `,
		"overrides": [{"match": {"generic_key": "front"}, "shadow": true}]}]}`))
	require.NoError(t, err)
	assert.True(t, s.descriptors[0].overrides[0].shadow)
	assert.Nil(t, s.descriptors[0].overrides[0].policy)
}

func TestGlobalDocExampleParses(t *testing.T) {
	s, err := parseConfig([]byte(docExampleAfter(t, "// # Global mode")))
	require.NoError(t, err)
	assert.Equal(t, "mesh", s.service.domain)
	assert.Equal(t, 20*time.Millisecond, s.service.timeout)
	require.Len(t, s.descriptors, 2)
	assert.Equal(t, modeGlobal, s.descriptors[0].mode)
	assert.Equal(t, modeBoth, s.descriptors[1].mode)
}
