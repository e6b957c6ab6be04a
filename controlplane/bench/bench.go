// Package bench measures pushes at scale: discovery and a go-control-plane SnapshotCache
// baseline serve the same resources to the same load clients (cmd/xdsload, a separate
// process on loopback gRPC). The benchmarks live in push_bench_test.go, and the Kubernetes
// source's (discovery as a process on a real API server) in kube_bench_test.go.
package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/stats"
)

// Scale is one point of the benchmark matrix.
type Scale struct {
	Services int
	Proxies  int
}

// DefaultScales is the matrix the issue asks for.
var DefaultScales = []Scale{{100, 100}, {100, 500}, {100, 2000}, {1000, 100}, {1000, 500}, {1000, 2000}}

// ParseScales reads "SERVICESxPROXIES,..." (e.g. "100x100,1000x2000"); empty means the
// default matrix.
func ParseScales(spec string) ([]Scale, error) {
	if strings.TrimSpace(spec) == "" {
		return DefaultScales, nil
	}
	var out []Scale
	for _, part := range strings.Split(spec, ",") {
		s, p, ok := strings.Cut(strings.TrimSpace(part), "x")
		sv, err1 := strconv.Atoi(s)
		pv, err2 := strconv.Atoi(p)
		if !ok || err1 != nil || err2 != nil || sv <= 0 || pv <= 0 {
			return nil, fmt.Errorf("scale %q: want SERVICESxPROXIES, e.g. 1000x2000", part)
		}
		out = append(out, Scale{sv, pv})
	}
	return out, nil
}

// ParseProtocols reads "delta,sotw" into delta flags; empty means delta only, the variant
// the targets are set for (SotW is measured on request: it resends every cluster on each
// change and every client repeats all its EDS names in each ACK, by design of the protocol).
func ParseProtocols(spec string) ([]bool, error) {
	if strings.TrimSpace(spec) == "" {
		return []bool{true}, nil
	}
	var out []bool
	for _, p := range strings.Split(spec, ",") {
		switch strings.TrimSpace(p) {
		case "delta":
			out = append(out, true)
		case "sotw":
			out = append(out, false)
		default:
			return nil, fmt.Errorf("xds protocol %q: want delta or sotw", p)
		}
	}
	return out, nil
}

// ServiceEntries renders n ServiceEntries, each selecting its own workloads, and one
// WorkloadEntry per service, in the namespace "load".
func ServiceEntries(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "---\n%s---\n%s", ServiceEntry(i), workloadEntry(i))
	}
	return b.String()
}

// ServiceEntry renders service i.
func ServiceEntry(i int) string { return ServiceEntryIn("load", fmt.Sprintf("svc-%d", i)) }

func workloadEntry(i int) string { return workloadEntryIn("load", fmt.Sprintf("svc-%d", i), IP(i)) }

// IP is a distinct address for index i.
func IP(i int) string { return fmt.Sprintf("10.%d.%d.%d", 1+i/65536, i/256%256, i%256) }

// ClusterName is the outbound cluster of service i.
func ClusterName(i int) string { return ClusterNameIn("load", fmt.Sprintf("svc-%d", i)) }

// Loader drives an xdsload process.
type Loader struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Scanner
	// Synced is what the clients went through until all held their config.
	Synced Sync
}

// Sync is xdsload's ready line: clients whose stream was refused or failed at least once,
// their reconnections (after Envoy's jittered backoff), and the time from the first dial
// until the last client held its config.
type Sync struct {
	Refused, Retries int
	After            time.Duration
}

// LoaderBinary finds xdsload: $WASMESH_BIN_DIR/xdsload when make built it, else go build.
func LoaderBinary(tmp string) (string, error) { return Binary(tmp, "xdsload") }

// Binary finds the command controlplane/cmd/<name>: $WASMESH_BIN_DIR/<name> when make built
// it, else go build into tmp.
func Binary(tmp, name string) (string, error) {
	if dir := os.Getenv("WASMESH_BIN_DIR"); dir != "" {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p := filepath.Join(tmp, name)
	cmd := exec.Command("go", "build", "-o", p, "github.com/wasmesh/wasmesh/controlplane/cmd/"+name)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v: %s", name, err, out)
	}
	return p, nil
}

// StartLoader starts proxies clients against addr and waits until all have their config;
// namespaces > 0 spreads them over that many client namespaces.
func StartLoader(ctx context.Context, bin, addr string, proxies int, delta bool, namespaces int) (*Loader, error) {
	return startLoader(ctx, bin, []string{"--addr", addr, "--proxies", strconv.Itoa(proxies), "--namespaces", strconv.Itoa(namespaces)}, delta)
}

// StartStorm starts proxies clients against addr all at once, each reconnecting after
// Envoy's jittered backoff (base 0.5 s, at most 5 s as in the agent's bootstrap) while
// refused, and waits until all have their config (Loader.Synced says how it went).
func StartStorm(ctx context.Context, bin, addr string, proxies int, delta bool) (*Loader, error) {
	return startLoader(ctx, bin, []string{"--addr", addr, "--proxies", strconv.Itoa(proxies), "--dialers", "0",
		"--retry-base", "500ms", "--retry-max", "5s"}, delta)
}

func startLoader(ctx context.Context, bin string, args []string, delta bool) (*Loader, error) {
	if delta {
		args = append(args, "--delta")
	}
	if os.Getenv("WASMESH_BENCH_CLIENT") == "grpc-go" {
		args = append(args, "--grpc-go") // the clients on grpc-go, to compare with h2grpc
	}
	if p := os.Getenv("WASMESH_BENCH_LOADPROFILE"); p != "" {
		args = append(args, "--cpuprofile", p)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	l := &Loader{cmd: cmd, stdin: stdin, stdout: bufio.NewScanner(stdout)}
	line, err := l.line()
	if err != nil {
		l.Stop()
		return nil, err
	}
	var ms int64
	if _, err := fmt.Sscanf(line, "ready refused=%d retries=%d synced-ms=%d", &l.Synced.Refused, &l.Synced.Retries, &ms); err != nil {
		l.Stop()
		return nil, fmt.Errorf("xdsload: %s", line)
	}
	l.Synced.After = time.Duration(ms) * time.Millisecond
	return l, nil
}

func (l *Loader) line() (string, error) {
	if !l.stdout.Scan() {
		if err := l.stdout.Err(); err != nil {
			return "", err
		}
		return "", io.ErrUnexpectedEOF
	}
	return l.stdout.Text(), nil
}

// CPU is the CPU time the load client has used so far (Linux; zero elsewhere), at the
// kernel's clock tick resolution (10 ms).
func (l *Loader) CPU() time.Duration { return ProcessCPU(l.cmd.Process.Pid) }

// ProcessCPU is the CPU time process pid has used so far (Linux; zero elsewhere), at the
// kernel's clock tick resolution (10 ms).
func ProcessCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which is in parentheses): state is field 3, utime
	// and stime are fields 14 and 15, in ticks of 1/100 s (USER_HZ).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// Wait sends a wait command and returns the time of the last ACK.
func (l *Loader) Wait(command string) (time.Time, error) {
	t, _, err := l.WaitCount(command)
	return t, err
}

// WaitCount is Wait that also returns how many clients the answer counts.
func (l *Loader) WaitCount(command string) (time.Time, int, error) {
	if _, err := fmt.Fprintln(l.stdin, command); err != nil {
		return time.Time{}, 0, err
	}
	line, err := l.line()
	if err != nil {
		return time.Time{}, 0, err
	}
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != "done" {
		return time.Time{}, 0, fmt.Errorf("xdsload: %s", line)
	}
	ns, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return time.Time{}, 0, err
	}
	n, err := strconv.Atoi(f[2])
	if err != nil {
		return time.Time{}, 0, err
	}
	return time.Unix(0, ns), n, nil
}

// Stop ends the process.
func (l *Loader) Stop() {
	_ = l.stdin.Close()
	done := make(chan struct{})
	go func() { _ = l.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = l.cmd.Process.Kill()
		<-done
	}
}

// ByteCounter is a gRPC stats handler counting the bytes a server writes, the same way for
// both servers.
type ByteCounter struct{ n atomic.Int64 }

// Bytes returns the total so far.
func (c *ByteCounter) Bytes() int64 { return c.n.Load() }

// TagRPC implements stats.Handler.
func (c *ByteCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC implements stats.Handler.
func (c *ByteCounter) HandleRPC(_ context.Context, s stats.RPCStats) {
	if p, ok := s.(*stats.OutPayload); ok {
		c.n.Add(int64(p.WireLength))
	}
}

// TagConn implements stats.Handler.
func (c *ByteCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

// HandleConn implements stats.Handler.
func (c *ByteCounter) HandleConn(context.Context, stats.ConnStats) {}

// NodeID is the node id xdsload gives proxy i.
func NodeID(i int) string { return NodeIDIn(i, "load") }

// NodeIDIn is the node id of proxy i in namespace ns.
func NodeIDIn(i int, ns string) string {
	return fmt.Sprintf("sidecar~10.%d.%d.%d~load-%d.%s~%s.svc.cluster.local", 100+i/65536, i/256%256, i%256, i, ns, ns)
}

// The Sidecar-scoped case: proxies spread over client namespaces, each namespace's Sidecar
// importing ScopeSize of the services plus the "shared" namespace; a change every proxy sees
// is a new service in "shared".
const (
	ScopeSize       = 10
	SharedNamespace = "shared"
)

// ClientNamespace is the namespace of proxy group g.
func ClientNamespace(g int) string { return fmt.Sprintf("client-%d", g) }

// ScopeGroups is how many client namespaces scope services in ScopeSize slices.
func ScopeGroups(services int) int { return (services + ScopeSize - 1) / ScopeSize }

// ScopedConfig renders ServiceEntries(services), one shared service with its workload, and a
// Sidecar per client namespace importing its own namespace, its slice of the services and the
// shared namespace.
func ScopedConfig(services int) string {
	var b strings.Builder
	b.WriteString(ServiceEntries(services))
	fmt.Fprintf(&b, "---\n%s---\n%s", SharedServiceEntry(0), sharedWorkloadEntry(0))
	for g := 0; g < ScopeGroups(services); g++ {
		hosts := []string{`"./*"`, `"` + SharedNamespace + `/*"`}
		for k := g * ScopeSize; k < (g+1)*ScopeSize && k < services; k++ {
			hosts = append(hosts, fmt.Sprintf("load/svc-%d.load.svc.cluster.local", k))
		}
		fmt.Fprintf(&b, `---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: %s}
spec:
  egress: [{hosts: [%s]}]
`, ClientNamespace(g), strings.Join(hosts, ", "))
	}
	return b.String()
}

// SharedServiceEntry renders service i of the shared namespace, which every scoped proxy
// imports.
func SharedServiceEntry(i int) string {
	return ServiceEntryIn(SharedNamespace, fmt.Sprintf("shared-%d", i))
}

func sharedWorkloadEntry(i int) string {
	return workloadEntryIn(SharedNamespace, fmt.Sprintf("shared-%d", i), IP(60000+i))
}

// SharedClusterName is the outbound cluster of shared service i.
func SharedClusterName(i int) string {
	return ClusterNameIn(SharedNamespace, fmt.Sprintf("shared-%d", i))
}

// ServiceEntryIn renders service name of namespace ns on port 80, selecting app=name.
func ServiceEntryIn(ns, name string) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: %s, namespace: %s}
spec:
  hosts: [%s.%s.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, targetPort: 8080}]
  workloadSelector: {labels: {app: %s}}
`, name, ns, name, ns, name)
}

func workloadEntryIn(ns, app, ip string) string { return WorkloadEntryNamed(ns, app+"-we", app, ip) }

// WorkloadEntryNamed renders WorkloadEntry name of namespace ns at ip, labelled app=app.
func WorkloadEntryNamed(ns, name, app, ip string) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: %s, namespace: %s}
spec: {address: %s, labels: {app: %s}}
`, name, ns, ip, app)
}

// ClusterNameIn is the outbound cluster of ServiceEntryIn(ns, name).
func ClusterNameIn(ns, name string) string {
	return fmt.Sprintf("outbound|80||%s.%s.svc.cluster.local", name, ns)
}
