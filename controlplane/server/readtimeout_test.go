//go:build linux

package server

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// recordingListener keeps the connections it accepts.
type recordingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*net.TCPConn
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		l.mu.Lock()
		l.conns = append(l.conns, tc)
		l.mu.Unlock()
	}
	return c, err
}

// A connection served by Serve keeps ProxyReadTimeout as its TCP_USER_TIMEOUT once gRPC has
// set it up with the keepalives (which would make it the keepalive timeout, 10 s): a proxy
// that reads slowly is not cut by the kernel for it.
func TestServeGivesProxiesTheReadTimeout(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lis := &recordingListener{Listener: inner}
	g := grpc.NewServer(GRPCOptions()...)
	healthpb.RegisterHealthServer(g, health.NewServer())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, g, lis, time.Second) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	cc, err := grpc.NewClient(inner.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	// An answered call: the server's transport (and its socket options) is set up.
	_, err = healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)

	lis.mu.Lock()
	defer lis.mu.Unlock()
	require.Len(t, lis.conns, 1)
	raw, err := lis.conns[0].SyscallConn()
	require.NoError(t, err)
	var ms int
	var gerr error
	require.NoError(t, raw.Control(func(fd uintptr) {
		ms, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	}))
	require.NoError(t, gerr)
	assert.Equal(t, int(ProxyReadTimeout.Milliseconds()), ms, "TCP_USER_TIMEOUT in milliseconds")
}
