package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	runtimemetrics "runtime/metrics"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/source"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// BenchmarkPush: for each protocol and scale, discovery and the go-control-plane baseline
// each serve the same load clients; "change=full" adds a ServiceEntry and waits until every
// client has ACKed its cluster and endpoints; "change=endpoints" registers a workload and
// waits until every client has ACKed the new endpoint. At 1000 services and more,
// "server=wasmesh-sidecar-scoped" repeats discovery's run with each proxy scoped by a Sidecar to 10
// services plus a shared namespace, where its changes happen, so every proxy sees them: the
// ratio to the unscoped run is what scoping saves (connect-* metrics: connecting all proxies);
// its "change=full-of-one-scope" adds a service that only the proxies of one client namespace
// import, and "change=endpoints-of-one-scope" repeats the unscoped run's endpoints change
// (svc-0), which only the proxies that import svc-0 see; "change=idle" (a debounce period
// with no change), "change=endpoints-of-no-scope" (an endpoint of a service no proxy
// imports) and "change=full-of-no-scope" (a new service no proxy imports) measure what a
// change costs before any proxy is pushed. Select scales with
// WASMESH_BENCH_SCALES (e.g. "100x100,1000x2000") and protocols with WASMESH_BENCH_XDS
// ("delta", "sotw" or both, comma-separated). The clients run on h2grpc (one goroutine per
// client, as Envoy's event loop); WASMESH_BENCH_CLIENT=grpc-go runs them on grpc-go instead,
// whose transport goroutines and their hand-offs take more of the shared CPU per response
// (client-cpu-s/op shows it).
func BenchmarkPush(b *testing.B) {
	scales, err := ParseScales(os.Getenv("WASMESH_BENCH_SCALES"))
	require.NoError(b, err)
	protocols, err := ParseProtocols(os.Getenv("WASMESH_BENCH_XDS"))
	require.NoError(b, err)
	bin, err := LoaderBinary(b.TempDir())
	require.NoError(b, err)
	for _, delta := range protocols {
		for _, sc := range scales {
			name := fmt.Sprintf("xds=%s/services=%d/proxies=%d", map[bool]string{true: "delta", false: "sotw"}[delta], sc.Services, sc.Proxies)
			b.Run(name, func(b *testing.B) {
				b.Run("server=wasmesh", func(b *testing.B) { benchWasmesh(b, bin, sc, delta, false) })
				if sc.Services >= 1000 {
					// Beside it, the same mesh with every proxy scoped by its namespace's
					// Sidecar to 10 of the services (and the shared namespace).
					b.Run("server=wasmesh-sidecar-scoped", func(b *testing.B) { benchWasmesh(b, bin, sc, delta, true) })
				}
				b.Run("server=go-control-plane", func(b *testing.B) { benchBaseline(b, bin, sc, delta) })
			})
		}
	}
}

// usage is a sample of what the benchmark process (the server) has used.
type usage struct {
	cpu   time.Duration
	bytes int64
}

func sample(bytes *ByteCounter) usage {
	return usage{cpu: processCPU(), bytes: bytes.Bytes()}
}

// processCPU is the CPU this process has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// gcSample is the runtime's estimate of the CPU its collector has used, and the bytes
// allocated on the heap, so far.
type gcSample struct {
	cpu   float64
	alloc uint64
}

func sampleGC() gcSample {
	m := []runtimemetrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/gc/heap/allocs:bytes"}}
	runtimemetrics.Read(m)
	return gcSample{cpu: m[0].Value.Float64(), alloc: m[1].Value.Uint64()}
}

// memory is the live heap plus goroutine stacks after a collection.
func memory() uint64 {
	// Twice: pooled buffers survive one collection in sync.Pool's victim cache.
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

// measure runs change b.N times and reports time to the last ACK, server CPU and bytes.
// WASMESH_BENCH_CPUPROFILE=<dir> profiles the server and the load client during the changes
// (and the server while the proxies connect);
// WASMESH_BENCH_ALLOCPROFILE=<dir> writes the server's allocation profile before and after.
func measure(b *testing.B, loader *Loader, bytes *ByteCounter, op *operator, memPerProxy float64, debounce time.Duration, change func(i int) (start, lastAck time.Time)) {
	// The load client holds the config of every proxy (gigabytes at 2000 proxies): its
	// collection of earlier changes' responses, timed by chance, would add to a change's time
	// what the server does not spend.
	_, err := loader.Wait("gc")
	require.NoError(b, err)
	// The same for the server's garbage from earlier series (a full change at 2000 proxies
	// leaves gigabytes): collecting it, and the runtime's background return of the freed
	// pages to the OS (paced at about 1% of the CPU, it went on for minutes and cost an idle
	// period 2.4-3.3 ms), belong to them. What a series allocates is still collected within it.
	debug.FreeOSMemory()
	if dir := os.Getenv("WASMESH_BENCH_CPUPROFILE"); dir != "" {
		stop := profileServer(b, "")
		_, err = loader.Wait("profile start " + filepath.Join(dir, profileName(b, "client")))
		require.NoError(b, err)
		defer func() {
			stop()
			_, _ = loader.Wait("profile stop")
		}()
	}
	if dir := os.Getenv("WASMESH_BENCH_ALLOCPROFILE"); dir != "" {
		name := strings.NewReplacer("/", "_", "=", "-").Replace(b.Name())
		write := func(suffix string) {
			// The profile is as of the last completed collection: complete one.
			runtime.GC()
			f, err := os.Create(filepath.Join(dir, name+suffix))
			require.NoError(b, err)
			require.NoError(b, pprof.Lookup("allocs").WriteTo(f, 0))
			f.Close()
		}
		write(".allocs-before.pprof")
		defer write(".allocs-after.pprof")
	}
	before, clientBefore, gcBefore, opBefore := sample(bytes), loader.CPU(), sampleGC(), op.used()
	timeChanges(b, debounce, change)
	after, clientAfter, gcAfter, opAfter := sample(bytes), loader.CPU(), sampleGC(), op.used()
	n := float64(b.N)
	// The operator's file writes ran in this process: what they took is not the server's.
	b.ReportMetric((after.cpu-before.cpu-(opAfter-opBefore)).Seconds()/n, "server-cpu-s/op")
	if op != nil {
		b.ReportMetric((opAfter-opBefore).Seconds()/n, "operator-cpu-s/op")
	}
	// Of which the collector's (an estimate): a short run may or may not hold a collection
	// of the live heap, and server-cpu-s/op swings with it; what a change allocates is what
	// it costs the collector in the long run.
	b.ReportMetric((gcAfter.cpu-gcBefore.cpu)/n, "server-gc-cpu-s/op")
	b.ReportMetric(float64(gcAfter.alloc-gcBefore.alloc)/n/(1<<20), "server-alloc-MiB/op")
	// The load client shares the machine: what it spends is not the server's, but it is
	// CPU the server could not have.
	b.ReportMetric((clientAfter-clientBefore).Seconds()/n, "client-cpu-s/op")
	b.ReportMetric(float64(after.bytes-before.bytes)/n/(1<<20), "server-MiB-sent/op")
	b.ReportMetric(memPerProxy/1024, "server-KiB/proxy")
}

// timeChanges runs change b.N times, the timer running, and reports the mean time from a
// change to the last ACK, and beyond the debounce when there is one; it returns that mean.
func timeChanges(b *testing.B, debounce time.Duration, change func(i int) (start, lastAck time.Time)) time.Duration {
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start, last := change(i)
		total += last.Sub(start)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(total.Milliseconds())/n, "ms-to-last-ack")
	if debounce > 0 {
		b.ReportMetric(float64((total-time.Duration(b.N)*debounce).Milliseconds())/n, "ms-beyond-debounce")
	}
	return total / time.Duration(b.N)
}

// operator writes config files, as an operator's tool would, from the benchmark process:
// the CPU its writes take (the file system's, a few hundred microseconds per file here) is
// counted on its own and not as the server's.
type operator struct{ cpu time.Duration }

func (o *operator) write(b *testing.B, path, data string) {
	// The thread's own CPU time covers the write: lock the goroutine to it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := threadCPU()
	require.NoError(b, os.WriteFile(path, []byte(data), 0o644))
	o.cpu += threadCPU() - before
}

// used is the CPU the operator's writes have taken so far (none without an operator).
func (o *operator) used() time.Duration {
	if o == nil {
		return 0
	}
	return o.cpu
}

func threadCPU() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// profileName names a profile file of the running benchmark: <name>[.<phase>].<what>.pprof.
func profileName(b *testing.B, what string) string {
	return strings.NewReplacer("/", "_", "=", "-").Replace(b.Name()) + "." + what + ".pprof"
}

// profileServer starts a CPU profile of the server (the benchmark process) when
// WASMESH_BENCH_CPUPROFILE names a directory, and returns what stops it.
func profileServer(b *testing.B, phase string) (stop func()) {
	dir := os.Getenv("WASMESH_BENCH_CPUPROFILE")
	if dir == "" {
		return func() {}
	}
	what := "server"
	if phase != "" {
		what = phase + "." + what
	}
	f, err := os.Create(filepath.Join(dir, profileName(b, what)))
	require.NoError(b, err)
	require.NoError(b, pprof.StartCPUProfile(f))
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

func benchWasmesh(b *testing.B, bin string, sc Scale, delta, scoped bool) {
	dir := b.TempDir()
	cfg, namespaces := ServiceEntries(sc.Services), 0
	if scoped {
		cfg, namespaces = ScopedConfig(sc.Services), ScopeGroups(sc.Services)
	}
	require.NoError(b, os.WriteFile(filepath.Join(dir, "services.yaml"), []byte(cfg), 0o644))
	bytes := &ByteCounter{}
	opts := discovery.Options{ConfigDir: dir, GRPCAddr: "127.0.0.1:0", Debounce: push.DefaultDebounce(), Server: server.Defaults(), WorkloadGracePeriod: time.Minute,
		ShutdownGrace: time.Second, GRPCOptions: []grpc.ServerOption{grpc.StatsHandler(bytes)}}
	// The clients connect 50 at a time (xdsload's dialers), well within admission's
	// capacity gate; no rate cap (the default).
	d := runDiscovery(b, opts)
	memBefore, rssBefore := memory(), processRSS(b, os.Getpid())
	stopProfile := profileServer(b, "connect")
	connectBefore := sample(bytes)
	loader, err := StartLoader(b.Context(), bin, d.GRPCAddr(), sc.Proxies, delta, namespaces)
	require.NoError(b, err)
	defer loader.Stop()
	connected := sample(bytes)
	stopProfile()
	memPerProxy := float64(int64(memory())-int64(memBefore)) / float64(sc.Proxies)
	// Resident memory as an operator sees it after the proxies connected: the live heap
	// above, plus what the collector has not given back.
	rssPerProxy := (processRSS(b, os.Getpid()) - rssBefore) / float64(sc.Proxies)
	writeHeapProfile(b, "wasmesh", sc)
	debounce := opts.Debounce.After
	op := &operator{}
	report := func(b *testing.B) {
		b.ReportMetric((connected.cpu - connectBefore.cpu).Seconds(), "connect-server-cpu-s")
		b.ReportMetric(float64(connected.bytes-connectBefore.bytes)/(1<<20), "connect-server-MiB")
		b.ReportMetric(rssPerProxy/1024, "connect-server-rss-KiB/proxy")
	}
	var newService func(int) string
	newCluster := ClusterName
	epNamespace, epApp, epCluster := "load", "svc-0", ClusterName(0)
	if scoped {
		newService = func(i int) string { return SharedServiceEntry(i) + "---\n" + sharedWorkloadEntry(i) }
		newCluster = SharedClusterName
		epNamespace, epApp, epCluster = SharedNamespace, "shared-0", SharedClusterName(0)
	} else {
		newService = func(i int) string { return ServiceEntry(i) + "---\n" + workloadEntry(i) }
	}

	next := sc.Services
	if scoped {
		next = 1 // shared-0 exists from the start
	}
	b.Run("change=full", func(b *testing.B) {
		defer report(b)
		measure(b, loader, bytes, op, memPerProxy, debounce, func(int) (time.Time, time.Time) {
			i := next
			next++
			start := time.Now()
			// The file watcher picks the new file up, as it would an operator's change.
			op.write(b, filepath.Join(dir, fmt.Sprintf("extra-%d.yaml", i)), newService(i))
			last, err := loader.Wait("cluster " + newCluster(i))
			require.NoError(b, err)
			return start, last
		})
	})
	seq := 0
	b.Run("change=endpoints", func(b *testing.B) {
		defer report(b)
		measure(b, loader, bytes, op, memPerProxy, debounce, func(int) (time.Time, time.Time) {
			seq++
			ip := fmt.Sprintf("10.200.%d.%d", seq/256%256, seq%256)
			start := time.Now()
			d.State.Workloads(registry.ProxiesSource, source.WorkloadEvent{Updated: []*model.Workload{{Name: fmt.Sprintf("auto-%d", seq), Namespace: epNamespace, Labels: map[string]string{"app": epApp}, IPs: []string{ip}}}})
			last, err := loader.Wait(fmt.Sprintf("endpoint %s %s", epCluster, ip))
			require.NoError(b, err)
			return start, last
		})
	})
	if scoped {
		r := &scopedRun{d: d.Discovery, dir: dir, loader: loader, bytes: bytes, op: op, memPerProxy: memPerProxy, debounce: debounce,
			next: next, seq: seq, report: report}
		r.changes(b)
	}
}

// scopedRun is a Sidecar-scoped run of benchWasmesh, for its changes outside most scopes.
type scopedRun struct {
	d           *discovery.Discovery
	dir         string
	loader      *Loader
	bytes       *ByteCounter
	op          *operator
	memPerProxy float64
	debounce    time.Duration
	next, seq   int
	report      func(*testing.B)
}

// changes measures what a change costs before any proxy is pushed, and changes that only a
// few scopes see.
func (r *scopedRun) changes(b *testing.B) {
	d, dir, loader, bytes, op, memPerProxy, debounce, report := r.d, r.dir, r.loader, r.bytes, r.op, r.memPerProxy, r.debounce, r.report
	next, seq := &r.next, &r.seq
	// What a change costs before any proxy is pushed: an idle debounce period, and an
	// endpoint change of a service no proxy imports (registry, debounce, snapshot, and
	// finding that no connection is concerned). The new service also makes the next changes
	// the first endpoints-only pushes after a full push that passed every proxy by.
	require.NoError(b, os.WriteFile(filepath.Join(dir, "unimported.yaml"), []byte(ServiceEntryIn("unimported", "ghost")), 0o644))
	require.Eventually(b, func() bool { return d.Pusher.Snapshot().Service("ghost.unimported.svc.cluster.local") != nil }, 10*time.Second, 10*time.Millisecond)
	period := debounce + 3*time.Millisecond
	b.Run("change=idle", func(b *testing.B) {
		measure(b, loader, bytes, op, memPerProxy, 0, func(int) (time.Time, time.Time) {
			start := time.Now()
			time.Sleep(period)
			return start, time.Now()
		})
	})
	b.Run("change=endpoints-of-no-scope", func(b *testing.B) {
		measure(b, loader, bytes, op, memPerProxy, 0, func(int) (time.Time, time.Time) {
			*seq++
			start := time.Now()
			d.State.Workloads(registry.ProxiesSource, source.WorkloadEvent{Updated: []*model.Workload{{Name: fmt.Sprintf("ghost-%d", *seq),
				Namespace: "unimported", Labels: map[string]string{"app": "ghost"}, IPs: []string{fmt.Sprintf("10.201.%d.%d", *seq/256%256, *seq%256)}}}})
			time.Sleep(period)
			return start, time.Now()
		})
	})
	// The same for a new service no proxy imports, written as a file: the directory's read,
	// registry, snapshot and finding that no connection is concerned.
	b.Run("change=full-of-no-scope", func(b *testing.B) {
		measure(b, loader, bytes, op, memPerProxy, 0, func(int) (time.Time, time.Time) {
			name := fmt.Sprintf("ghost-%d", *next)
			*next++
			start := time.Now()
			op.write(b, filepath.Join(dir, name+".yaml"), ServiceEntryIn("unimported", name)+"---\n"+workloadEntryIn("unimported", name, IP(*next)))
			host := name + ".unimported.svc.cluster.local"
			for d.Pusher.Snapshot().Service(host) == nil {
				require.Less(b, time.Since(start), 10*time.Second, "%s never reached a snapshot", host)
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(3 * time.Millisecond) // the push that finds no connection concerned
			return start, time.Now()
		})
	})
	// A new service in one client namespace: only the proxies there (1%) import it, the
	// others are not pushed at all (Istio's ProxyNeedsPush). Beside the unscoped run's
	// change=full, where every proxy sees the new service.
	b.Run("change=full-of-one-scope", func(b *testing.B) {
		defer report(b)
		watchers, ns := 0, ClientNamespace(0)
		measure(b, loader, bytes, op, memPerProxy, debounce, func(int) (time.Time, time.Time) {
			name := fmt.Sprintf("local-%d", *next)
			*next++
			start := time.Now()
			op.write(b, filepath.Join(dir, name+".yaml"), ServiceEntryIn(ns, name)+"---\n"+workloadEntryIn(ns, name, IP(*next)))
			last, n, err := loader.WaitCount(fmt.Sprintf("cluster %s %s", ClusterNameIn(ns, name), ns))
			require.NoError(b, err)
			require.Positive(b, n, "no proxy in %s", ns)
			watchers = n
			return start, last
		})
		b.ReportMetric(float64(watchers), "watching-proxies")
	})
	// The unscoped run's endpoints change again (an endpoint of svc-0), which only the
	// proxies whose Sidecar imports svc-0 see: what a scoped proxy costs for a change
	// outside its scope.
	b.Run("change=endpoints-of-one-scope", func(b *testing.B) {
		defer report(b)
		watchers := 0
		measure(b, loader, bytes, op, memPerProxy, debounce, func(int) (time.Time, time.Time) {
			*seq++
			ip := fmt.Sprintf("10.200.%d.%d", *seq/256%256, *seq%256)
			start := time.Now()
			d.State.Workloads(registry.ProxiesSource, source.WorkloadEvent{Updated: []*model.Workload{{Name: fmt.Sprintf("auto-%d", *seq), Namespace: "load", Labels: map[string]string{"app": "svc-0"}, IPs: []string{ip}}}})
			last, n, err := loader.WaitCount(fmt.Sprintf("endpoint-watchers %s %s", ClusterName(0), ip))
			require.NoError(b, err)
			require.Positive(b, n, "no proxy watches %s", ClusterName(0))
			watchers = n
			return start, last
		})
		b.ReportMetric(float64(watchers), "watching-proxies")
	})
}

// baseline generates the resources with discovery's generators (one shared view, as every
// load client looks the same) and serves them from a go-control-plane SnapshotCache.
type baseline struct {
	reg     *registry.ServiceEntries
	configs []*config.Config
	proxy   *model.Proxy
	cache   cachev3.SnapshotCache
	nodes   int
	snap    *xds.Snapshot
	seq     int
}

func (bl *baseline) resources(full bool, hosts map[string]struct{}) *cachev3.Snapshot {
	bl.seq++
	if full || bl.snap == nil {
		bl.snap = xds.NewSnapshot(push.Build(fmt.Sprint(bl.seq), mesh.Default(), config.NewIndex(bl.configs), bl.reg))
	} else {
		bl.snap = bl.snap.WithEndpoints(fmt.Sprint(bl.seq), bl.reg, hosts)
	}
	dump := xds.Dump(xds.NewView(bl.snap, bl.proxy))
	s := &cachev3.Snapshot{}
	for typ, idx := range map[string]types.ResponseType{xds.ClusterType: types.Cluster, xds.EndpointType: types.Endpoint, xds.ListenerType: types.Listener, xds.RouteType: types.Route} {
		items := make([]types.Resource, 0, len(dump[typ].Items))
		for _, r := range dump[typ].Items {
			items = append(items, r.Message)
		}
		// A version per type (the set's hash) so unchanged types are not resent: the
		// baseline used as its authors intend.
		s.Resources[idx] = cachev3.NewResources(fmt.Sprintf("%x", dump[typ].Hash), items)
	}
	return s
}

func (bl *baseline) set(s *cachev3.Snapshot) {
	for i := 0; i < bl.nodes; i++ {
		if err := bl.cache.SetSnapshot(context.Background(), NodeID(i), s); err != nil {
			panic(err)
		}
	}
}

func benchBaseline(b *testing.B, bin string, sc Scale, delta bool) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bl := &baseline{reg: registry.NewServiceEntries(log, metrics.New(prometheus.NewRegistry())), nodes: sc.Proxies,
		cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)}
	for _, d := range config.ParseFile("services.yaml", []byte(ServiceEntries(sc.Services))) {
		require.Nil(b, d.Err)
		bl.configs = append(bl.configs, d.Config)
	}
	bl.reg.SetConfigs(bl.configs)
	md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "load"})
	p, err := model.ParseNode(&core.Node{Id: NodeID(0), Metadata: md})
	require.NoError(b, err)
	bl.proxy = p
	bl.set(bl.resources(true, nil))

	bytes := &ByteCounter{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := grpc.NewServer(grpc.StatsHandler(bytes), grpc.MaxConcurrentStreams(100000))
	discoverypb.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, bl.cache, nil))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()

	memBefore := memory()
	loader, err := StartLoader(ctx, bin, lis.Addr().String(), sc.Proxies, delta, 0)
	require.NoError(b, err)
	defer loader.Stop()
	memPerProxy := float64(int64(memory())-int64(memBefore)) / float64(sc.Proxies)

	next := sc.Services
	b.Run("change=full", func(b *testing.B) {
		measure(b, loader, bytes, nil, memPerProxy, 0, func(int) (time.Time, time.Time) {
			i := next
			next++
			start := time.Now()
			for _, d := range config.ParseFile("extra.yaml", []byte(ServiceEntry(i)+"---\n"+workloadEntry(i))) {
				bl.configs = append(bl.configs, d.Config)
			}
			bl.reg.SetConfigs(bl.configs)
			bl.set(bl.resources(true, nil))
			last, err := loader.Wait("cluster " + ClusterName(i))
			require.NoError(b, err)
			return start, last
		})
	})
	seq := 0
	b.Run("change=endpoints", func(b *testing.B) {
		measure(b, loader, bytes, nil, memPerProxy, 0, func(int) (time.Time, time.Time) {
			seq++
			ip := fmt.Sprintf("10.200.%d.%d", seq/256%256, seq%256)
			start := time.Now()
			bl.reg.SetWorkload(&model.Workload{Name: fmt.Sprintf("auto-%d", seq), Namespace: "load", Labels: map[string]string{"app": "svc-0"}, IPs: []string{ip}})
			bl.set(bl.resources(false, map[string]struct{}{"svc-0.load.svc.cluster.local": {}}))
			last, err := loader.Wait(fmt.Sprintf("endpoint %s %s", ClusterName(0), ip))
			require.NoError(b, err)
			return start, last
		})
	})
}

// writeHeapProfile saves the live heap with all proxies connected when
// WASMESH_BENCH_HEAPPROFILE names a directory.
func writeHeapProfile(b *testing.B, server string, sc Scale) {
	dir := os.Getenv("WASMESH_BENCH_HEAPPROFILE")
	if dir == "" {
		return
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("heap-%s-%dx%d.pprof", server, sc.Services, sc.Proxies)))
	require.NoError(b, err)
	defer f.Close()
	require.NoError(b, pprof.WriteHeapProfile(f))
}
