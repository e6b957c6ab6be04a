package analyze_test

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/analyze"
)

var update = flag.Bool("update", false, "rewrite the want.txt files")

// Each testdata directory is analyzed; its findings, one log line each, are want.txt (the
// directory's own files named relative to it). clean has none; findings has one of each
// check but WasmPlugins (TestWasmPluginModules).
func TestAnalyzeTestdata(t *testing.T) {
	for _, name := range []string{"clean", "findings"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", name)
			res, err := analyze.Paths([]string{dir}, analyze.Options{})
			require.NoError(t, err)
			var got strings.Builder
			for _, m := range res.Messages {
				fmt.Fprintln(&got, strings.ReplaceAll(m.String(), dir+string(filepath.Separator), ""))
			}
			wantFile := filepath.Join("testdata", name+".want.txt")
			if *update {
				require.NoError(t, os.WriteFile(wantFile, []byte(got.String()), 0o644))
			}
			want, err := os.ReadFile(wantFile)
			require.NoError(t, err)
			assert.Equal(t, string(want), got.String())
			assert.Empty(t, res.ParseErrors)
			assert.NotEmpty(t, res.Files)
		})
	}
}

// A file named directly is analyzed as one in a directory; a document that is not YAML is
// a parse error, apart from the findings (istioctl's).
func TestAnalyzeFileAndParseError(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("apiVersion: networking.istio.io/v1\nkind: [unclosed\n"), 0o644))
	res, err := analyze.Paths([]string{bad}, analyze.Options{})
	require.NoError(t, err)
	require.Len(t, res.ParseErrors, 1)
	assert.Contains(t, res.ParseErrors[0], "bad.yaml: document 1: invalid YAML")
	assert.Empty(t, res.Messages)

	_, err = analyze.Paths([]string{filepath.Join(dir, "missing")}, analyze.Options{})
	assert.Error(t, err)
}

const wasmPlugin = `apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: %s, namespace: shop}
spec:
  url: %s
  sha256: %s
`

// A WasmPlugin's module is read (file://) or fetched (http://) and checked against its
// sha256: a good one gives nothing; a missing file, an HTTP error and a wrong digest are
// each an error naming the module.
func TestWasmPluginModules(t *testing.T) {
	module := []byte("\x00asm\x01\x00\x00\x00")
	sum := sha256.Sum256(module)
	good := hex.EncodeToString(sum[:])
	wrong := strings.Repeat("ab", 32)
	dir := t.TempDir()
	path := filepath.Join(dir, "filter.wasm")
	require.NoError(t, os.WriteFile(path, module, 0o644))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/filter.wasm" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(module)
	}))
	defer srv.Close()
	docs := []string{
		fmt.Sprintf(wasmPlugin, "file-good", "file://"+path, good),
		fmt.Sprintf(wasmPlugin, "http-good", srv.URL+"/filter.wasm", good),
		fmt.Sprintf(wasmPlugin, "file-missing", "file://"+filepath.Join(dir, "gone.wasm"), good),
		fmt.Sprintf(wasmPlugin, "http-404", srv.URL+"/gone.wasm", good),
		fmt.Sprintf(wasmPlugin, "file-bad-sum", "file://"+path, wrong),
	}
	cfgDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(cfgDir, "plugins.yaml"), []byte(strings.Join(docs, "---\n")), 0o644))
	res, err := analyze.Paths([]string{cfgDir}, analyze.Options{})
	require.NoError(t, err)
	got := map[string]string{}
	for _, m := range res.Messages {
		assert.Equal(t, "WSM0004", m.Code)
		assert.Equal(t, analyze.Error, m.Severity())
		got[m.Origin] = m.Message
	}
	assert.Len(t, got, 3, "%v", got)
	assert.Contains(t, got["WasmPlugin shop/file-missing"], "gone.wasm cannot be fetched")
	assert.Contains(t, got["WasmPlugin shop/http-404"], "404")
	assert.Contains(t, got["WasmPlugin shop/file-bad-sum"], "has sha256 "+good+", not "+wrong)

	res, err = analyze.Paths([]string{cfgDir}, analyze.Options{SkipModules: true})
	require.NoError(t, err)
	assert.Empty(t, res.Messages)
}
