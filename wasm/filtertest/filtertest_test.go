package filtertest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

func kitchenPath(tb testing.TB) string {
	tb.Helper()
	art, err := wasmbuild.Build(context.Background(), filepath.Join("..", "host", "testdata", "guests", "kitchen"), wasmbuild.Options{})
	require.NoError(tb, err)
	return art.Path
}

func loadKitchen(t *testing.T) *Scenario {
	t.Helper()
	s, err := Load(filepath.Join("testdata", "kitchen.yaml"))
	require.NoError(t, err)
	s.Wasm = kitchenPath(t)
	return s
}

func TestKitchenScenarioPasses(t *testing.T) {
	res := Run(context.Background(), nil, loadKitchen(t))
	var out bytes.Buffer
	res.Write(&out, true)
	t.Log(out.String())
	require.NoError(t, res.Err)
	require.Len(t, res.Cases, 4)
	assert.True(t, res.Passed())
	assert.Contains(t, out.String(), "PASS scenario: shared data")
	assert.Contains(t, out.String(), "4 of 4 passed")
}

// gRPC calls answered by the scenario, per cluster: a message after a delay, an error
// status, no answer (the guest's timeout), a failure, an unknown cluster.
func TestGRPCScenarioPasses(t *testing.T) {
	s, err := Load(filepath.Join("testdata", "grpc.yaml"))
	require.NoError(t, err)
	art, err := wasmbuild.Build(context.Background(), filepath.Join("..", "..", "filters", "internal", "sdkguest"), wasmbuild.Options{})
	require.NoError(t, err)
	s.Wasm = art.Path
	res := Run(context.Background(), nil, s)
	var out bytes.Buffer
	res.Write(&out, true)
	t.Log(out.String())
	require.NoError(t, res.Err)
	assert.True(t, res.Passed())
	assert.Contains(t, out.String(), "5 of 5 passed")
}

// Every kind of expectation reports a mismatch, naming the field, the got and the want.
func TestMismatchesAreReported(t *testing.T) {
	s := loadKitchen(t)
	five, nope := "five", "nope"
	c := &s.Cases[1].Expect
	c.Status = 200
	local := false
	c.LocalResponse = &local
	c.Body = &five
	c.ResponseHeaders = map[string]*string{"x-local": &nope, "content-length": nil, "x-missing": &five}
	c.Metrics = map[string]int64{"ticks_total": 5, "undefined_metric": 1}
	c.Logs = []string{"never logged"}
	c.SharedData = map[string]string{"nokey": "x"}
	failed := true
	c.Failed = &failed
	res := Run(context.Background(), nil, s)
	require.NoError(t, res.Err)
	assert.False(t, res.Passed())
	assert.True(t, res.Cases[0].Passed())
	got := strings.Join(res.Cases[1].Problems, "\n")
	for _, want := range []string{
		"status: got 403, want 200",
		"localResponse: got true, want false",
		`body: got "nope", want "five"`,
		`responseHeaders[x-local]: got "yes", want "nope"`,
		`responseHeaders[x-missing]: absent, want "five"`,
		"metrics[ticks_total]: got 4, want 5",
		"metrics[undefined_metric]: not defined by the filter (it defines: ",
		"ticks_total",
		`logs: no line contains "never logged"`,
		`sharedData[nokey]: absent, want "x"`,
		"failed: got false (0 failure(s)), want true",
	} {
		assert.Contains(t, got, want)
	}
	var out bytes.Buffer
	res.Write(&out, false)
	assert.Contains(t, out.String(), "FAIL scenario: ticks fire while the clock advances")
	assert.Contains(t, out.String(), "3 of 4 passed")
}

func TestExpectStartError(t *testing.T) {
	s := loadKitchen(t)
	s.Cases = nil
	s.Plugin.Configuration = []byte(`"fail-configure"`)
	s.Plugin.ExpectStartError = "on_configure returned false"
	res := Run(context.Background(), nil, s)
	require.NoError(t, res.Err)
	assert.True(t, res.Passed())

	s.Plugin.ExpectStartError = "something else"
	res = Run(context.Background(), nil, s)
	assert.False(t, res.Passed())
	assert.Contains(t, res.Start.Problems[0], `does not contain "something else"`)

	s.Plugin.Configuration = []byte(`"tick=1000"`)
	res = Run(context.Background(), nil, s)
	assert.False(t, res.Passed())
	assert.Contains(t, res.Start.Problems[0], "plugin started")
}

func TestBadScenarios(t *testing.T) {
	for name, tc := range map[string]struct{ yaml, want string }{
		"unknown field":     {"wasm: x.wasm\nplugin: {nmae: y}\ncases: [{name: a}]\n", `unknown field "nmae"`},
		"no wasm":           {"cases: [{name: a}]\n", "wasm: the module to load is required"},
		"no cases":          {"wasm: x.wasm\n", "cases: at least one case is required"},
		"unnamed case":      {"wasm: x.wasm\ncases: [{request: {path: /}}]\n", "cases[0].name: required"},
		"duplicate name":    {"wasm: x.wasm\ncases: [{name: a}, {name: a}]\n", `cases[1].name: "a" is used by an earlier case`},
		"worker range":      {"wasm: x.wasm\ncases: [{name: a, worker: 1}]\n", "cases[0] (a).worker: 1 is out of range, the plugin has 1 instance(s)"},
		"bad duration":      {"wasm: x.wasm\ncases: [{name: a, advance: soon}]\n", `duration "soon"`},
		"start with cases":  {"wasm: x.wasm\nplugin: {expectStartError: x}\ncases: [{name: a}]\n", "cannot have cases"},
		"call both":         {"wasm: x.wasm\nhttpCalls: {c: {noAnswer: true, fail: true}}\ncases: [{name: a}]\n", "httpCalls.c: noAnswer and fail exclude each other"},
		"grpc both":         {"wasm: x.wasm\ngrpcCalls: {c: {noAnswer: true, fail: true}}\ncases: [{name: a}]\n", "grpcCalls.c: noAnswer and fail exclude each other"},
		"grpc two messages": {"wasm: x.wasm\ngrpcCalls: {c: {message: a, messageBase64: YQ==}}\ncases: [{name: a}]\n", "grpcCalls.c: message and messageBase64 exclude each other"},
		"grpc base64":       {"wasm: x.wasm\ngrpcCalls: {c: {messageBase64: '!!'}}\ncases: [{name: a}]\n", "grpcCalls.c.messageBase64: illegal base64"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestMissingWasm(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "s.yaml")
	require.NoError(t, os.WriteFile(f, []byte("wasm: gone.wasm\ncases: [{name: a}]\n"), 0o644))
	res := RunFile(context.Background(), nil, f)
	require.Error(t, res.Err)
	assert.Contains(t, res.Err.Error(), filepath.Join(dir, "gone.wasm"))
	assert.False(t, res.Passed())
}

// A case that fails because the filter failed says so first, with the callback, the trap
// and what the guest wrote to stderr, without -v.
func TestFilterFailureIsReported(t *testing.T) {
	s := loadKitchen(t)
	s.Cases = []Case{
		{Name: "panics", Request: Request{Headers: map[string]string{"x-op": "panic"}}, Expect: Expect{Status: 200}},
		{Name: "expected trap", Request: Request{Headers: map[string]string{"x-op": "trap"}}, Expect: Expect{Status: 503}},
	}
	res := Run(context.Background(), nil, s)
	require.NoError(t, res.Err)
	require.Len(t, res.Cases, 2)
	problems := res.Cases[0].Problems
	require.Len(t, problems, 2)
	assert.True(t, strings.HasPrefix(problems[0],
		"the filter trapped in proxy_on_request_headers (instance 0): wasm error: unreachable\nwasm stack trace:\n"), problems[0])
	assert.Contains(t, problems[0], "\nguest stderr:\n\tpanic: guest panic on purpose\n\n\tgoroutine 1 [running]:\n")
	assert.Equal(t, "status: got 503, want 200", problems[1])
	assert.True(t, res.Cases[1].Passed(), "a failure the case expects is no problem")

	var out bytes.Buffer
	res.Write(&out, false)
	assert.Contains(t, out.String(), "FAIL scenario: panics\n"+
		"    the filter trapped in proxy_on_request_headers (instance 0): wasm error: unreachable\n"+
		"        wasm stack trace:\n")
	assert.Contains(t, out.String(), "        guest stderr:\n        \tpanic: guest panic on purpose\n\n        \tgoroutine 1 [running]:\n")
	assert.Contains(t, out.String(), "    status: got 503, want 200\nPASS scenario: expected trap\n")
}

// A file that is not WebAssembly is named by the path the scenario gives, not a digest.
func TestNotWasmIsNamedByItsPath(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "filter.wasm"), []byte("version https://git-lfs.github.com/spec/v1\n"), 0o644))
	f := filepath.Join(dir, "s.yaml")
	require.NoError(t, os.WriteFile(f, []byte("wasm: filter.wasm\ncases: [{name: a}]\n"), 0o644))
	res := RunFile(context.Background(), nil, f)
	require.Error(t, res.Err)
	assert.Equal(t, "harness: wasm module "+filepath.Join(dir, "filter.wasm")+
		`: compile: not a WebAssembly binary: it starts with "vers", not "\x00asm"`, res.Err.Error())
	var ce *host.CompileError
	assert.ErrorAs(t, res.Err, &ce)
}
