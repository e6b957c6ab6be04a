package xdsproxy

import (
	"strconv"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/wasmesh/wasmesh/agent/internal/testca"
)

// BenchmarkPush measures a push's latency, from discovery's new snapshot to the proxy
// having it, through the XDS proxy (Unix socket, then TLS) and directly over TLS, the two
// alternating in the same run: one op is one push on each path.
func BenchmarkPush(b *testing.B) {
	ca := testca.Start(b, time.Hour)
	w := newWorkload(b, ca)
	d := startDiscovery(b, ca, w.token)
	_, sock := startProxy(b, w, d.addr)

	conn, err := grpc.NewClient(d.addr, w.dialConfig(d.addr).DialOptions()...)
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close() })
	direct := openSotW(b, discoveryv3.NewAggregatedDiscoveryServiceClient(conn))
	proxied := openSotW(b, dialSocket(b, sock))
	// Two nodes, one per path, so each push reaches exactly one of them.
	directNode, proxiedNode := node(), node()
	directNode.Id += "-direct"
	d.setConfigFor(directNode.Id, 1)
	for _, c := range []struct {
		s sotw
		n string
	}{{direct, directNode.Id}, {proxied, proxiedNode.Id}} {
		n := node()
		n.Id = c.n
		c.s.send(&discoveryv3.DiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType})
		_, ver, _ := c.s.recv()
		require.Equal(b, "1", ver)
	}

	var viaProxy, viaTLS time.Duration
	push := func(s sotw, id string, v int) time.Duration {
		start := time.Now()
		d.setConfigFor(id, v)
		_, ver, _ := s.recv()
		took := time.Since(start)
		if ver != strconv.Itoa(v) {
			b.Fatalf("pushed version %d, got %s", v, ver)
		}
		return took
	}
	b.ResetTimer()
	for i := range b.N {
		v := i + 2
		viaTLS += push(direct, directNode.Id, v)
		viaProxy += push(proxied, proxiedNode.Id, v)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(viaTLS.Microseconds())/n, "direct-µs/push")
	b.ReportMetric(float64(viaProxy.Microseconds())/n, "proxied-µs/push")
	b.ReportMetric(float64((viaProxy-viaTLS).Microseconds())/n, "added-µs/push")
}
