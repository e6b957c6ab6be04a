package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

const (
	cdsType = resourcev3.ClusterType
	edsType = resourcev3.EndpointType
	ldsType = resourcev3.ListenerType
	rdsType = resourcev3.RouteType
)

// waitFor bounds every wait for a response: a deadline, not a pause.
const waitFor = 10 * time.Second

// proxyID is the node id of the n-th test proxy (127.10.1.n); it is not a workload of the
// mesh, so connecting it changes no endpoints.
func proxyID(n int) string {
	return fmt.Sprintf("sidecar~127.10.1.%d~client-%d.demo~demo.svc.cluster.local", n, n)
}

// node is the n-th test proxy as Envoy identifies itself: outbound listeners on its own
// loopback address (INTERCEPTION_MODE NONE) so their names say whose they are.
func node(t testing.TB, n int) *core.Node {
	md, err := structpb.NewStruct(map[string]any{
		"NAMESPACE": "demo", "INTERCEPTION_MODE": "NONE", "WASMESH_LOCALHOST": fmt.Sprintf("127.20.1.%d", n),
	})
	require.NoError(t, err)
	return &core.Node{Id: proxyID(n), Metadata: md}
}

// listenerName is proxy n's outbound listener of port.
func listenerName(n, port int) string { return fmt.Sprintf("127.20.1.%d_%d", n, port) }

// stream is one raw ADS stream (SotW or Delta) whose responses are read into a channel, so
// a test can wait for the next one with a deadline.
type stream[Req, Resp any] struct {
	t     testing.TB
	send  func(Req) error
	resps chan Resp
	ended chan struct{}
	err   error // why the stream ended, once ended is closed
}

// newStream reads the responses of a stream opened with ctx until it ends.
func newStream[Req, Resp any](ctx context.Context, t testing.TB, send func(Req) error, recv func() (Resp, error)) *stream[Req, Resp] {
	s := &stream[Req, Resp]{t: t, send: send, resps: make(chan Resp, 64), ended: make(chan struct{})}
	go func() {
		defer close(s.ended)
		for {
			r, err := recv()
			if err != nil {
				s.err = err
				return
			}
			select {
			case s.resps <- r:
			case <-ctx.Done():
				s.err = ctx.Err()
				return
			}
		}
	}()
	return s
}

func (s *stream[Req, Resp]) request(r Req) {
	s.t.Helper()
	require.NoError(s.t, s.send(r))
}

// next returns the next response; the test fails if none comes in time or the stream ends.
func (s *stream[Req, Resp]) next() Resp {
	s.t.Helper()
	select {
	case r := <-s.resps:
		return r
	case <-s.ended:
		// A response read just before the end is still delivered.
		select {
		case r := <-s.resps:
			return r
		default:
		}
		s.t.Fatalf("stream ended while waiting for a response: %v", s.err)
	case <-time.After(waitFor):
		s.t.Fatalf("no response within %s", waitFor)
	}
	var zero Resp
	return zero
}

// end waits for the stream to end and returns its error.
func (s *stream[Req, Resp]) end() error {
	s.t.Helper()
	select {
	case <-s.ended:
		return s.err
	case <-time.After(waitFor):
		s.t.Fatalf("stream still open after %s", waitFor)
		return nil
	}
}

// nack is an error_detail as Envoy sends it with a rejected response's nonce.
func nack(msg string) *statuspb.Status { return &statuspb.Status{Code: 3, Message: msg} }

// validated decodes one resource as its type URL says and checks it with ValidateAll; it
// returns the resource's name and the resource.
func validated(t testing.TB, typ string, a *anypb.Any) (string, proto.Message) {
	t.Helper()
	require.Equal(t, typ, a.GetTypeUrl(), "resource type in a %s response", typ)
	msg, err := a.UnmarshalNew()
	require.NoError(t, err)
	v, ok := msg.(interface{ ValidateAll() error })
	require.True(t, ok, "%T has no ValidateAll", msg)
	assert.NoError(t, v.ValidateAll(), "%T", msg)
	return cachev3.GetResourceName(msg), msg
}
