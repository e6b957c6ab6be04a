package host

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every kind of guest fault fails only the request it hit, the way the plugin's fail_open
// says, is counted, and the instance is replaced so the next request is served.
func TestFaultsFailOneRequestAndReplaceTheInstance(t *testing.T) {
	faults := []struct {
		op   string
		kind FailureKind
	}{
		{"trap", FailureTrap},
		{"panic", FailureTrap}, // Go aborts with unreachable after printing the panic
		{"loop", FailureTimeout},
		{"oom", FailureMemory},
		{"exit", FailureExit},
	}
	for _, fault := range faults {
		for _, failOpen := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/fail_open=%v", fault.op, failOpen), func(t *testing.T) {
				ctx := context.Background()
				timeout := 10 * time.Second // generous: -race slows the guest's allocation loop down
				if fault.kind == FailureTimeout {
					timeout = 300 * time.Millisecond
				}
				f := newFixture(t, "kitchen", PluginConfig{FailOpen: failOpen, CallbackTimeout: timeout,
					MemoryLimit: 16 << 20}, Environment{})
				s, res, _ := f.headersOnly(t, StreamOptions{}, [2]string{"x-op", fault.op})
				require.NotNil(t, res.Failure)
				assert.Equal(t, fault.kind, res.Failure.Kind, "%v", res.Failure)
				assert.Equal(t, "proxy_on_request_headers", res.Failure.Callback)
				if failOpen {
					assert.Equal(t, Continue, res.Action)
					assert.Nil(t, res.LocalResponse)
				} else {
					assert.Equal(t, Pause, res.Action)
					assert.Equal(t, &LocalResponse{StatusCode: 503, Details: "wasm_fail_stream", GRPCStatus: 14}, res.LocalResponse)
				}
				// The failed stream no longer reaches the guest.
				assert.True(t, s.OnResponseHeaders(ctx, NewHeaders([2]string{":status", "200"}), true).Skipped)
				// It still holds the headers the proxy passed in, for the proxy to send on.
				require.NotNil(t, s.ResponseHeaders())
				assert.Equal(t, "200", hget(s.ResponseHeaders(), ":status"))
				s.Finish(ctx)

				st := f.p.Stats()
				assert.Equal(t, map[FailureKind]int64{fault.kind: 1}, st.Failures)
				assert.Equal(t, int64(1), st.Replacements)
				assert.Equal(t, int64(2), st.VMStarts)
				if failOpen {
					assert.Equal(t, int64(1), st.FailedOpen)
				} else {
					assert.Equal(t, int64(1), st.FailedClosed)
				}

				// The replacement serves the next request.
				res, h := f.op(t, "add-header")
				assert.Nil(t, res.Failure)
				assert.Equal(t, "1", hget(h, "x-added"))
				assert.Equal(t, int64(1), f.p.Stats().Failures[fault.kind])
			})
		}
	}
}

func TestFaultsInOtherCallbacks(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})
	s, _, _ := f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "body-fault"})
	res := s.OnRequestBody(ctx, []byte("x"), true)
	require.NotNil(t, res.Failure)
	assert.Equal(t, "proxy_on_request_body", res.Failure.Callback)
	assert.Equal(t, 503, res.LocalResponse.StatusCode)
	s.Finish(ctx)

	s, _, _ = f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "resp-fault"})
	res = s.OnResponseHeaders(ctx, NewHeaders([2]string{":status", "200"}), true)
	require.NotNil(t, res.Failure)
	assert.Equal(t, "proxy_on_response_headers", res.Failure.Callback)
	s.Finish(ctx)
	assert.Equal(t, int64(2), f.p.Stats().Failures[FailureTrap])

	res, _ = f.op(t, "")
	assert.Nil(t, res.Failure)
}

// Bad pointers are the guest's problem, not the host's: the call returns
// InvalidMemoryAccess and the guest goes on.
func TestBadPointersAndArguments(t *testing.T) {
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})
	res, h := f.op(t, "badptr")
	assert.Nil(t, res.Failure)
	assert.Equal(t, Continue, res.Action)
	// log, get_header_map_value, get_property: InvalidMemoryAccess; unknown map type,
	// unknown buffer type, malformed pairs: BadArgument
	assert.Equal(t, "6:6:6:2:2:2", hget(h, "x-badptr"))
	assert.Empty(t, f.p.Stats().Failures)

	_, h = f.op(t, "grpc")
	assert.Equal(t, "12", hget(h, "x-grpc"))
}

// When an instance fails, the other streams bound to it lose their filter too and are
// told so by a signal.
func TestOtherStreamsOnAFailedInstanceAreAborted(t *testing.T) {
	ctx := context.Background()
	for _, failOpen := range []bool{false, true} {
		f := newFixture(t, "kitchen", PluginConfig{FailOpen: failOpen}, Environment{})
		sigs := &signals{}
		paused, res, _ := f.headersOnly(t, StreamOptions{OnSignal: sigs.add}, [2]string{"x-op", "pause"})
		require.Equal(t, Pause, res.Action)
		_, res, _ = f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "trap"})
		require.NotNil(t, res.Failure)

		got := sigs.list()
		require.Len(t, got, 1)
		assert.Equal(t, SignalFailed, got[0].Kind)
		assert.Same(t, res.Failure, got[0].Failure)
		if failOpen {
			assert.Nil(t, got[0].LocalResponse)
		} else {
			assert.Equal(t, 503, got[0].LocalResponse.StatusCode)
		}
		assert.Same(t, res.Failure, paused.Failed())
		assert.True(t, paused.OnResponseHeaders(ctx, NewHeaders(), true).Skipped)
		paused.Finish(ctx)
		assert.Equal(t, int64(1), f.p.Stats().Aborted)
	}
}

func TestTickFaultReplacesTheInstanceAndTicksGoOn(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	f := newFixture(t, "kitchen", PluginConfig{Configuration: []byte("tick=100\ntick-trap=1")}, Environment{Clock: clock})
	clock.Advance(100 * time.Millisecond)
	assert.Equal(t, int64(1), f.p.Stats().Failures[FailureTrap])
	assert.Equal(t, int64(1), f.p.Stats().Replacements)
	// The replacement was configured again and set its own tick period.
	clock.Advance(100 * time.Millisecond)
	assert.Equal(t, int64(2), f.p.Stats().Failures[FailureTrap])
	assert.Equal(t, int64(2), f.p.Stats().Replacements)
}
