package host

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Requests run concurrently on two instances; each stream stays on its instance, and an
// instance never runs two callbacks at once (run with -race).
func TestConcurrentRequestsOnTwoInstances(t *testing.T) {
	ctx := context.Background()
	clock := NewManualClock(time.Unix(0, 0))
	f := newFixture(t, "kitchen", PluginConfig{Instances: 2, VMID: "conc", Configuration: []byte("tick=10")}, Environment{Clock: clock})
	const workers, perWorker = 8, 8
	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				s, err := f.p.NewHTTPStream(ctx, StreamOptions{})
				if err != nil {
					errs <- err
					return
				}
				worker := s.Worker()
				h := NewHeaders([2]string{":path", fmt.Sprintf("/%d/%d", w, i)}, [2]string{"x-op", "shared,metrics,add-header"})
				if r := s.OnRequestHeaders(ctx, h, false); r.Failure != nil {
					errs <- r.Failure
				}
				if r := s.OnRequestBody(ctx, []byte("body"), true); string(r.Body) != "body" {
					errs <- fmt.Errorf("body %q", r.Body)
				}
				s.OnResponseHeaders(ctx, NewHeaders([2]string{":status", "200"}), true)
				s.Finish(ctx)
				if s.Worker() != worker || hget(h, "x-added") != "1" {
					errs <- fmt.Errorf("stream moved or filter did not run: %v", h.Pairs())
				}
			}
		}(w)
	}
	// Ticks fire on both instances while the requests run.
	for i := 0; i < 20; i++ {
		clock.Advance(10 * time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	m, _ := f.p.Metrics().Get("requests_total", MetricCounter)
	assert.Equal(t, int64(workers*perWorker), m.Value)
	// Ticks that fall due while an instance is busy are coalesced, never run concurrently.
	ticks, _ := f.p.Metrics().Get("ticks_total", MetricCounter)
	assert.Greater(t, ticks.Value, int64(0))
	assert.LessOrEqual(t, ticks.Value, int64(40))
	st := f.p.Stats()
	assert.Empty(t, st.Failures)
	assert.Equal(t, int64(0), st.ActiveStreams)
	// Each instance's linear memory: whole wasm pages, at least the one the guest has.
	mem := f.p.MemoryBytes()
	require.Len(t, mem, 2)
	for _, b := range mem {
		assert.Positive(t, b)
		assert.Zero(t, b%(64<<10), b)
	}
}

func TestModuleCompiledOnceForManyPluginsAndInstances(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	wasm := guestWasm(t, "kitchen")
	var vms int64
	for i := 0; i < 3; i++ {
		mod, err := rt.Compile(ctx, wasm)
		require.NoError(t, err)
		p, err := rt.NewPlugin(ctx, mod, PluginConfig{Name: fmt.Sprint("p", i), Instances: 2}, Environment{})
		require.NoError(t, err)
		vms += p.Stats().VMStarts
		require.NoError(t, p.Close(ctx))
	}
	assert.Equal(t, int64(1), rt.Compilations())
	assert.Equal(t, int64(6), vms)

	// Concurrent first loads of the same bytes compile once too.
	rt = newRuntime(t)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := rt.Compile(ctx, wasm)
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(1), rt.Compilations())
	_, err := rt.Compile(ctx, guestWasm(t, "hello"))
	require.NoError(t, err)
	assert.Equal(t, int64(2), rt.Compilations())
}
