package localmesh

import (
	"bytes"
	"context"
	"fmt"
	"os"
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
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, err
	}
	s.FDs = len(fds)
	return s, nil
}
