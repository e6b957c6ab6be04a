package service

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmesh/wasmesh/controlplane/ratelimit/redisstore"
	"github.com/wasmesh/wasmesh/controlplane/ratelimit/redistest"
)

// rig is a Service on a real gRPC server on loopback, counting in a real redis-server.
type rig struct {
	t       testing.TB
	redis   *redistest.Server
	store   *redisstore.Store
	svc     *Service
	metrics *Metrics
	dir     string
	addr    string
}

// testNow is the fixed clock of the tests: 30 s into a minute, so a minute's window has 30 s
// left and no test straddles two windows.
var testNow = time.Unix(1_800_000_030, 0)

func newRig(t testing.TB, files map[string]string, o Options) *rig {
	t.Helper()
	r := &rig{t: t, redis: redistest.Start(t), dir: t.TempDir()}
	for name, body := range files {
		r.write(name, body)
	}
	var err error
	r.store, err = redisstore.New(redisstore.Options{Addrs: r.redis.Addr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.store.Close() })
	if o.Now == nil {
		o.Now = func() time.Time { return testNow }
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	r.metrics = NewMetrics(prometheus.NewRegistry())
	r.svc = New(r.store, r.metrics, o)
	if err := r.svc.Reload(r.dir); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlv3.RegisterRateLimitServiceServer(gs, r.svc)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	r.addr = lis.Addr().String()
	return r
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func (r *rig) write(name, body string) {
	r.t.Helper()
	// Written aside and renamed in, as a ConfigMap update: the watcher never reads half a file.
	tmp := filepath.Join(r.dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		r.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(r.dir, name)); err != nil {
		r.t.Fatal(err)
	}
}

// client dials its own gRPC connection (a proxy of its own).
func (r *rig) client() rlv3.RateLimitServiceClient {
	r.t.Helper()
	cc, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { cc.Close() })
	return rlv3.NewRateLimitServiceClient(cc)
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func ask(t testing.TB, c rlv3.RateLimitServiceClient, domain string, hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

func wantCount(t testing.TB, c *prometheus.CounterVec, name, key string, want int) {
	t.Helper()
	if got := int(testutil.ToFloat64(c.WithLabelValues(key))); got != want {
		t.Errorf("%s{key=%q} = %d, want %d", name, key, got, want)
	}
}

func testFloat(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }
