package expr_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/filters/telemetry/expr"
)

// attrs is a request's attributes for the tests: a resolver that gives every attribute
// path (joined with dots) a slot and a type, and a reader that serves values by slot from
// a map keyed by that same joined path; a missing key is a missing attribute.
type attrs struct {
	values map[string]expr.Value
	names  []string
}

// attrType is the type of the test attributes; any request header is a string.
func attrType(name string) (expr.Type, bool) {
	if strings.HasPrefix(name, "request.headers.") {
		return expr.String, true
	}
	t, ok := map[string]expr.Type{
		"request.host": expr.String, "request.url_path": expr.String, "request.method": expr.String,
		"response.code": expr.Int, "destination.port": expr.Int, "request.total_size": expr.Int,
		"connection.mtls": expr.Bool, "upstream_peer.labels.app": expr.String,
		"downstream_peer.workload": expr.String,
	}[name]
	return t, ok
}

func (a *attrs) resolve(path []string) (int, expr.Type, error) {
	name := strings.Join(path, ".")
	t, ok := attrType(name)
	if !ok {
		return 0, 0, fmt.Errorf("unknown attribute %s", name)
	}
	for i, n := range a.names {
		if n == name {
			return i, t, nil
		}
	}
	a.names = append(a.names, name)
	return len(a.names) - 1, t, nil
}

func (a *attrs) Attr(slot int) (expr.Value, bool) {
	v, ok := a.values[a.names[slot]]
	return v, ok
}

func TestExpressions(t *testing.T) {
	values := map[string]expr.Value{
		"request.host":             {Str: "reviews:9080"},
		"request.url_path":         {Str: "/api/v1"},
		"request.method":           {Str: "GET"},
		"request.headers.x-user":   {Str: "alice"},
		"response.code":            {Int: 503},
		"destination.port":         {Int: 9080},
		"connection.mtls":          {Bool: true},
		"upstream_peer.labels.app": {Str: "ratings"},
		"downstream_peer.workload": {Str: "productpage-v1"},
		"request.total_size":       {Int: 100},
	}
	for _, tc := range []struct {
		src  string
		typ  expr.Type
		want any // string, int64, bool, or nil for an evaluation error
	}{
		{"request.host", expr.String, "reviews:9080"},
		{"request.headers['x-user']", expr.String, "alice"},
		{`request.headers["x-user"]`, expr.String, "alice"},
		{"request['headers']['x-user']", expr.String, "alice"},
		{"request.headers['x-missing']", expr.String, nil},
		{"has(request.headers['x-user'])", expr.Bool, true},
		{"has(request.headers['x-missing'])", expr.Bool, false},
		{"string(response.code)", expr.String, "503"},
		{"string(destination.port)", expr.String, "9080"},
		{"string(connection.mtls)", expr.String, "true"},
		{"response.code", expr.Int, int64(503)},
		{"response.code >= 500 ? 'error' : 'ok'", expr.String, "error"},
		{"response.code < 500 ? 'ok' : 'error'", expr.String, "error"},
		{"response.code == 503 && request.method == 'GET'", expr.Bool, true},
		{"response.code != 503 || request.method != 'GET'", expr.Bool, false},
		{"!connection.mtls", expr.Bool, false},
		{"request.method + ' ' + request.url_path", expr.String, "GET /api/v1"},
		{"request.total_size + 1 - 2", expr.Int, int64(99)},
		{"-response.code", expr.Int, int64(-503)},
		{"-9223372036854775808", expr.Int, int64(math.MinInt64)},
		{"int('42') + 1", expr.Int, int64(43)},
		{"int('nope')", expr.Int, nil},
		{"size('héllo')", expr.Int, int64(5)},
		{"request.url_path.startsWith('/api')", expr.Bool, true},
		{"request.url_path.endsWith('v2')", expr.Bool, false},
		{"request.host.contains(':')", expr.Bool, true},
		{"upstream_peer.labels['app']", expr.String, "ratings"},
		{"downstream_peer.workload", expr.String, "productpage-v1"},
		{"'it\\'s' + \"\\\"q\\\"\\n\"", expr.String, "it's\"q\"\n"},
		{"(1 + 2) == 3", expr.Bool, true},
		{"'b' > 'a'", expr.Bool, true},
		{"9223372036854775807 + 1", expr.Int, nil}, // overflow is an error, not a wrap
		// Errors absorbed as in CEL.
		{"has(request.headers['x-missing']) && request.headers['x-missing'] == 'a'", expr.Bool, false},
		{"request.headers['x-missing'] == 'a' && false", expr.Bool, false},
		{"request.headers['x-missing'] == 'a' || true", expr.Bool, true},
		{"request.headers['x-missing'] == 'a' || false", expr.Bool, nil},
		{"has(request.headers['x-missing']) ? request.headers['x-missing'] : 'none'", expr.String, "none"},
	} {
		a := &attrs{values: values}
		e, err := expr.Compile(tc.src, a.resolve)
		require.NoError(t, err, tc.src)
		assert.Equal(t, tc.typ, e.Type(), tc.src)
		assert.Equal(t, tc.src, e.String())
		v, ok := e.Eval(a)
		if tc.want == nil {
			assert.False(t, ok, "%s should fail to evaluate", tc.src)
			continue
		}
		require.True(t, ok, "%s should evaluate", tc.src)
		switch want := tc.want.(type) {
		case string:
			assert.Equal(t, want, v.Str, tc.src)
		case int64:
			assert.Equal(t, want, v.Int, tc.src)
		case bool:
			assert.Equal(t, want, v.Bool, tc.src)
		}
	}
}

// Each attribute path is resolved once per occurrence, and the same path written with
// dots or brackets is the same attribute.
func TestExpressionsResolveAttributePaths(t *testing.T) {
	var paths [][]string
	_, err := expr.Compile("request.host + request['host'] + request.headers['x-a.b']", func(p []string) (int, expr.Type, error) {
		paths = append(paths, p)
		return len(paths) - 1, expr.String, nil
	})
	require.NoError(t, err)
	assert.Equal(t, [][]string{{"request", "host"}, {"request", "host"}, {"request", "headers", "x-a.b"}}, paths)
}

func TestExpressionErrors(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"request.headers['x-user'", `column 25: expected "]", found end of expression`},
		{"bogus", "column 1: unknown attribute bogus"},
		{"1 + request.hots", "column 5: unknown attribute request.hots"},
		{"request.headers[request.host]", "column 16: only string literal keys are supported"},
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
		a := &attrs{}
		e, err := expr.Compile(tc.src, a.resolve)
		assert.Nil(t, e, tc.src)
		if assert.Error(t, err, tc.src) {
			assert.Contains(t, err.Error(), tc.want, tc.src)
		}
	}
}

func TestFormat(t *testing.T) {
	assert.Equal(t, "x", expr.Format(expr.String, expr.Value{Str: "x", Int: 1}))
	assert.Equal(t, "-42", expr.Format(expr.Int, expr.Value{Int: -42}))
	assert.Equal(t, "false", expr.Format(expr.Bool, expr.Value{Str: "true"}))
	assert.Equal(t, "true", expr.Format(expr.Bool, expr.Value{Bool: true}))
}

func TestIsIdentifier(t *testing.T) {
	for s, want := range map[string]bool{"a": true, "_a1": true, "A_b": true, "": false, "1a": false, "a-b": false, "a.b": false, "é": false} {
		assert.Equal(t, want, expr.IsIdentifier(s), s)
	}
}

// Evaluation allocates nothing unless the expression builds a string (+ of strings,
// string()): a filter evaluates its dimensions on every request.
func TestEvalDoesNotAllocate(t *testing.T) {
	a := &attrs{values: map[string]expr.Value{"request.method": {Str: "GET"}, "response.code": {Int: 503}}}
	for _, src := range []string{
		"has(request.headers['x-user']) || response.code >= 500 ? request.method : 'ok'",
		"size(request.method) + response.code - 1 == 505 && !(request.method < 'A')",
		"request.method.startsWith('G') ? int('42') : -response.code",
	} {
		e, err := expr.Compile(src, a.resolve)
		require.NoError(t, err, src)
		assert.Zero(t, testing.AllocsPerRun(100, func() {
			if _, ok := e.Eval(a); !ok {
				t.Fatalf("%s has no value", src)
			}
		}), src)
	}
}
