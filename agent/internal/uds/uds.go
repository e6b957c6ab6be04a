// Package uds opens the agent's Unix sockets for the proxy (SDS, the XDS proxy): the
// directory made, a stale socket of an earlier run replaced (one still served is refused),
// the socket the owner's only.
package uds

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// maxPath is the longest Unix socket path Linux takes (sun_path less its NUL).
const maxPath = 107

// Listen listens on path; what names the socket in errors ("SDS socket").
func Listen(what, path string) (net.Listener, error) {
	if len(path) > maxPath {
		return nil, fmt.Errorf("%s path %q is %d bytes, longer than a Unix socket path can be (%d)", what, path, len(path), maxPath)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("%s directory: %w", what, err)
	}
	// A socket someone still answers on is another agent's (two agents in one working
	// directory with the default path): taking it over would give this agent's identity to
	// the other agent's proxy.
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("%s %s is in use by another process (two agents in one working directory? give each its own path)", what, path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the old %s: %w", what, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return l, nil
}
