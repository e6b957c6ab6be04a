package host

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// The callback deadline. Wrapping every callback in context.WithTimeout costs a context
// and a runtime timer per call, more than a small guest's whole callback, and even reading
// the clock twice per callback shows; instead each VM keeps one cancellable context for
// its life, each outermost callback bumps a counter (odd while it runs), and one watchdog
// goroutine per plugin, which looks a few times per deadline, cancels the context of a VM
// it has seen busy in the same callback for longer than the deadline. The guest stops at its next loop header, through the interrupt
// global the host added to the module (see package interrupt), which a context.AfterFunc
// sets when the VM's context ends; modules without it run with wazero's
// close-on-context-done, which has the same effect. The callback fails with FailureTimeout.

// ErrCallbackTimeout is the cause of a callback stopped by the deadline.
var ErrCallbackTimeout = errors.New("wasm host: callback ran past the plugin's deadline")

// vmKey finds the VM of a call from the context host functions receive.
type vmKey struct{}

// watch holds a VM's call context and deadline bookkeeping.
type watch struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	// calls counts outermost callbacks begun and ended: odd while one runs.
	calls atomic.Uint64
	depth int

	// global is the module's interrupt global once the module is instantiated; stopped
	// records that it was set.
	global  atomic.Pointer[api.MutableGlobal]
	stopped atomic.Bool
}

func newWatch(parent context.Context, v *vm) *watch {
	ctx, cancel := context.WithCancelCause(parent)
	w := &watch{ctx: context.WithValue(ctx, vmKey{}, v), cancel: cancel}
	context.AfterFunc(ctx, w.interrupt)
	return w
}

// arm installs the module's interrupt global; if the context has already ended, the guest
// is stopped at once.
func (w *watch) arm(g api.MutableGlobal) {
	w.global.Store(&g)
	if w.ctx.Err() != nil {
		w.interrupt()
	}
}

// interrupt makes the guest trap at its next loop header. It runs on the AfterFunc
// goroutine while the guest may be running: the store is a single aligned word that the
// guest's machine code reloads at every loop header.
func (w *watch) interrupt() {
	if g := w.global.Load(); g != nil {
		w.stopped.Store(true)
		(*g).Set(1)
	}
}

// interrupted reports whether the VM's context has ended; a guest failure after that is
// the interruption (or the refusal to start a call), not the guest's own fault.
func (w *watch) interrupted() bool { return w.stopped.Load() || w.ctx.Err() != nil }

// begin marks a callback as running on the VM; nested callbacks (a host call that calls
// back into the guest, such as proxy_on_memory_allocate) share the outermost one's deadline.
func (w *watch) begin() {
	if w.depth == 0 {
		w.calls.Add(1)
	}
	w.depth++
}

func (w *watch) end() {
	w.depth--
	if w.depth == 0 {
		w.calls.Add(1)
	}
}

// watchdog cancels the VMs of p whose callback has run longer than the deadline, until the
// plugin closes. It checks eight times per deadline and times a callback from the first
// check that sees it, so a runaway guest is stopped within about 1.25 times the deadline.
func (p *Plugin) watchdog() {
	every := min(max(p.timeout/8, time.Millisecond), 250*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	// seen is, per instance, the busy callback last seen and when it was first seen.
	type sighting struct {
		w     *watch
		calls uint64
		since time.Time
	}
	seen := make([]sighting, len(p.instances))
	for {
		var now time.Time
		select {
		case <-p.ctx.Done():
			return
		case now = <-t.C:
		}
		for i, in := range p.instances {
			w := in.watched.Load()
			if w == nil {
				continue
			}
			calls := w.calls.Load()
			s := &seen[i]
			switch {
			case calls%2 == 0: // idle
				*s = sighting{}
			case s.w != w || s.calls != calls: // a callback not seen before
				*s = sighting{w: w, calls: calls, since: now}
			case now.Sub(s.since) > p.timeout:
				// It started before it was first seen (by up to a tick), so it has run
				// past the deadline, by up to two ticks.
				w.cancel(ErrCallbackTimeout)
			}
		}
	}
}
