package localmesh

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/wasmesh/wasmesh/testenv/internal/httpget"
)

// ProcessInfo is one running process of the mesh, for leak checks: its name
// ("discovery", "<pod>/agent", "<pod>/proxy", "<pod>/app"), pid, and, for the Go processes
// that expose it, a reader of its goroutine count.
type ProcessInfo struct {
	Name       string
	Pid        int
	Goroutines func(ctx context.Context) (int, error) // nil: not exposed
}

// Processes lists discovery and every running pod's processes.
func (m *Mesh) Processes() []ProcessInfo {
	var out []ProcessInfo
	m.mu.Lock()
	d := m.discovery
	m.mu.Unlock()
	if d != nil && d.Running() {
		out = append(out, ProcessInfo{Name: "discovery", Pid: d.Pid(), Goroutines: func(ctx context.Context) (int, error) {
			return metricValue(ctx, m.DiscoveryURL("/metrics"), "go_goroutines")
		}})
	}
	for _, p := range m.Pods() {
		if !p.Running() {
			continue
		}
		out = append(out, ProcessInfo{Name: p.Spec.Name + "/agent", Pid: p.Agent().Pid(), Goroutines: func(ctx context.Context) (int, error) {
			return goroutines(ctx, p.StatusURL("/debug/pprof/goroutine?debug=1"))
		}})
		// Its proxies: one, or two epochs during a hot restart. The newest is the live one,
		// whose admin API gives the goroutines; an older one is named as such.
		kids, _ := children(p.Agent().Pid())
		for i, pid := range kids {
			pi := ProcessInfo{Name: p.Spec.Name + "/proxy (old epoch)", Pid: pid}
			if i == len(kids)-1 {
				pi.Name = p.Spec.Name + "/proxy"
				pi.Goroutines = func(ctx context.Context) (int, error) {
					return goroutines(ctx, p.AdminURL("/debug/pprof/goroutine?debug=1"))
				}
			}
			out = append(out, pi)
		}
		p.mu.Lock()
		app := p.app
		p.mu.Unlock()
		if app != nil && app.Running() {
			out = append(out, ProcessInfo{Name: p.Spec.Name + "/app", Pid: app.Pid()})
		}
	}
	return out
}

// goroutines reads the total of a Go goroutine profile in text form ("goroutine profile:
// total N").
func goroutines(ctx context.Context, url string) (int, error) {
	b, err := httpget.Get(ctx, url)
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	n, ok := strings.CutPrefix(string(line), "goroutine profile: total ")
	if !ok {
		return 0, fmt.Errorf("%s: not a goroutine profile: %q", url, line)
	}
	return strconv.Atoi(n)
}

// metricValue reads an unlabelled metric from a Prometheus page.
func metricValue(ctx context.Context, url, name string) (int, error) {
	b, err := httpget.Get(ctx, url)
	if err != nil {
		return 0, err
	}
	m, err := ParseMetrics(b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", url, err)
	}
	s := m.Series(name, nil)
	if len(s) != 1 {
		return 0, fmt.Errorf("%s: %d series of %s, want 1", url, len(s), name)
	}
	return int(s[0].Value), nil
}

// ProcStats are a process's resident memory and open descriptors, from /proc.
type ProcStats struct {
	RSS int64 // bytes
	FDs int
	// Sockets are the descriptors among FDs that are sockets (listeners, connections).
	Sockets int
}

// ReadProcStats reads pid's ProcStats.
func ReadProcStats(pid int) (ProcStats, error) {
	var s ProcStats
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return s, fmt.Errorf("/proc/%d/status: VmRSS %q: %w", pid, v, err)
			}
			s.RSS = kb << 10
		}
	}
	inodes, fds, err := socketInodes(pid)
	if err != nil {
		return s, err
	}
	s.FDs, s.Sockets = fds, len(inodes)
	return s, nil
}

// socketInodes reads pid's descriptors: the inodes of those that are sockets, and how
// many there are in all.
func socketInodes(pid int) (map[string]bool, int, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	return inodes, len(fds), nil
}

// TCPPeers counts pid's IPv4 TCP connections (every state but LISTEN) by the remote IP,
// from /proc/<pid>/net/tcp and the process's socket descriptors.
func TCPPeers(pid int) (map[string]int, error) {
	inodes, _, err := socketInodes(pid)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return nil, err
	}
	peers := map[string]int{}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
		f := strings.Fields(line)
		if len(f) < 10 || !inodes[f[9]] || f[3] == tcpListen {
			continue
		}
		hexIP, _, _ := strings.Cut(f[2], ":")
		v, err := strconv.ParseUint(hexIP, 16, 32)
		if err != nil {
			return nil, fmt.Errorf("/proc/%d/net/tcp: remote address %q: %w", pid, f[2], err)
		}
		// The kernel prints the address as a native (little-endian) 32-bit word.
		peers[fmt.Sprintf("%d.%d.%d.%d", byte(v), byte(v>>8), byte(v>>16), byte(v>>24))]++
	}
	return peers, nil
}

// tcpListen is TCP_LISTEN in /proc/net/tcp's st column.
const tcpListen = "0A"
