package healthreport

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// recorder is an ADS server that records what arrives, as discovery sees it.
type recorder struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	mu   sync.Mutex
	reqs []*discoveryv3.DiscoveryRequest
}

func (r *recorder) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, req)
		r.mu.Unlock()
	}
}

// states lists the health states received, "" for healthy.
func (r *recorder) states() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, q := range r.reqs {
		out = append(out, q.GetErrorDetail().GetMessage())
	}
	return out
}

// serve starts a recorder on addr and returns it with its address and server.
func serve(t *testing.T, addr string) (*recorder, string, *grpc.Server) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	rec := &recorder{}
	srv := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, rec)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return rec, l.Addr().String(), srv
}

func TestReportsChangesAndResendsAfterReconnect(t *testing.T) {
	rec, addr, srv := serve(t, "127.0.0.1:0")

	node := &corev3.Node{Id: "sidecar~127.10.0.2~web-1.default~default.svc.cluster.local"}
	r := New(addr, node, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()

	r.Set(errors.New("proxy is INITIALIZING"))
	r.Set(errors.New("proxy is INITIALIZING")) // unchanged: not sent again
	r.Set(nil)
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	defer fcancel()
	require.NoError(t, r.Flush(fctx))
	require.Eventually(t, func() bool { s := rec.states(); return len(s) > 0 && s[len(s)-1] == "" }, 10*time.Second, 10*time.Millisecond)
	for _, s := range rec.states() {
		assert.Contains(t, []string{"", "proxy is INITIALIZING"}, s)
	}
	rec.mu.Lock()
	assert.Equal(t, node.GetId(), rec.reqs[0].GetNode().GetId())
	assert.Equal(t, TypeURL, rec.reqs[0].GetTypeUrl())
	rec.mu.Unlock()

	// Discovery restarts: the reporter reconnects and tells the new one the current state.
	srv.Stop()
	r.Set(errors.New("pod is terminating"))
	rec2, _, _ := serve(t, addr)
	require.Eventually(t, func() bool {
		s := rec2.states()
		return len(s) == 1 && s[0] == "pod is terminating"
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, r.Flush(fctx))

	cancel()
	<-done
}
