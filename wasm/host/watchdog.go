package host

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// The callback deadline. Wrapping every callback in context.WithTimeout costs a context
// and a runtime timer per call, more than a small guest's whole callback; instead each VM
// keeps one cancellable context for its life, each outermost callback records when it
// started, and one watchdog goroutine per plugin cancels the context of a VM whose callback
// has run past the deadline. wazero (with close-on-context-done) then stops the guest at its
// next loop header or call, and the callback fails with FailureTimeout.

// ErrCallbackTimeout is the cause of a callback stopped by the deadline.
var ErrCallbackTimeout = errors.New("wasm host: callback ran past the plugin's deadline")

// vmKey finds the VM of a call from the context host functions receive.
type vmKey struct{}

// epoch is the origin of the monotonic timestamps in vm.busySince.
var epoch = time.Now()

func monotonic() int64 { return int64(time.Since(epoch)) + 1 }

// watch holds a VM's call context and deadline bookkeeping.
type watch struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	// busySince is when the outermost running callback started (monotonic ns), 0 when the
	// VM is idle.
	busySince atomic.Int64
	depth     int
}

func newWatch(parent context.Context, v *vm) *watch {
	ctx, cancel := context.WithCancelCause(parent)
	return &watch{ctx: context.WithValue(ctx, vmKey{}, v), cancel: cancel}
}

// begin marks a callback as running on the VM; nested callbacks (a host call that calls
// back into the guest, such as proxy_on_memory_allocate) share the outermost one's deadline.
func (w *watch) begin() {
	if w.depth == 0 {
		w.busySince.Store(monotonic())
	}
	w.depth++
}

func (w *watch) end() {
	w.depth--
	if w.depth == 0 {
		w.busySince.Store(0)
	}
}

// watchdog cancels the VMs of p whose callback has run longer than the deadline, until the
// plugin closes. It checks a few times per deadline, so a runaway guest is stopped within
// about 1.25 times the deadline.
func (p *Plugin) watchdog() {
	every := min(max(p.timeout/8, time.Millisecond), 250*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
		now := monotonic()
		for _, in := range p.instances {
			w := in.watched.Load()
			if w == nil {
				continue
			}
			if since := w.busySince.Load(); since > 0 && time.Duration(now-since) > p.timeout {
				w.cancel(ErrCallbackTimeout)
			}
		}
	}
}
