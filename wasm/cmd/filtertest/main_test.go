package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

// exampleScenarios copies the example filter's scenario files next to a freshly built
// example.wasm, as a user would have them after `make build`.
func exampleScenarios(t *testing.T) (dir string) {
	t.Helper()
	src := filepath.Join("..", "..", "..", "filters", "example")
	art, err := wasmbuild.Build(context.Background(), src, wasmbuild.Options{})
	require.NoError(t, err)
	dir = t.TempDir()
	wasm, err := art.Bytes()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "example.wasm"), wasm, 0o644))
	files, err := filepath.Glob(filepath.Join(src, "testdata", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		b = bytes.ReplaceAll(b, []byte("../../../build/wasm/example.wasm"), []byte("example.wasm"))
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644))
	}
	return dir
}

func TestExampleScenariosPass(t *testing.T) {
	dir := exampleScenarios(t)
	var out, errOut bytes.Buffer
	code := run([]string{filepath.Join(dir, "scenario.yaml"), filepath.Join(dir, "bad-config.scenario.yaml")}, &out, &errOut)
	t.Log(out.String(), errOut.String())
	assert.Equal(t, 0, code)
	assert.Contains(t, out.String(), "PASS "+filepath.Join(dir, "scenario.yaml")+": denied path gets a local 403")
	assert.Contains(t, out.String(), "3 of 3 passed")
	assert.Contains(t, out.String(), "PASS "+filepath.Join(dir, "bad-config.scenario.yaml")+": plugin refuses to start")
}

func TestFailingCaseExitsOne(t *testing.T) {
	dir := exampleScenarios(t)
	f := filepath.Join(dir, "scenario.yaml")
	b, err := os.ReadFile(f)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(f, bytes.Replace(b, []byte("status: 403"), []byte("status: 401"), 1), 0o644))
	var out, errOut bytes.Buffer
	code := run([]string{"-v", f}, &out, &errOut)
	assert.Equal(t, 1, code)
	assert.Contains(t, out.String(), "FAIL "+f+": denied path gets a local 403\n    status: got 403, want 401")
	assert.Contains(t, out.String(), "2 of 3 passed")
}

func TestBadScenarioFileExitsOne(t *testing.T) {
	f := filepath.Join(t.TempDir(), "s.yaml")
	require.NoError(t, os.WriteFile(f, []byte("wasm: x.wasm\ncases: [{name: a, expect: {satus: 200}}]\n"), 0o644))
	var out, errOut bytes.Buffer
	code := run([]string{f}, &out, &errOut)
	assert.Equal(t, 1, code)
	assert.Contains(t, out.String(), f+`: unknown field "satus" (line 2)`)
}

func TestUsageExitsTwo(t *testing.T) {
	for _, args := range [][]string{nil, {"--no-such-flag", "x.yaml"}} {
		var out, errOut bytes.Buffer
		assert.Equal(t, 2, run(args, &out, &errOut), strings.Join(args, " "))
		assert.Contains(t, errOut.String(), "usage: filtertest")
	}
}
