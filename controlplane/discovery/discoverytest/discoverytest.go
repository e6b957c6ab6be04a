// Package discoverytest runs a discovery server inside a test, as the tests of discovery
// and of its clients do: built from Options, run until the test ends, ready before it is
// handed back, and its log discarded unless WASMESH_TEST_LOG asks for it.
package discoverytest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/push"
)

// Debounce is the tests' debounce: pushes 10 ms after a change (a second at most), with
// incremental EDS.
var Debounce = push.DebounceOptions{After: 10 * time.Millisecond, Max: time.Second, EnableEDS: true}

// Log is a server's log in a test: discarded, or on stderr at debug level when
// WASMESH_TEST_LOG is set, to debug a test with the server's own account.
func Log() *slog.Logger {
	var out io.Writer = io.Discard
	if os.Getenv("WASMESH_TEST_LOG") != "" {
		out = os.Stderr
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Server is a discovery server running for a test.
type Server struct {
	*discovery.Discovery
	tb      testing.TB
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// Run builds discovery with opts and log and runs it until Stop or the end of the test;
// it returns once the server is ready. The test fails if the server does not start or
// if Run ends with an error.
func Run(tb testing.TB, opts discovery.Options, log *slog.Logger) *Server {
	tb.Helper()
	d, err := discovery.New(opts, log)
	require.NoError(tb, err)
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Discovery: d, tb: tb, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- d.Run(ctx) }()
	tb.Cleanup(s.Stop)
	require.Eventually(tb, d.Server.Ready, 10*time.Second, time.Millisecond, "discovery ready")
	return s
}

// Stop stops the server and waits for Run to return (once; later calls do nothing).
func (s *Server) Stop() {
	if s.stopped {
		return
	}
	s.stopped = true
	s.cancel()
	require.NoError(s.tb, <-s.done)
}

// Dial connects a plaintext gRPC client to the server's xDS port, closed at the end of the
// test (before the server stops).
func (s *Server) Dial() *grpc.ClientConn {
	s.tb.Helper()
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(s.tb, err)
	s.tb.Cleanup(func() { cc.Close() })
	return cc
}
