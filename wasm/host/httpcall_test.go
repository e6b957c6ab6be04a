package host

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeUpstream is an HTTPCallDispatcher whose answers the test controls.
type fakeUpstream struct {
	mu      sync.Mutex
	reqs    []*HTTPCallRequest
	ctxs    []context.Context // each call's, which the host cancels when the call ends
	pending []func(*HTTPCallResponse, error)
	answer  *HTTPCallResponse // answer at once when set
	unknown bool
}

func (u *fakeUpstream) DispatchHTTPCall(ctx context.Context, req *HTTPCallRequest, done func(*HTTPCallResponse, error)) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.unknown {
		return ErrUnknownCluster
	}
	u.reqs = append(u.reqs, req)
	u.ctxs = append(u.ctxs, ctx)
	if u.answer != nil {
		done(u.answer, nil)
		return nil
	}
	u.pending = append(u.pending, done)
	return nil
}

func TestHTTPCallAnsweredAfterTheCallback(t *testing.T) {
	up := &fakeUpstream{answer: &HTTPCallResponse{
		Headers:  [][2]string{{":status", "200"}, {"x-a", "b"}},
		Body:     []byte("allowed"),
		Trailers: [][2]string{{"t1", "1"}, {"t2", "2"}},
	}}
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{HTTPCalls: up})
	sigs := &signals{}
	s, res, h := f.headersOnly(t, StreamOptions{OnSignal: sigs.add}, [2]string{"x-op", "httpcall"})
	defer s.Finish(context.Background())

	assert.Equal(t, Pause, res.Action)
	assert.Equal(t, "0", hget(h, "x-call"))
	require.Len(t, up.reqs, 1)
	req := up.reqs[0]
	assert.Equal(t, "auth", req.Cluster)
	assert.Equal(t, [][2]string{{":method", "POST"}, {":path", "/check"}, {":authority", "auth.local"}, {"x-from", "kitchen"}}, req.Headers)
	assert.Equal(t, "payload", string(req.Body))
	assert.Equal(t, [][2]string{{"x-trailer", "t"}}, req.Trailers)
	assert.Equal(t, 5*time.Second, req.Timeout)
	// The response was delivered to the root context after the stream's callback, through
	// the call-response maps and buffer; the guest switched to the stream with
	// proxy_set_effective_context (an unknown id is BadArgument; the root context itself may
	// be made effective) and resumed it.
	assert.Equal(t, "200:allowed:2:2:200", hget(h, "x-auth"))
	assert.Equal(t, "0:2:0", hget(h, "x-effective"))
	assert.Equal(t, []Signal{{Kind: SignalContinue, Stream: StreamRequest}}, sigs.list())
}

// A call without a timeout (0) is answered like any other: no timer to stop.
func TestHTTPCallWithoutATimeout(t *testing.T) {
	up := &fakeUpstream{answer: &HTTPCallResponse{Headers: [][2]string{{":status", "200"}}, Body: []byte("ok")}}
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{HTTPCalls: up})
	s, _, h := f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "httpcall"}, [2]string{"x-call-timeout", "0"})
	defer s.Finish(context.Background())
	require.Len(t, up.reqs, 1)
	assert.Zero(t, up.reqs[0].Timeout)
	assert.Equal(t, "200:ok:0:1:200", hget(h, "x-auth"))
}

func TestHTTPCallTimeoutDeliversAFailure(t *testing.T) {
	clock := NewManualClock(time.Unix(1000, 0))
	up := &fakeUpstream{} // never answers
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{HTTPCalls: up, Clock: clock})
	sigs := &signals{}
	s, res, h := f.headersOnly(t, StreamOptions{OnSignal: sigs.add},
		[2]string{"x-op", "httpcall"}, [2]string{"x-call-timeout", "250"})
	defer s.Finish(context.Background())
	assert.Equal(t, Pause, res.Action)
	clock.Advance(249 * time.Millisecond)
	assert.Empty(t, sigs.list())
	clock.Advance(time.Millisecond)
	// A timeout is a failed call: no headers, status BrokenConnection, message "timeout".
	assert.Equal(t, "failed:11:timeout", hget(h, "x-auth"))
	assert.Equal(t, []Signal{{Kind: SignalContinue, Stream: StreamRequest}}, sigs.list())
	// The upstream's context ends with the timeout as its cause.
	up.mu.Lock()
	done, callCtx := up.pending[0], up.ctxs[0]
	up.mu.Unlock()
	assert.ErrorIs(t, context.Cause(callCtx), ErrHTTPCallTimeout)
	// A late answer is dropped.
	done(&HTTPCallResponse{Headers: [][2]string{{":status", "200"}}}, nil)
	assert.Len(t, sigs.list(), 1)
}

func TestHTTPCallErrors(t *testing.T) {
	// No dispatcher: the embedder does not support HTTP calls.
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})
	res, h := f.op(t, "httpcall")
	assert.Equal(t, Continue, res.Action)
	assert.Equal(t, "12", hget(h, "x-call"))

	up := &fakeUpstream{unknown: true}
	f = newFixture(t, "kitchen", PluginConfig{}, Environment{HTTPCalls: up})
	_, h = f.op(t, "httpcall")
	assert.Equal(t, "2", hget(h, "x-call")) // unknown cluster
	up.unknown = false
	_, h = f.op(t, "httpcall-bad")
	assert.Equal(t, "2", hget(h, "x-call-bad")) // no :path / :authority
}

func TestHTTPCallResponseCanAnswerTheStream(t *testing.T) {
	up := &fakeUpstream{}
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{HTTPCalls: up})
	sigs := &signals{}
	s, res, _ := f.headersOnly(t, StreamOptions{OnSignal: sigs.add}, [2]string{"x-op", "deny-on-call"})
	defer s.Finish(context.Background())
	assert.Equal(t, Pause, res.Action)
	up.mu.Lock()
	done := up.pending[0]
	up.mu.Unlock()
	// Answered from another goroutine, as a real dispatcher would.
	go done(&HTTPCallResponse{Headers: [][2]string{{":status", "403"}}}, nil)
	eventually(t, &sigs.notify, func() bool { return len(sigs.list()) == 1 }, "local response signal")
	sig := sigs.list()[0]
	assert.Equal(t, SignalLocalResponse, sig.Kind)
	assert.Equal(t, &LocalResponse{StatusCode: 401, Details: "denied after call", Body: []byte("call said no"), GRPCStatus: 16}, sig.LocalResponse)
}

// Two HTTP calls of a VM get distinct tokens, and each response reaches its own stream,
// wherever the VM's token counter stands: after one call, and across the wrap from 2^32-1
// to 1 (0 is no token). The test sets the counter as that many calls would have left it.
func TestHTTPCallTokensStayDistinct(t *testing.T) {
	for _, counter := range []uint32{1, math.MaxUint32 - 1} {
		t.Run(strconv.FormatUint(uint64(counter), 10), func(t *testing.T) {
			up := &fakeUpstream{}
			f := newFixture(t, "kitchen", PluginConfig{}, Environment{HTTPCalls: up})
			in := f.p.instances[0]
			in.enter()
			in.vm.nextToken = counter
			in.leave()
			twoCallsEachAnswered(t, f, up)
		})
	}
}

// twoCallsEachAnswered starts two streams that each make an HTTP call, answers the calls
// one after the other and checks that each answer resumed its own stream.
func twoCallsEachAnswered(t *testing.T, f *fixture, up *fakeUpstream) {
	type call struct {
		h    *Headers
		sigs *signals
	}
	var calls []call
	for range 2 {
		sigs := &signals{}
		s, res, h := f.headersOnly(t, StreamOptions{OnSignal: sigs.add}, [2]string{"x-op", "httpcall"})
		t.Cleanup(func() { s.Finish(context.Background()) })
		require.Equal(t, Pause, res.Action)
		calls = append(calls, call{h, sigs})
	}
	up.mu.Lock()
	pending := up.pending
	up.mu.Unlock()
	require.Len(t, pending, 2)
	for i, c := range calls {
		// Answered from another goroutine, as a real dispatcher would.
		go pending[i](&HTTPCallResponse{Headers: [][2]string{{":status", strconv.Itoa(201 + i)}}}, nil)
		eventually(t, &c.sigs.notify, func() bool { return len(c.sigs.list()) == 1 }, "the stream resumed")
		assert.Equal(t, []Signal{{Kind: SignalContinue, Stream: StreamRequest}}, c.sigs.list())
		assert.True(t, strings.HasPrefix(hget(c.h, "x-auth"), strconv.Itoa(201+i)+":"), hget(c.h, "x-auth"))
	}
	for _, msg := range f.logs.messages() {
		assert.NotContains(t, msg, "unknown token")
	}
}
