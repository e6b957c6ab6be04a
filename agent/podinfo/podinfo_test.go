package podinfo

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRoundTrip(t *testing.T) {
	in := map[string]string{
		"app":                            "reviews",
		"sidecar.istio.io/extraStatTags": "a,b",
		"json":                           `{"x":"y\n"}`,
	}
	got, err := Parse(Format(in))
	require.NoError(t, err)
	assert.Equal(t, in, got)
}

func TestParseErrorsNameTheLine(t *testing.T) {
	_, err := Parse("app=\"ok\"\nversion=v1\n")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "line 2")
	assert.Contains(t, err.Error(), "version")
}

func TestReadMissingFilesAreEmpty(t *testing.T) {
	info, err := Read(t.TempDir())
	require.NoError(t, err)
	assert.Empty(t, info.Labels)
	assert.Empty(t, info.Annotations)
}

func TestReadNamesBadFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "annotations"), []byte("broken\n"), 0o644))
	_, err := Read(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join(dir, "annotations"))
}
