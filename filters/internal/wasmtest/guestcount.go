//go:build !wasip1

package wasmtest

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/wasmesh/wasmesh/wasm/host"
)

// GuestCounts is what a guest did per request: calls into its own functions, calls to the
// host's imports, and heap allocations (calls to the Go runtime's allocator,
// runtime.mallocgc; always 0 for a guest not written in Go). Unlike time, these do not
// change with the machine's load, so a change to a filter shows in them exactly.
type GuestCounts struct {
	Calls, HostCalls, Allocs float64
}

// goAllocator is the function every heap allocation of a Go guest goes through.
const goAllocator = "runtime.mallocgc"

// Counter runs exchanges through an instance of a filter compiled with a wazero function
// listener that counts every call the guest makes.
type Counter struct {
	tb testing.TB
	c  *callCounter
	w  *Bench
}

// NewCounter loads the filter in dir, counting, into a fresh runtime with one instance;
// both are closed when tb ends.
func NewCounter(tb testing.TB, dir string, cfg host.PluginConfig, props map[string]any) *Counter {
	tb.Helper()
	c := &callCounter{}
	ctx := experimental.WithFunctionListenerFactory(context.Background(), c)
	return &Counter{tb: tb, c: c, w: newBench(ctx, tb, dir, cfg, props, Exchange{})}
}

// Count sends warmUp exchanges x, not counted, then requests more and returns the counts
// per request.
func (k *Counter) Count(x Exchange, warmUp, requests int) GuestCounts {
	k.tb.Helper()
	k.w.x = x
	for range warmUp {
		k.w.Do()
	}
	k.c.reset()
	for range requests {
		k.w.Do()
	}
	require.Empty(k.tb, k.w.Plugin.Stats().Failures, "guest failures while counting")
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	n := float64(requests)
	return GuestCounts{Calls: float64(k.c.calls) / n, HostCalls: float64(k.c.hostCalls) / n, Allocs: float64(k.c.allocs) / n}
}

// callCounter counts the calls a guest makes. The bench runs one callback at a time, but
// the listener API gives no such promise, hence the lock.
type callCounter struct {
	mu                       sync.Mutex
	calls, hostCalls, allocs int64
}

func (c *callCounter) reset() {
	c.mu.Lock()
	c.calls, c.hostCalls, c.allocs = 0, 0, 0
	c.mu.Unlock()
}

func (c *callCounter) NewFunctionListener(def api.FunctionDefinition) experimental.FunctionListener {
	// The guest's imports come as the host module's functions, implemented in Go.
	hostFn := def.GoFunction() != nil
	return &callListener{c: c, host: hostFn, alloc: !hostFn && def.Name() == goAllocator}
}

// callListener counts the calls to one function.
type callListener struct {
	c           *callCounter
	host, alloc bool
}

func (l *callListener) Before(context.Context, api.Module, api.FunctionDefinition, []uint64, experimental.StackIterator) {
	c := l.c
	c.mu.Lock()
	switch {
	case l.host:
		c.hostCalls++
	case l.alloc:
		c.allocs++
		c.calls++
	default:
		c.calls++
	}
	c.mu.Unlock()
}

func (*callListener) After(context.Context, api.Module, api.FunctionDefinition, []uint64) {}

func (*callListener) Abort(context.Context, api.Module, api.FunctionDefinition, error) {}

// discard is a logger that drops everything.
func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
