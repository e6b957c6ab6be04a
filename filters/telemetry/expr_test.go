package main

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeAttrs serves attributes from a map keyed by canonical attribute name; a missing
// key is a missing attribute.
type fakeAttrs struct {
	names  []string
	values map[string]value
	reads  map[string]int
}

func (f *fakeAttrs) resolver(node nodeReader) attrResolver {
	return func(path []string) (int, valType, error) {
		a, err := lookupAttribute(path, node)
		if err != nil {
			return 0, 0, err
		}
		for i, n := range f.names {
			if n == a.name {
				return i, a.typ, nil
			}
		}
		f.names = append(f.names, a.name)
		return len(f.names) - 1, a.typ, nil
	}
}

func (f *fakeAttrs) attr(slot int) (value, bool) {
	n := f.names[slot]
	if f.reads == nil {
		f.reads = map[string]int{}
	}
	f.reads[n]++
	v, ok := f.values[n]
	return v, ok
}

func noNode([]string) ([]byte, bool) { return nil, false }

func TestExpressions(t *testing.T) {
	attrs := map[string]value{
		"request.host":                {s: "reviews:9080"},
		"request.url_path":            {s: "/api/v1"},
		"request.method":              {s: "GET"},
		"request.headers['x-user']":   {s: "alice"},
		"response.code":               {i: 503},
		"destination.port":            {i: 9080},
		"connection.mtls":             {b: true},
		"upstream_peer.labels['app']": {s: "ratings"},
		"downstream_peer.workload":    {s: "productpage-v1"},
		"request.total_size":          {i: 100},
	}
	for _, tc := range []struct {
		src  string
		typ  valType
		want any // string, int64, bool, or nil for an evaluation error
	}{
		{"request.host", typeString, "reviews:9080"},
		{"request.headers['x-user']", typeString, "alice"},
		{`request.headers["x-user"]`, typeString, "alice"},
		{"request['headers']['x-user']", typeString, "alice"},
		{"request.headers['x-missing']", typeString, nil},
		{"has(request.headers['x-user'])", typeBool, true},
		{"has(request.headers['x-missing'])", typeBool, false},
		{"string(response.code)", typeString, "503"},
		{"string(destination.port)", typeString, "9080"},
		{"string(connection.mtls)", typeString, "true"},
		{"response.code", typeInt, int64(503)},
		{"response.code >= 500 ? 'error' : 'ok'", typeString, "error"},
		{"response.code < 500 ? 'ok' : 'error'", typeString, "error"},
		{"response.code == 503 && request.method == 'GET'", typeBool, true},
		{"response.code != 503 || request.method != 'GET'", typeBool, false},
		{"!connection.mtls", typeBool, false},
		{"request.method + ' ' + request.url_path", typeString, "GET /api/v1"},
		{"request.total_size + 1 - 2", typeInt, int64(99)},
		{"-response.code", typeInt, int64(-503)},
		{"-9223372036854775808", typeInt, int64(math.MinInt64)},
		{"int('42') + 1", typeInt, int64(43)},
		{"int('nope')", typeInt, nil},
		{"size('héllo')", typeInt, int64(5)},
		{"request.url_path.startsWith('/api')", typeBool, true},
		{"request.url_path.endsWith('v2')", typeBool, false},
		{"request.host.contains(':')", typeBool, true},
		{"upstream_peer.labels['app']", typeString, "ratings"},
		{"downstream_peer.workload", typeString, "productpage-v1"},
		{"'it\\'s' + \"\\\"q\\\"\\n\"", typeString, "it's\"q\"\n"},
		{"(1 + 2) == 3", typeBool, true},
		{"'b' > 'a'", typeBool, true},
		{"9223372036854775807 + 1", typeInt, nil}, // overflow is an error, not a wrap
		// Errors absorbed as in CEL.
		{"has(request.headers['x-missing']) && request.headers['x-missing'] == 'a'", typeBool, false},
		{"request.headers['x-missing'] == 'a' && false", typeBool, false},
		{"request.headers['x-missing'] == 'a' || true", typeBool, true},
		{"request.headers['x-missing'] == 'a' || false", typeBool, nil},
		{"has(request.headers['x-missing']) ? request.headers['x-missing'] : 'none'", typeString, "none"},
	} {
		f := &fakeAttrs{values: attrs}
		e, err := compileExpr(tc.src, f.resolver(noNode))
		require.NoError(t, err, tc.src)
		assert.Equal(t, tc.typ, e.typ(), tc.src)
		v, ok := e.eval(f)
		if tc.want == nil {
			assert.False(t, ok, "%s should fail to evaluate", tc.src)
			continue
		}
		require.True(t, ok, "%s should evaluate", tc.src)
		switch want := tc.want.(type) {
		case string:
			assert.Equal(t, want, v.s, tc.src)
		case int64:
			assert.Equal(t, want, v.i, tc.src)
		case bool:
			assert.Equal(t, want, v.b, tc.src)
		}
	}
}

func TestExpressionReadsEachAttributeOnceThroughSlots(t *testing.T) {
	f := &fakeAttrs{values: map[string]value{"request.host": {s: "h"}}}
	e, err := compileExpr("request.host + request.host", f.resolver(noNode))
	require.NoError(t, err)
	assert.Len(t, f.names, 1, "one slot for one attribute")
	_, ok := e.eval(f)
	require.True(t, ok)
}

func TestNodeAttributesAreConstants(t *testing.T) {
	node := func(path []string) ([]byte, bool) {
		if len(path) == 3 && path[2] == "MESH_ID" {
			return []byte("mesh1"), true
		}
		return nil, false
	}
	a, err := lookupAttribute([]string{"node", "metadata", "MESH_ID"}, node)
	require.NoError(t, err)
	assert.Equal(t, srcConst, a.src)
	assert.Equal(t, value{s: "mesh1"}, a.constVal)
	assert.True(t, a.constOK)
	a, err = lookupAttribute([]string{"node", "metadata", "NOPE"}, node)
	require.NoError(t, err)
	assert.False(t, a.constOK)
}

func TestExpressionErrors(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"request.headers['x-user'", `column 25: expected "]", found end of expression`},
		{"request.hots", "column 1: unknown attribute request.hots"},
		{"request.headers", "column 1: unknown attribute request.headers"},
		{"request.headers[request.host]", "column 16: only string literal keys are supported"},
		{"request.duration", "time value, which is not supported"},
		{"upstream_peer.colour", "unknown attribute upstream_peer.colour (a peer has labels['NAME'] and name, namespace"},
		{"bogus", "column 1: unknown attribute bogus"},
		{"request.host == 1", "column 14: cannot compare string == int"},
		{"response.code + 'x'", "operator + needs two strings or two ints, not int and string"},
		{"response.code ? 'a' : 'b'", "condition of ?: must be a bool"},
		{"true ? 'a' : 1", "branches of ?: have different types (string and int)"},
		{"response.code * 2", "operator * is not supported"},
		{"matches(request.host, 'x')", "matches() takes one argument"},
		{"lower(request.host)", "unsupported function lower()"},
		{"request.host.matches('x')", "unsupported method matches()"},
		{"1.5", "unsupported number literal"},
		{"0x10", "unsupported number literal"},
		{"99999999999999999999", "out of range"},
		{"'abc", "unterminated string literal"},
		{"'a\\qb'", `unsupported escape \q`},
		{"null", "null is not supported"},
		{"[1]", "list literals are not supported"},
		{"request.host @ 1", "unexpected character '@'"},
		{"request.host request.method", `column 14: unexpected "request"`},
		{"", "column 1: unexpected end of expression"},
		{"has('x')", "has() needs an attribute"},
		{"!request.host", "operator ! needs a bool, not string"},
		{"int(connection.mtls)", "int() of a bool is not supported"},
		{"size(response.code)", "size() needs a string, not int"},
		{"(1 + 2).x", "only attributes can be selected from or indexed"},
		{"'''", "triple-quoted strings are not supported"},
		{"'''a'''", "triple-quoted strings are not supported"},
	} {
		f := &fakeAttrs{}
		_, err := compileExpr(tc.src, f.resolver(noNode))
		if assert.Error(t, err, tc.src) {
			assert.Contains(t, err.Error(), tc.want, tc.src)
		}
	}
}
