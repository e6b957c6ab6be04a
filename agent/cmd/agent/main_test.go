package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
)

var agentBinary, proxyBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agent-cmd-")
	if err == nil {
		agentBinary, err = proxytest.BuildPackage(dir, "github.com/wasmesh/wasmesh/agent/cmd/agent", "agent")
	}
	if err == nil {
		proxyBinary, err = proxytest.Build(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runAgent runs the agent binary to completion.
func runAgent(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(agentBinary, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return code, out.String(), errb.String()
}

func TestVersion(t *testing.T) {
	code, out, _ := runAgent(t, nil, "version")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "agent version")
}

func TestWaitSucceedsOnceReady(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	code, _, errOut := runAgent(t, nil, "wait", "--url", srv.URL+"/healthz/ready", "--periodMillis", "20", "--timeoutSeconds", "10")
	assert.Equal(t, 0, code, errOut)
	assert.Contains(t, errOut, "ready after")
	assert.GreaterOrEqual(t, calls.Load(), int32(3))
}

func TestWaitTimesOut(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "proxy is INITIALIZING", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	start := time.Now()
	code, _, errOut := runAgent(t, nil, "wait", "--url", srv.URL, "--periodMillis", "50", "--timeoutSeconds", "1", "--requestTimeoutMillis", "200")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "not ready after 1s")
	assert.Contains(t, errOut, "503")
	assert.GreaterOrEqual(t, time.Since(start), time.Second)
}

func TestRequest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", r.Method, r.URL.RequestURI())
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	code, out, errOut := runAgent(t, nil, "request", "POST", "/drain_listeners?inboundonly&graceful", "--adminAddress", addr)
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "POST /drain_listeners?inboundonly&graceful", out)
	code, _, errOut = runAgent(t, nil, "request", "DELETE", "/x", "--adminAddress", addr)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "DELETE")
}

func TestBadInputExitsNonZeroNamingIt(t *testing.T) {
	podDir := t.TempDir()
	base := []string{"POD_NAME=web-1", "POD_NAMESPACE=shop", "INSTANCE_IP=127.0.0.1", "WASMESH_XDS_PLAINTEXT=true"}
	cases := map[string]struct {
		env  []string
		args []string
		want string
	}{
		"PROXY_CONFIG":   {env: []string{"PROXY_CONFIG=concurrency: [1"}, want: "PROXY_CONFIG"},
		"missing binary": {args: []string{"--binaryPath", "/nonexistent/envoy"}, want: "--binaryPath"},
		"bad annotation": {env: []string{"ISTIO_META_INTERCEPTION_MODE=SIDEWAYS"}, want: "ISTIO_META_INTERCEPTION_MODE"},
		"plaintext xDS off loopback": {env: []string{`PROXY_CONFIG={"discoveryAddress":"istiod.istio-system.svc:15012"}`},
			want: "WASMESH_XDS_PLAINTEXT: plaintext xDS is only for a discovery on loopback"},
		"no mesh root for the XDS proxy": {env: []string{"WASMESH_XDS_PLAINTEXT=false", "XDS_ROOT_CA=/nonexistent/root.pem"},
			want: "the XDS proxy verifies discovery against XDS_ROOT_CA /nonexistent/root.pem"},
		"bad plaintext switch": {env: []string{"WASMESH_XDS_PLAINTEXT=maybe"}, want: `WASMESH_XDS_PLAINTEXT: "maybe" is not a boolean`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"proxy", "sidecar", "--podInfoDir", podDir, "--configPath", t.TempDir(), "--binaryPath", proxyBinary}, c.args...)
			code, _, errOut := runAgent(t, append(base, c.env...), args...)
			assert.NotEqual(t, 0, code)
			assert.Contains(t, errOut, c.want)
		})
	}
}

// sidecarProcess is the agent binary running `proxy sidecar` with meshproxy, as a pod
// runs it, until the test ends.
type sidecarProcess struct {
	cmd    *exec.Cmd
	ip     string
	dir    string
	logs   *proxytest.Output
	exited chan error    // the agent's exit, for the test to receive
	done   chan struct{} // closed once the agent has exited
}

func startSidecar(t *testing.T) *sidecarProcess {
	t.Helper()
	ip := proxytest.Loopback(t, 15000, 15020, 15021, 15090)
	dir := t.TempDir()
	discovery := proxytest.StartDiscovery(t)
	discovery.Configure(proxytest.Config{})
	cmd := exec.Command(agentBinary, "proxy", "sidecar", "--binaryPath", proxyBinary,
		"--configPath", filepath.Join(dir, "proxy"), "--podInfoDir", dir, "--certDir", dir,
		"--discoveryAddress", discovery.Addr(), "--drainDuration", "1s")
	cmd.Env = append(os.Environ(), "POD_NAME=web-1", "POD_NAMESPACE=shop", "INSTANCE_IP="+ip,
		"WASMESH_LOCALHOST="+ip, "WASMESH_WILDCARD="+ip, fmt.Sprintf("WASMESH_BASE_ID=%d", proxytest.BaseID()),
		`PROXY_CONFIG={"terminationDrainDuration":"0.2s"}`, "WASMESH_XDS_PLAINTEXT=true")
	s := &sidecarProcess{cmd: cmd, ip: ip, dir: dir, logs: &proxytest.Output{},
		exited: make(chan error, 1), done: make(chan struct{})}
	cmd.Stderr, cmd.Stdout = s.logs, s.logs
	// The proxy inherits the output pipe; do not wait on it forever if it outlives the agent.
	cmd.WaitDelay = 2 * time.Second
	require.NoError(t, cmd.Start())
	go func() { s.exited <- cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-s.done
	})
	code, _, errOut := runAgent(t, nil, "wait", "--url", "http://"+ip+":15021/healthz/ready", "--periodMillis", "50", "--timeoutSeconds", "20")
	require.Equal(t, 0, code, errOut+"\nagent logs:\n"+s.logs.String())
	return s
}

// TestSidecarProcessStartsWaitsAndStops runs the agent binary as a pod would: start,
// `agent wait` on the proxy's readiness listener, SIGTERM, clean exit.
func TestSidecarProcessStartsWaitsAndStops(t *testing.T) {
	s := startSidecar(t)
	ip, dir, logs, exited := s.ip, s.dir, s.logs, s.exited
	require.FileExists(t, filepath.Join(dir, "proxy", "envoy-rev0.json"))

	// The log level changes at run time.
	level := func(method, query string) (int, string) {
		req, err := http.NewRequest(method, "http://"+ip+":15020/debug/logging"+query, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	c, body := level(http.MethodGet, "")
	assert.Equal(t, 200, c)
	assert.Equal(t, "level: INFO", body)
	c, body = level(http.MethodPut, "?level=debug")
	assert.Equal(t, 200, c)
	assert.Equal(t, "level: DEBUG", body)
	c, _ = level(http.MethodPut, "?level=loud")
	assert.Equal(t, 400, c)
	_, body = level(http.MethodGet, "")
	assert.Equal(t, "level: DEBUG", body, "a bad level changes nothing")

	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		assert.NoError(t, err, logs.String())
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not stop on SIGTERM\n" + logs.String())
	}
	assert.Contains(t, logs.String(), "graceful termination period complete")
	assert.NoFileExists(t, filepath.Join(dir, "proxy", "envoy-rev0.json"), "the epoch's bootstrap is cleaned up")
}

// TestProxyDiesWithItsAgent: however the agent goes (here SIGKILL, which it cannot handle),
// its proxy goes with it, as Envoy does under pilot-agent; no proxy is left serving under
// PID 1.
func TestProxyDiesWithItsAgent(t *testing.T) {
	s := startSidecar(t)
	proxies := childrenOf(t, s.cmd.Process.Pid)
	require.NotEmpty(t, proxies, "the agent runs its proxy as a child process")
	t.Cleanup(func() {
		for _, pid := range proxies {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	require.NoError(t, s.cmd.Process.Kill())
	<-s.exited
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range proxies {
		require.True(t, waitExit(t, pid, deadline), "proxy pid %d outlived its agent", pid)
	}
}

// childrenOf lists the child processes of pid (every thread's children).
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	files, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	require.NoError(t, err)
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, field := range strings.Fields(string(b)) {
			var c int
			_, err := fmt.Sscan(field, &c)
			require.NoError(t, err)
			out = append(out, c)
		}
	}
	return out
}

// waitExit waits until process pid (not a child of the test) has exited, or deadline
// passes: its pidfd becomes readable when it exits. A pid already gone has exited.
func waitExit(t *testing.T, pid int, deadline time.Time) bool {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return true
	}
	require.NoError(t, err)
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue // a signal to the test process (the Go runtime's own)
		}
		require.NoError(t, err)
		if n > 0 {
			return true
		}
	}
}

// The sidecar's help lists the environment it reads, as the injector sets it in a pod.
func TestSidecarHelpListsItsEnvironment(t *testing.T) {
	code, out, errOut := runAgent(t, nil, "proxy", "sidecar", "--help")
	require.Equal(t, 0, code, errOut)
	for _, env := range []string{"POD_NAME", "POD_NAMESPACE", "INSTANCE_IP", "SERVICE_ACCOUNT", "PROXY_CONFIG", "ISTIO_META_",
		"ISTIO_DELTA_XDS", "ISTIO_KUBE_APP_PROBERS", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "MINIMUM_DRAIN_DURATION", "localhost:15012",
		"WASMESH_CA_TOKEN_FILE", "PILOT_CERT_PROVIDER", "CA_ADDR", "CA_ROOT_CA", "ISTIOD_SAN", "TRUST_DOMAIN", "SECRET_TTL",
		"SECRET_GRACE_PERIOD_RATIO", "SECRET_GRACE_PERIOD_RATIO_JITTER", "ECC_SIGNATURE_ALGORITHM", "--credentialsDir", "--sdsSocket",
		"--xdsSocket", "XDS_ROOT_CA", "WASMESH_XDS_PLAINTEXT"} {
		assert.Contains(t, out, env)
	}
}
