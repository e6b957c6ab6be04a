package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/hostbench"
)

// guestFilter is a Wasm filter of BenchmarkProxyOverhead: its name and file, its
// configuration, and its guest time per request measured in the harness, in this
// process, beside the proxy in the same run: back to back (harness), and one request per
// period of the proxy's fixed rate (paced).
type guestFilter struct {
	name, file, config string
	harness, paced     time.Duration
}

// guestTimes is the time the proxy spent in each filter's callbacks, summed over the
// windows between begin and end (wasm.<filter>.callback_time).
type guestTimes struct {
	p       *proxytest.Proxy
	filters []guestFilter
	started []int64
	total   map[string]time.Duration
}

func (g *guestTimes) begin() {
	g.started = g.started[:0]
	for _, f := range g.filters {
		g.started = append(g.started, g.p.Stat("wasm."+f.name+".callback_time"))
	}
}

func (g *guestTimes) end() {
	if g.total == nil {
		g.total = map[string]time.Duration{}
	}
	for i, f := range g.filters {
		g.total[f.name] += time.Duration(g.p.Stat("wasm."+f.name+".callback_time")-g.started[i]) * time.Microsecond
	}
}

// report puts each filter's guest time per request inside the proxy (over requests)
// beside its harness figures. The paced one is the proxy's conditions without the proxy:
// at a fixed rate the thread waits between requests, and code that runs after a wait starts
// with cold caches and runs slower (native Go code as much as a guest's), which requests
// back to back never see. So proxy/paced_harness is what the proxy adds to a guest's time,
// and proxy/harness that and the wait's cost together.
func (g *guestTimes) report(b *testing.B, requests int) {
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	for _, f := range g.filters {
		inProxy := g.total[f.name] / time.Duration(max(requests, 1))
		b.ReportMetric(us(inProxy), f.name+"_guest_us/req")
		b.ReportMetric(us(f.harness), f.name+"_harness_us/req")
		b.ReportMetric(us(f.paced), f.name+"_harness_paced_us/req")
		if f.harness > 0 && f.paced > 0 {
			b.ReportMetric(float64(inProxy)/float64(f.harness), f.name+"_guest_proxy/harness")
			b.ReportMetric(float64(inProxy)/float64(f.paced), f.name+"_guest_proxy/paced_harness")
		}
	}
}

// harnessGuestTimes runs requests like the benchmark's (a GET, a 200 with a 2-byte body,
// on an inbound listener of the bench node) through filter f on the host alone, one
// instance, and returns its callback time per request, measured as meshproxy measures it:
// over n requests back to back (harness), then over paced requests, one starting each
// every (paced). The module is compiled and warmed up once for both.
func harnessGuestTimes(b *testing.B, f guestFilter, n, pacedN int, every time.Duration) (harness, paced time.Duration) {
	b.Helper()
	ctx := context.Background()
	code, err := os.ReadFile(f.file)
	if err != nil {
		b.Fatal(err)
	}
	filter, err := hostbench.Load(ctx, code, host.RuntimeConfig{},
		host.PluginConfig{Name: f.name, RootID: f.name, VMID: f.name, Configuration: []byte(f.config)},
		host.Environment{Properties: map[string]any{"node": benchNode.Property()}})
	if err != nil {
		b.Fatal(err)
	}
	defer filter.Close(ctx)
	x := hostbench.Exchange{
		Request: [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "127.0.0.1"},
			{"user-agent", "Go-http-client/1.1"}, {"accept-encoding", "gzip"}},
		Response:     [][2]string{{":status", "200"}, {"content-length", "2"}, {"content-type", "text/plain; charset=utf-8"}},
		ResponseBody: []byte("ok"),
		Info: host.StreamInfo{Protocol: "HTTP/1.1", ClusterName: "up", Duration: time.Millisecond,
			Properties: map[string]any{"listener_direction": int64(1)}}, // INBOUND
	}
	request := func() {
		if _, err := filter.Do(ctx, x); err != nil {
			b.Fatal(err)
		}
	}
	for range 200 { // warm-up, as the proxy's
		request()
	}
	// measure is the callback time per request over n requests, each after a receive from
	// tick when tick is not nil.
	measure := func(n int, tick <-chan time.Time) time.Duration {
		before := filter.Plugin.Stats()
		for range n {
			if tick != nil {
				<-tick
			}
			request()
		}
		after := filter.Plugin.Stats()
		if len(after.Failures) > 0 {
			b.Fatalf("%s failed in the harness: %v", f.name, after.Failures)
		}
		return (after.CallbackTime - before.CallbackTime) / time.Duration(n)
	}
	harness = measure(n, nil)
	tick := time.NewTicker(every)
	defer tick.Stop()
	return harness, measure(pacedN, tick.C)
}
