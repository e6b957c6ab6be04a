package localmesh

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Crashes, for the tests that kill processes as an OOM killer or a node fault would:
// SIGKILL, no drain, no goodbye.

// KillDiscovery kills discovery with SIGKILL and waits until it is gone; StartDiscovery
// brings it back.
func (m *Mesh) KillDiscovery() {
	m.mu.Lock()
	p := m.discovery
	m.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// KillAgent kills the pod's agent alone with SIGKILL (its proxy goes with it, as a
// container's processes do: the agent starts the proxy with a parent-death signal) and
// waits until it is gone. The application keeps running.
func (p *Pod) KillAgent() {
	a := p.Agent()
	if a == nil {
		return
	}
	_ = a.Signal(syscall.SIGKILL)
	<-a.Done()
}

// ProxyPid is the pid of the proxy the pod's agent runs (its child process).
func (p *Pod) ProxyPid() (int, error) {
	a := p.Agent()
	if a == nil {
		return 0, fmt.Errorf("localmesh: pod %s has no agent", p.Spec.Name)
	}
	kids, err := children(a.Pid())
	if err != nil {
		return 0, err
	}
	if len(kids) != 1 {
		return 0, fmt.Errorf("localmesh: pod %s: the agent has %d child processes, want its proxy alone", p.Spec.Name, len(kids))
	}
	return kids[0], nil
}

// children lists the processes whose parent is pid, from /proc, oldest first (by their
// start time).
func children(pid int) ([]int, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return nil, err
	}
	type kid struct {
		pid   int
		start uint64
	}
	var kids []kid
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ... starttime (the 22nd field): comm may hold spaces, so
		// read after its last ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 20 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		child, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err != nil {
			continue
		}
		start, _ := strconv.ParseUint(fields[19], 10, 64)
		kids = append(kids, kid{child, start})
	}
	sort.Slice(kids, func(i, j int) bool { return kids[i].start < kids[j].start })
	out := make([]int, len(kids))
	for i, k := range kids {
		out[i] = k.pid
	}
	return out, nil
}
