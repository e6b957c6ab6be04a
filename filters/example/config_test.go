package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseConfigDefaults(t *testing.T) {
	for _, in := range []string{"", "  \n", "{}"} {
		cfg, err := parseConfig([]byte(in))
		require.NoError(t, err, "%q", in)
		assert.Equal(t, config{Counter: defaultCounter}, cfg, "%q", in)
	}
}

func TestParseConfigErrorsNameTheField(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"unknown field":        {`{"deny_path_prefx": "/a"}`, `plugin configuration: deny_path_prefx: unknown field`},
		"unknown nested field": {`{"response_header": {"nmae": "x"}}`, `plugin configuration: response_header.nmae: unknown field`},
		"field in capitals":    {`{"Counter": "c"}`, `plugin configuration: Counter: unknown field`},
		"wrong type":           {`{"counter": 3}`, `plugin configuration: counter: want a string, not a number`},
		"wrong nested type":    {`{"response_header": {"name": 1}}`, `plugin configuration: response_header.name: want a string, not a number`},
		"empty counter":        {`{"counter": ""}`, `"counter" must not be empty`},
		"header without name":  {`{"response_header": {"value": "v"}}`, `"response_header.name" must not be empty`},
		"upper-case header":    {`{"response_header": {"name": "X-A", "value": "v"}}`, `"response_header.name" "X-A"`},
		"trailing data":        {`{} {}`, `unexpected data after the JSON value`},
		"not JSON":             {`deny everything`, `invalid character`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseConfig([]byte(tc.in))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestDenied(t *testing.T) {
	cfg := config{DenyPathPrefix: "/admin"}
	assert.True(t, cfg.denied("/admin"))
	assert.True(t, cfg.denied("/admin/x"))
	assert.True(t, cfg.denied("/administrator"), "a prefix, not a path segment")
	assert.False(t, cfg.denied("/adm"))
	assert.False(t, cfg.denied("/public/admin"))
	assert.False(t, config{}.denied("/admin"), "no prefix denies nothing")
}
