package uds

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A socket left by an earlier run is replaced; one another process still serves is not
// taken over (its proxy would reach this agent); a path too long is named.
func TestListen(t *testing.T) {
	dir, err := os.MkdirTemp("", "uds")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "sub", "XDS")

	l, err := Listen("XDS proxy socket", path)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	_, err = Listen("XDS proxy socket", path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "XDS proxy socket "+path+" is in use by another process")

	// Left behind: the file stays when a listener is closed without unlinking it.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
	require.FileExists(t, path)
	l, err = Listen("XDS proxy socket", path)
	require.NoError(t, err, "a stale socket is replaced")
	l.Close()

	_, err = Listen("SDS socket", filepath.Join(dir, strings.Repeat("s", 120)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "longer than a Unix socket path can be")
}
