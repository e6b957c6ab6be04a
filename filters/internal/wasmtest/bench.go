//go:build !wasip1

package wasmtest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/hostbench"
)

// Exchange is a request and its response, for benchmarks.
type Exchange = hostbench.Exchange

// Bench is one instance of a filter on its own runtime, ready to take exchanges.
type Bench struct {
	tb testing.TB
	f  *hostbench.Filter
	// Plugin is the running filter, for checks after the run.
	Plugin *host.Plugin
	x      Exchange
	// count counts the guest's calls per request, in a separate instance (Compare).
	count func() GuestCounts
}

// NewBench loads the filter in dir into a fresh runtime with one instance; both are
// closed when tb ends.
func NewBench(tb testing.TB, dir string, cfg host.PluginConfig, props map[string]any, x Exchange) *Bench {
	tb.Helper()
	w := newBench(context.Background(), tb, dir, cfg, props, x)
	w.count = func() GuestCounts { return NewCounter(tb, dir, cfg, props).Count(x, countWarmUp, countRequests) }
	return w
}

// newBench is NewBench with the context the module is compiled with (a Counter's carries
// its function listener).
func newBench(ctx context.Context, tb testing.TB, dir string, cfg host.PluginConfig, props map[string]any, x Exchange) *Bench {
	tb.Helper()
	f, err := hostbench.Load(ctx, Bytes(tb, dir), host.RuntimeConfig{Logger: discard()}, cfg,
		host.Environment{Logger: discard(), Properties: props})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = f.Close(context.Background()) })
	return &Bench{tb: tb, f: f, Plugin: f.Plugin, x: x}
}

// The exchanges a Counter sees before counting and counts. The counts include the calls of
// the guest's collector, which runs about once per thousand telemetry requests: 2,000 average
// it in.
const countWarmUp, countRequests = 50, 2000

// Do sends the bench's exchange through the filter and returns the response headers as
// the filter left them.
func (w *Bench) Do() *host.Headers {
	resp, err := w.f.Do(context.Background(), w.x)
	if err != nil {
		w.tb.Fatal(err)
	}
	return resp
}

// MiB is the instance's linear memory.
func (w *Bench) MiB() float64 { return float64(w.Plugin.MemoryBytes()[0]) / (1 << 20) }

// Compare times wasm (one request through the filter in wazero, the benchmark's ns/op)
// and then native (the same logic as native Go) for as many requests, in the same run,
// and reports both side by side with the instance's memory afterwards. Setup is not
// timed: the filter is loaded before and each side sees one warm-up request.
//
// The machine is shared, so beside the means it reports each side's best batch of
// requests (wasm-best-ns/req, native-best-ns/req: the fastest mean over batchSize
// consecutive requests), which other processes disturb far less, and wasm-cpu-ns/req,
// the process's CPU time per wasm request (garbage collection included).
func Compare(b *testing.B, w *Bench, native func()) {
	b.Helper()
	w.Do()
	native()
	var cpu0 int64
	wasmBest := newBest()
	for b.Loop() {
		if cpu0 == 0 {
			cpu0 = cpuTime()
		}
		w.Do()
		wasmBest.tick()
	}
	wasmCPU := float64(cpuTime()-cpu0) / float64(b.N)
	wasmNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	n := b.N
	nativeBest := newBest()
	start := time.Now()
	for range n {
		native()
		nativeBest.tick()
	}
	nativeNs := float64(time.Since(start).Nanoseconds()) / float64(n)
	if st := w.Plugin.Stats(); len(st.Failures) > 0 {
		b.Fatalf("guest failures: %v", st.Failures)
	}
	Report(b, wasmNs, nativeNs, w.MiB())
	if wasmCPU > 0 {
		b.ReportMetric(wasmCPU, "wasm-cpu-ns/req")
	}
	if wb, nb := wasmBest.perRequest(), nativeBest.perRequest(); wb > 0 && nb > 0 {
		b.ReportMetric(wb, "wasm-best-ns/req")
		b.ReportMetric(nb, "native-best-ns/req")
		b.ReportMetric(wb/nb, "best-wasm/native")
	}
	if w.count != nil {
		gc := w.count()
		b.ReportMetric(gc.Calls, "guest-calls/req")
		b.ReportMetric(gc.HostCalls, "host-calls/req")
		b.ReportMetric(gc.Allocs, "guest-allocs/req")
	}
}

// batchSize is the number of requests per timed batch.
const batchSize = 64

// best tracks the fastest batch of requests.
type best struct {
	start time.Time
	n     int
	min   time.Duration
}

func newBest() *best { return &best{start: time.Now(), min: -1} }

func (bt *best) tick() {
	if bt.n++; bt.n < batchSize {
		return
	}
	now := time.Now()
	if d := now.Sub(bt.start); bt.min < 0 || d < bt.min {
		bt.min = d
	}
	bt.n, bt.start = 0, now
}

// BestBatch runs do requests times and returns the best batch's time per request.
func BestBatch(requests int, do func()) float64 {
	bt := newBest()
	for range requests {
		do()
		bt.tick()
	}
	return bt.perRequest()
}

// perRequest is the best batch's time per request; 0 when no batch completed.
func (bt *best) perRequest() float64 {
	if bt.min < 0 {
		return 0
	}
	return float64(bt.min.Nanoseconds()) / batchSize
}

// Report writes the side-by-side figures of a filter benchmark.
func Report(b *testing.B, wasmNs, nativeNs, mib float64) {
	b.ReportMetric(wasmNs, "wasm-ns/req")
	b.ReportMetric(nativeNs, "native-ns/req")
	b.ReportMetric(wasmNs/nativeNs, "wasm/native")
	b.ReportMetric(wasmNs-nativeNs, "added-ns/req")
	b.ReportMetric(mib, "MiB/instance")
}
