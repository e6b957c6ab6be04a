// Package redistest runs a real redis-server (from PATH) for one test, on a free loopback
// port, and reads its command statistics.
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is one redis-server process; Stop and Start keep its port.
type Server struct {
	Addr string
	t    testing.TB
	dir  string
	port int
	cmd  *exec.Cmd
	// exited delivers cmd.Wait's result.
	exited chan error
	// extra are the arguments after the common ones (a mode).
	extra func(s *Server) []string
}

// Start runs redis-server for the test and stops it at cleanup. Without redis-server on
// PATH the test is skipped (failed when WASMESH_REQUIRE_FIXTURES is set, as in `make test`).
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, nil)
}

func start(t testing.TB, extra func(s *Server) []string) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		msg := "redis-server is not on PATH (`make tools` installs Debian's redis-server)"
		if os.Getenv("WASMESH_REQUIRE_FIXTURES") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	s := &Server{t: t, dir: t.TempDir(), extra: extra}
	var err error
	for range 5 { // a free port may be taken between finding it and redis binding it
		s.port = freePort(t)
		if err = s.start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	t.Cleanup(s.Stop)
	return s
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) start() error {
	var args []string
	if s.extra != nil {
		args = s.extra(s)
	}
	args = append(args, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--loglevel", "warning", "--logfile", filepath.Join(s.dir, "redis.log"))
	if s.extra == nil {
		args = append(args, "--save", "", "--appendonly", "no")
	}
	cmd := exec.Command("redis-server", args...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server on port %d exited: %v", s.port, err)
		default:
		}
		if _, err := s.do("PING"); err == nil {
			s.cmd, s.exited = cmd, exited
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Kill()
	<-exited
	return fmt.Errorf("redis-server on port %d did not answer PING in 10s", s.port)
}

// Stop kills redis-server (SIGKILL: Redis dies as in a crash) and waits until the port
// refuses connections.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
	for range 500 {
		c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
	s.t.Errorf("redis-server on %s still accepts connections after SIGKILL", s.Addr)
}

// Restart starts redis-server again on the same port (empty: nothing was saved).
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// Do sends one command (words without spaces) and returns the reply's text.
func (s *Server) Do(args ...string) string {
	s.t.Helper()
	out, err := s.do(args...)
	if err != nil {
		s.t.Fatalf("redis %v: %v", args, err)
	}
	return out
}

// Calls is how many times Redis ran the command (INFO commandstats), e.g. "incrby".
func (s *Server) Calls(command string) int {
	s.t.Helper()
	info := s.Do("INFO", "commandstats")
	prefix := "cmdstat_" + strings.ToLower(command) + ":calls="
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			n, _, _ := strings.Cut(rest, ",")
			v, err := strconv.Atoi(n)
			if err != nil {
				s.t.Fatalf("commandstats line %q: %v", line, err)
			}
			return v
		}
	}
	return 0
}

// do speaks RESP over a fresh connection: enough for the replies the tests read (status,
// error, integer, bulk string).
func (s *Server) do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)), time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case line == "":
		return "", fmt.Errorf("empty reply")
	case line[0] == '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case line[0] == '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return line[1:], nil
}

// StartCluster runs a Redis Cluster of n masters (no replicas), the slots split evenly, and
// waits until every node reports cluster_state:ok.
func StartCluster(t testing.TB, n int) []*Server {
	t.Helper()
	nodes := make([]*Server, n)
	for i := range nodes {
		nodes[i] = start(t, func(s *Server) []string {
			return []string{"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
				"--save", "", "--appendonly", "no"}
		})
	}
	const slots = 16384
	for i, s := range nodes {
		s.Do("CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(i*slots/n), strconv.Itoa((i+1)*slots/n-1))
		if i > 0 {
			nodes[0].Do("CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(s.port))
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range nodes {
		for !strings.Contains(s.Do("CLUSTER", "INFO"), "cluster_state:ok") {
			if time.Now().After(deadline) {
				t.Fatalf("redis cluster node %s not ok after 20 s:\n%s", s.Addr, s.Do("CLUSTER", "INFO"))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nodes
}

// StartSentinel runs a Sentinel (redis-server --sentinel) watching master under name, and
// waits until it knows the master.
func StartSentinel(t testing.TB, master *Server, name string) *Server {
	t.Helper()
	s := start(t, func(s *Server) []string {
		conf := filepath.Join(s.dir, "sentinel.conf")
		body := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\n", name, master.port)
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return []string{conf, "--sentinel"}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := s.do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
		if err == nil && out == "2" { // an array of host and port
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel %s does not know master %s: %q %v", s.Addr, name, out, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
