package wasmbuild

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseWorkUses(t *testing.T) {
	dir := t.TempDir()
	work := filepath.Join(dir, "go.work")
	require.NoError(t, os.WriteFile(work, []byte("go 1.26\n\nuse ./single // comment\nuse (\n\t./a\n\t\"./b\"\n)\n"), 0o644))
	roots, err := parseWorkUses(work)
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(dir, "single"), filepath.Join(dir, "a"), filepath.Join(dir, "b")}, roots)
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	}))
}

// A guest module that lives outside the workspace (its own go.mod under a go.work that does
// not list it) is built with GOWORK=off, once per content.
func TestBuildOutsideTheWorkspaceAndCache(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a wasm module")
	}
	ctx := context.Background()
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "go.work"), []byte("go 1.26\n\nuse ./other\n"), 0o644))
	mod := filepath.Join(root, "guests")
	copyTree(t, filepath.Join("..", "host", "testdata", "guests", "abi"), filepath.Join(mod, "abi"))
	copyTree(t, filepath.Join("..", "host", "testdata", "guests", "hello"), filepath.Join(mod, "hello"))
	require.NoError(t, os.WriteFile(filepath.Join(mod, "go.mod"), []byte("module hostguests\n\ngo 1.26\n"), 0o644))
	opts := Options{CacheDir: t.TempDir()}

	b := New(opts)
	art, err := b.Build(ctx, filepath.Join(mod, "hello"))
	require.NoError(t, err)
	assert.False(t, art.Cached)
	data, err := art.Bytes()
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(data, []byte("\x00asm")))

	again, err := b.Build(ctx, filepath.Join(mod, "hello"))
	require.NoError(t, err)
	assert.Equal(t, art, again, "memoised by the Builder")
	fromDisk, err := Build(ctx, filepath.Join(mod, "hello"), opts)
	require.NoError(t, err)
	assert.True(t, fromDisk.Cached)
	assert.Equal(t, art.Key, fromDisk.Key)

	// Changing a source changes the key.
	f, err := os.OpenFile(filepath.Join(mod, "abi", "abi.go"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("\n// changed\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	changed, err := Build(ctx, filepath.Join(mod, "hello"), opts)
	require.NoError(t, err)
	assert.NotEqual(t, art.Key, changed.Key)
	assert.False(t, changed.Cached)

	// So does a build setting from the environment (a tag that selects no file here).
	t.Setenv("GOFLAGS", "-tags=wasmbuild_key_test")
	tagged, err := Build(ctx, filepath.Join(mod, "hello"), opts)
	require.NoError(t, err)
	assert.NotEqual(t, changed.Key, tagged.Key)
	assert.False(t, tagged.Cached)

	// Forcing the workspace on fails: the module is not in go.work's use list.
	_, err = Build(ctx, filepath.Join(mod, "hello"), Options{CacheDir: opts.CacheDir, Workspace: WorkspaceOn})
	assert.Error(t, err)
}
