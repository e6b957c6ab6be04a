package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// hop is one mesh hop as two sidecars make it, both driven over ADS with their certificates
// from the agent's SDS server (the real agent/sds and controlplane/ca): the client side "a"
// has outbound listeners to the server side "b", whose inbound listener "in" is Istio's
// PERMISSIVE one (the TLS inspector; a mutual TLS chain with XFCC APPEND_FORWARD and a
// plaintext chain) in front of the app. Each of a's listeners reaches b in one mode:
// "out-mtls" and "tcp-mtls" through Istio's auto mTLS cluster (endpoint tlsMode=istio, b's
// SAN checked), "out-plain" and "tcp-plain" through a plaintext cluster. out-* are HTTP
// connection managers (keep-alive upstream pools), tcp-* are tcp_proxy (one upstream
// connection, so one handshake, per downstream connection).
type hop struct {
	a, b *proxytest.Proxy
	app  string // the app's URL, the baseline
}

// hopModes are the clusters a has towards b.
var hopModes = []string{"mtls", "plain"}

func newHop(tb testing.TB) *hop {
	tb.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	tb.Cleanup(app.Close)
	pk := newPKI(tb)
	now := time.Now()

	_, bPath := startSDS(tb, pk.bundle(tb, "b", now, time.Hour))
	cpB := newControlPlane(tb, "")
	cpB.set("v1", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {edsCluster("app")},
		resourcev3.EndpointType: {endpoints("app", app.Listener.Addr().String())},
		resourcev3.ListenerType: {inboundListener(tb, "in", "r-in", true)},
		resourcev3.RouteType:    {routeTo("r-in", "app")},
	})
	h := &hop{app: app.URL + "/"}
	h.b = proxytest.Start(tb, proxytest.Options{Bootstrap: sdsBootstrap(cpB.addr, bPath), NoWait: true})
	h.b.WaitReady(20 * time.Second)
	in := h.b.ListenerAddr("in")

	_, aPath := startSDS(tb, pk.bundle(tb, "a", now, time.Hour))
	cpA := newControlPlane(tb, "")
	cpA.set("v1", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {mtlsCluster(tb, "b-mtls", spiffe("b")), edsCluster("b-plain")},
		resourcev3.EndpointType: {istioEndpoints("b-mtls", in), endpoints("b-plain", in)},
		resourcev3.ListenerType: {httpListener(tb, "out-mtls", "r-mtls", corev3.TrafficDirection_OUTBOUND),
			httpListener(tb, "out-plain", "r-plain", corev3.TrafficDirection_OUTBOUND),
			tcpListener(tb, "tcp-mtls", "b-mtls"), tcpListener(tb, "tcp-plain", "b-plain")},
		resourcev3.RouteType: {routeTo("r-mtls", "b-mtls"), routeTo("r-plain", "b-plain")},
	})
	h.a = proxytest.Start(tb, proxytest.Options{Bootstrap: sdsBootstrap(cpA.addr, aPath), NoWait: true})
	h.a.WaitReady(20 * time.Second)
	return h
}

// handshakes are the TLS handshakes b's inbound listener and a's mTLS cluster completed.
func (h *hop) handshakes() (a, b int64) {
	return h.a.Stat("cluster.b-mtls.ssl.handshake"), h.b.Stat("listener.in.ssl.handshake")
}

// inboundRequests are the requests b's inbound listener served on its mutual TLS chain
// (connection manager "in") and on its plaintext chain ("in_plain").
func (h *hop) inboundRequests() (mtls, plain int64) {
	return h.b.Stat("http.in.downstream_rq_total"), h.b.Stat("http.in_plain.downstream_rq_total")
}

// cpu is the CPU time of both proxies.
func (h *hop) cpu() [2]time.Duration { return [2]time.Duration{h.a.CPUTime(), h.b.CPUTime()} }

// BenchmarkMutualTLSHop measures one mesh hop (two meshproxies) at a fixed 1,000 requests
// per second over keep-alive connections, in one run: the app directly, the hop in
// plaintext and the hop in mutual TLS, in interleaved rounds. It reports P50/P99 of each,
// what each hop adds over the direct path and what mutual TLS adds over plaintext (the
// figures are for a hop, two proxies), and each proxy's CPU time per request in each mode.
// It fails unless the mTLS requests reached b's mutual TLS chain after a real handshake
// and the plaintext ones its plaintext chain.
func BenchmarkMutualTLSHop(b *testing.B) {
	h := newHop(b)
	targets := []struct{ name, url string }{
		{"direct", h.app},
		{"plain", "http://" + h.a.ListenerAddr("out-plain") + "/"},
		{"mtls", "http://" + h.a.ListenerAddr("out-mtls") + "/"},
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 1024}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for _, t := range targets { // warm up the connection pools
		throughput(b, c, t.url, 200)
	}
	mtls0, plain0 := h.inboundRequests()
	b.ResetTimer()
	const rounds = 3
	lat := map[string][]time.Duration{}
	cpu := map[string][2]time.Duration{}
	for r := 0; r < rounds; r++ {
		for i := range targets { // each round in another order
			t := targets[(i+r)%len(targets)]
			before := h.cpu()
			lat[t.name] = append(lat[t.name], fixedRate(b, c, t.url, 1000, time.Second)...)
			after, sum := h.cpu(), cpu[t.name]
			for i := range sum {
				sum[i] += after[i] - before[i]
			}
			cpu[t.name] = sum
		}
	}
	b.StopTimer()
	mtls1, plain1 := h.inboundRequests()
	if got, want := mtls1-mtls0, int64(len(lat["mtls"])); got < want {
		b.Fatalf("b's mutual TLS chain served %d requests of the %d sent over the mTLS cluster", got, want)
	}
	if got, want := plain1-plain0, int64(len(lat["plain"])); got < want {
		b.Fatalf("b's plaintext chain served %d requests of the %d sent over the plaintext cluster", got, want)
	}
	if ha, hb := h.handshakes(); ha < 1 || hb < 1 {
		b.Fatalf("no TLS handshake between the proxies: a's cluster %d, b's listener %d", ha, hb)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(0, "ns/op")
	p50, p99 := map[string]time.Duration{}, map[string]time.Duration{}
	for _, t := range targets {
		p50[t.name], p99[t.name] = percentile(lat[t.name], 0.50), percentile(lat[t.name], 0.99)
		b.ReportMetric(ms(p50[t.name]), t.name+"_p50_ms")
		b.ReportMetric(ms(p99[t.name]), t.name+"_p99_ms")
		// The rate reached: fixedRate's ticker drops ticks when the machine is too busy.
		b.ReportMetric(float64(len(lat[t.name]))/rounds, t.name+"_rps")
	}
	for _, mode := range hopModes {
		b.ReportMetric(ms(p50[mode]-p50["direct"]), "hop_"+mode+"_added_p50_ms")
		b.ReportMetric(ms(p99[mode]-p99["direct"]), "hop_"+mode+"_added_p99_ms")
	}
	b.ReportMetric(ms(p50["mtls"]-p50["plain"]), "mtls_over_plain_added_p50_ms")
	b.ReportMetric(ms(p99["mtls"]-p99["plain"]), "mtls_over_plain_added_p99_ms")
	for _, mode := range hopModes {
		n := float64(len(lat[mode]))
		b.ReportMetric(float64(cpu[mode][0].Microseconds())/n, mode+"_client_proxy_cpu_us/req")
		b.ReportMetric(float64(cpu[mode][1].Microseconds())/n, mode+"_server_proxy_cpu_us/req")
	}
}

// connectThrough opens n new connections to addr, workers at a time, each carrying one
// HTTP/1.1 request with Connection: close, and returns the wall time taken.
func connectThrough(b *testing.B, addr string, n, workers int) time.Duration {
	var wg sync.WaitGroup
	next := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		next <- struct{}{}
	}
	close(next)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				if err := oneConnection(addr); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

func oneConnection(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", addr, resp.StatusCode)
	}
	return nil
}

// BenchmarkMutualTLSHandshakes measures connection setup through one mesh hop: new
// connections (no reuse, no session resumption) to a's tcp_proxy listeners, each making a
// new upstream connection to b, as fast as 4 clients can, a fixed count per mode in
// interleaved rounds. It reports, for mutual TLS and for the plaintext baseline, the
// connections per CPU-second of each proxy (per core), and the handshakes per CPU-second
// of the TLS part alone (the mTLS CPU less the plaintext CPU). It fails unless every mTLS
// connection made exactly one handshake at each end and the plaintext ones none.
func BenchmarkMutualTLSHandshakes(b *testing.B) {
	h := newHop(b)
	addrs := map[string]string{"mtls": h.a.ListenerAddr("tcp-mtls"), "plain": h.a.ListenerAddr("tcp-plain")}
	for _, mode := range hopModes { // warm up: b's pool to the app, the secrets
		connectThrough(b, addrs[mode], 20, 4)
	}
	const rounds, perRound, workers = 3, 400, 4
	cpu := map[string][2]time.Duration{}
	wall := map[string]time.Duration{}
	hs := map[string][2]int64{}
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		for _, mode := range hopModes {
			a0, b0 := h.handshakes()
			before := h.cpu()
			wall[mode] += connectThrough(b, addrs[mode], perRound, workers)
			after, sum := h.cpu(), cpu[mode]
			for i := range sum {
				sum[i] += after[i] - before[i]
			}
			cpu[mode] = sum
			a1, b1 := h.handshakes()
			n := hs[mode]
			hs[mode] = [2]int64{n[0] + a1 - a0, n[1] + b1 - b0}
		}
	}
	b.StopTimer()
	const total = rounds * perRound
	if hs["mtls"] != [2]int64{total, total} {
		b.Fatalf("%d mTLS connections made %d handshakes at a's cluster and %d at b's listener", total, hs["mtls"][0], hs["mtls"][1])
	}
	if hs["plain"] != [2]int64{0, 0} {
		b.Fatalf("plaintext connections made TLS handshakes: %v", hs["plain"])
	}
	b.ReportMetric(0, "ns/op")
	for _, mode := range hopModes {
		b.ReportMetric(total/wall[mode].Seconds(), mode+"_conn/s")
		b.ReportMetric(total/cpu[mode][0].Seconds(), mode+"_client_proxy_conn/cpu_s")
		b.ReportMetric(total/cpu[mode][1].Seconds(), mode+"_server_proxy_conn/cpu_s")
	}
	for i, side := range []string{"client", "server"} {
		tlsCPU := cpu["mtls"][i] - cpu["plain"][i]
		b.ReportMetric(float64(tlsCPU.Microseconds())/total, side+"_proxy_tls_cpu_us/handshake")
		if tlsCPU > 0 {
			b.ReportMetric(total/tlsCPU.Seconds(), side+"_proxy_handshakes/cpu_s")
		}
	}
}
