// Package proxytest runs meshproxy as a process for tests: it builds the binary once per
// test binary (or takes WASMESH_BIN_DIR/meshproxy), writes a bootstrap, starts the proxy
// with Envoy's command line, waits for it and reads its admin API.
package proxytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Binary returns the path of the meshproxy binary.
func Binary(tb testing.TB) string {
	tb.Helper()
	if dir := os.Getenv("WASMESH_BIN_DIR"); dir != "" {
		p := filepath.Join(dir, "meshproxy")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "meshproxy-bin-")
		if err != nil {
			buildErr = err
			return
		}
		_, file, _, _ := runtime.Caller(0)
		module := filepath.Join(filepath.Dir(file), "..", "..")
		buildPath = filepath.Join(dir, "meshproxy")
		cmd := exec.Command("go", "build", "-o", buildPath, "./cmd/meshproxy")
		cmd.Dir = module
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build meshproxy: %v\n%s", err, out)
		}
	})
	require.NoError(tb, buildErr)
	return buildPath
}

// Proxy is a running meshproxy.
type Proxy struct {
	tb     testing.TB
	cmd    *exec.Cmd
	Admin  string // host:port
	Dir    string
	stdout *syncBuffer
	stderr *syncBuffer
	done   chan struct{}
	err    error
}

// syncBuffer is a goroutine-safe buffer for a process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Options start a proxy.
type Options struct {
	// Bootstrap is the bootstrap YAML.
	Bootstrap string
	// Args are extra command-line arguments.
	Args []string
	// Dir is the working directory holding the bootstrap; empty: a new temp dir.
	Dir string
	// NoWait skips waiting for LIVE.
	NoWait bool
	// Env is added to the test's environment for the proxy (test hooks, see
	// server/testhooks.go).
	Env []string
}

// Start starts a proxy and stops it when the test ends.
func Start(tb testing.TB, o Options) *Proxy {
	tb.Helper()
	dir := o.Dir
	if dir == "" {
		dir = tb.TempDir()
	}
	cfg := filepath.Join(dir, fmt.Sprintf("envoy-%d.yaml", time.Now().UnixNano()))
	require.NoError(tb, os.WriteFile(cfg, []byte(o.Bootstrap), 0o644))
	adminPath := cfg + ".admin"
	args := append([]string{"-c", cfg, "--admin-address-path", adminPath, "--drain-time-s", "1",
		"--parent-shutdown-time-s", "2", "--concurrency", "2", "-l", "info"}, o.Args...)
	p := &Proxy{tb: tb, Dir: dir, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(Binary(tb), args...)
	if len(o.Env) > 0 {
		p.cmd.Env = append(os.Environ(), o.Env...)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	require.NoError(tb, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(p.Kill)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, err := os.ReadFile(adminPath); err == nil && len(b) > 0 {
			p.Admin = string(b)
			break
		}
		select {
		case <-p.done:
			tb.Fatalf("meshproxy exited before binding its admin address: %v\nstderr:\n%s", p.err, p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("meshproxy did not bind its admin address\nstderr:\n%s", p.stderr.String())
		}
	}
	if !o.NoWait {
		p.WaitReady(20 * time.Second)
	}
	return p
}

// Kill stops the process (SIGKILL) if it still runs.
func (p *Proxy) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Signal sends a signal to the process.
func (p *Proxy) Signal(sig os.Signal) { _ = p.cmd.Process.Signal(sig) }

// Wait waits for the process to exit, up to d; it reports whether it exited.
func (p *Proxy) Wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// Stdout is what the process printed (access logs).
func (p *Proxy) Stdout() string { return p.stdout.String() }

// Stderr is the process's log.
func (p *Proxy) Stderr() string { return p.stderr.String() }

// Get reads an admin path.
func (p *Proxy) Get(path string) (int, string) {
	p.tb.Helper()
	return p.do(http.MethodGet, path)
}

// Post posts to an admin path.
func (p *Proxy) Post(path string) (int, string) {
	p.tb.Helper()
	return p.do(http.MethodPost, path)
}

func (p *Proxy) do(method, path string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, "http://"+p.Admin+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// WaitReady waits for /ready to say LIVE.
func (p *Proxy) WaitReady(d time.Duration) {
	p.tb.Helper()
	p.Eventually(d, "server LIVE", func() bool {
		code, body := p.Get("/ready")
		return code == 200 && strings.TrimSpace(body) == "LIVE"
	})
}

// Eventually polls cond until it holds or d passes.
func (p *Proxy) Eventually(d time.Duration, what string, cond func() bool) {
	p.tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			p.tb.Fatalf("timed out waiting for %s\nstderr:\n%s", what, p.Stderr())
		}
		select {
		case <-p.done:
			p.tb.Fatalf("meshproxy exited while waiting for %s: %v\nstderr:\n%s", what, p.err, p.Stderr())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ListenerAddr returns the bound address of a listener (from /listeners?format=json).
func (p *Proxy) ListenerAddr(name string) string {
	p.tb.Helper()
	var addr string
	p.Eventually(10*time.Second, "listener "+name, func() bool {
		_, body := p.Get("/listeners?format=json")
		var doc struct {
			Statuses []struct {
				Name  string `json:"name"`
				Local struct {
					SA struct {
						Address string `json:"address"`
						Port    int    `json:"port_value"`
					} `json:"socket_address"`
				} `json:"local_address"`
			} `json:"listener_statuses"`
		}
		if json.Unmarshal([]byte(body), &doc) != nil {
			return false
		}
		for _, s := range doc.Statuses {
			if s.Name == name && s.Local.SA.Port != 0 {
				addr = fmt.Sprintf("%s:%d", s.Local.SA.Address, s.Local.SA.Port)
				return true
			}
		}
		return false
	})
	return addr
}

// Stat returns a counter or gauge from /stats?format=json (-1 when absent).
func (p *Proxy) Stat(name string) int64 {
	_, body := p.Get("/stats?format=json")
	var doc struct {
		Stats []json.RawMessage `json:"stats"`
	}
	if json.Unmarshal([]byte(body), &doc) != nil {
		return -1
	}
	for _, raw := range doc.Stats {
		var s struct {
			Name  string `json:"name"`
			Value int64  `json:"value"`
		}
		if json.Unmarshal(raw, &s) == nil && s.Name == name {
			return s.Value
		}
	}
	return -1
}

// CPUTime is the CPU time (user and system) the process has used so far, from
// /proc/<pid>/stat; 0 where /proc is not available.
func (p *Proxy) CPUTime() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0
	}
	var utime, stime int64
	_, _ = fmt.Sscan(f[11], &utime)
	_, _ = fmt.Sscan(f[12], &stime)
	// Clock ticks are 100 per second on Linux (USER_HZ).
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
