package host

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for PluginConfig fields left zero.
const (
	DefaultCallbackTimeout = 5 * time.Second
	DefaultMemoryLimit     = 256 << 20
	wasmPage               = 64 << 10
)

// PluginConfig is one configured use of a module, Envoy's PluginConfig plus the host's
// resource limits.
type PluginConfig struct {
	// Name is the plugin name (plugin_name property, log scope).
	Name string
	// RootID selects the root context inside the module (plugin_root_id).
	RootID string
	// VMID groups plugins that share shared data and queues (plugin_vm_id).
	VMID string
	// VMConfig is read by the guest in proxy_on_vm_start.
	VMConfig []byte
	// Configuration is read by the guest in proxy_on_configure.
	Configuration []byte
	// FailOpen lets a stream continue as if the filter were absent when the guest fails;
	// otherwise the stream gets Envoy's 503 local reply ("wasm_fail_stream").
	FailOpen bool
	// Instances is the number of VM instances (workers); 0 means 1. A stream is bound to one
	// instance for its whole life and an instance runs one callback at a time.
	Instances int
	// CallbackTimeout bounds every guest callback; 0 means DefaultCallbackTimeout and a
	// negative value disables the deadline.
	CallbackTimeout time.Duration
	// MemoryLimit bounds each instance's linear memory in bytes (rounded down to 64 KiB
	// pages); 0 means DefaultMemoryLimit.
	MemoryLimit uint64
	// Metrics is where the guest's metrics go; nil gives the plugin its own store.
	Metrics *Metrics
	// AllowOnHeadersStopIteration lets a header callback's StopIteration (the SDKs' Pause)
	// stop the headers alone, the body still reaching the filter, as Envoy's
	// allow_on_headers_stop_iteration does; by default it stops everything that follows too
	// (StopAllIterationAndWatermark), as Envoy has since proxy-wasm-cpp-host#95.
	AllowOnHeadersStopIteration bool
}

// Environment is what the embedding proxy provides to its plugins. Every field is optional.
type Environment struct {
	// Clock drives time, ticks and HTTP and gRPC call timeouts; nil means SystemClock.
	Clock Clock
	// Logger receives guest logs (proxy_log, stdout/stderr) and host events; nil means the
	// Runtime's logger. proxy_get_log_level reports the lowest level it has enabled.
	Logger *slog.Logger
	// HTTPCalls carries proxy_http_call; nil makes the call return Unimplemented.
	HTTPCalls HTTPCallDispatcher
	// GRPCCalls carries proxy_grpc_call; nil makes the call return Unimplemented.
	GRPCCalls GRPCCallDispatcher
	// Properties are process-level attributes: "node" (see Node), "xds", "listener_direction"
	// and anything else a guest may ask for by its first path segment.
	Properties map[string]any
	// ForeignFunctions are callable through proxy_call_foreign_function; with none
	// registered the call returns Unimplemented, an unknown name returns NotFound.
	ForeignFunctions map[string]ForeignFunction
	// Rand feeds WASI random_get; nil means crypto/rand.
	Rand io.Reader
}

// ForeignFunction implements a host function a guest calls by name.
type ForeignFunction func(ctx context.Context, args []byte) ([]byte, Status)

// HTTPCallRequest is what a guest asked for through proxy_http_call.
type HTTPCallRequest struct {
	// Cluster is the upstream name the guest passed.
	Cluster string
	// Headers include the pseudo headers :method, :path and :authority (always present;
	// the host rejects calls without them, as Envoy does).
	Headers  [][2]string
	Body     []byte
	Trailers [][2]string
	// Timeout is the guest's timeout; the host enforces it (0 means none).
	Timeout time.Duration
	// Plugin is the calling plugin's name.
	Plugin string
}

// HTTPCallResponse is the answer to an HTTP call. Headers include ":status".
type HTTPCallResponse struct {
	Headers  [][2]string
	Body     []byte
	Trailers [][2]string
}

// HTTPCallDispatcher sends HTTP calls for guests.
type HTTPCallDispatcher interface {
	// DispatchHTTPCall starts req and returns at once. It must call done exactly once,
	// from any goroutine and at any time, even before it returns; done with a non-nil error
	// delivers a failed call (no headers) to the guest. ctx is cancelled once the call has
	// ended; its cause is ErrHTTPCallTimeout when the host timed it out and ErrClosed when
	// the plugin closed or the VM went away first. Returning ErrUnknownCluster makes the guest's call
	// fail with BadArgument, any other error with InternalFailure; done is then not called.
	DispatchHTTPCall(ctx context.Context, req *HTTPCallRequest, done func(*HTTPCallResponse, error)) error
}

// HTTPCallDispatcherFunc adapts a function to HTTPCallDispatcher.
type HTTPCallDispatcherFunc func(ctx context.Context, req *HTTPCallRequest, done func(*HTTPCallResponse, error)) error

// DispatchHTTPCall calls f.
func (f HTTPCallDispatcherFunc) DispatchHTTPCall(ctx context.Context, req *HTTPCallRequest, done func(*HTTPCallResponse, error)) error {
	return f(ctx, req, done)
}

// PluginStats counts what happened to a plugin's instances and streams.
type PluginStats struct {
	// VMStarts counts VM instances started, including replacements.
	VMStarts int64
	// Replacements counts instances replaced after a failure.
	Replacements int64
	// RestartFailures counts replacements that failed to start.
	RestartFailures int64
	// Failures counts guest failures by kind (one per failure event).
	Failures map[FailureKind]int64
	// FailedOpen and FailedClosed count streams that took the fail-open or fail-closed
	// path; Aborted counts streams that lost their instance to another stream's failure.
	FailedOpen, FailedClosed, Aborted int64
	// ActiveStreams is the number of streams not yet finished.
	ActiveStreams int64
	// Callbacks counts the host's calls into the guest's callbacks (proxy_on_*), and
	// CallbackTime is the wall time they took, the host calls they made included: what
	// the guest costs the proxy.
	Callbacks    int64
	CallbackTime time.Duration
}

// Plugin is a configured module running in Instances VM instances.
type Plugin struct {
	rt      *Runtime
	mod     *Module
	cfg     PluginConfig
	env     Environment
	log     *slog.Logger
	metrics *Metrics
	timeout time.Duration
	limit   uint64

	// ctx lives as long as the plugin and parents HTTP call dispatches.
	ctx    context.Context
	cancel context.CancelFunc
	closed atomic.Bool

	instances []*instance
	rr        atomic.Uint64

	statsMu sync.Mutex
	stats   PluginStats
	// callbacks and callbackTime (ns) are PluginStats' fields of the same names, counted
	// without the lock: every callback adds to them.
	callbacks, callbackTime atomic.Int64
}

// NewPlugin starts cfg.Instances VM instances of mod: each is instantiated, initialised
// (_initialize, or _start for command-style modules), given its root context and started
// with proxy_on_vm_start and proxy_on_configure. A false return or a trap is an error that
// names the plugin and the phase.
func (r *Runtime) NewPlugin(ctx context.Context, mod *Module, cfg PluginConfig, env Environment) (*Plugin, error) {
	if r.closed.Load() {
		return nil, ErrClosed
	}
	if mod == nil {
		return nil, fmt.Errorf("plugin %q: nil module", cfg.Name)
	}
	if cfg.Instances <= 0 {
		cfg.Instances = 1
	}
	if env.Clock == nil {
		env.Clock = SystemClock{}
	}
	if env.Rand == nil {
		env.Rand = rand.Reader
	}
	log := env.Logger
	if log == nil {
		log = r.log
	}
	p := &Plugin{
		rt: r, mod: mod, cfg: cfg, env: env,
		log:     log.With("plugin", cfg.Name, "root_id", cfg.RootID),
		metrics: cfg.Metrics,
		timeout: cfg.CallbackTimeout,
		limit:   cfg.MemoryLimit,
		stats:   PluginStats{Failures: map[FailureKind]int64{}},
	}
	if p.metrics == nil {
		p.metrics = NewMetrics()
	}
	if p.timeout == 0 {
		p.timeout = DefaultCallbackTimeout
	}
	if p.limit == 0 {
		p.limit = DefaultMemoryLimit
	}
	p.limit -= p.limit % wasmPage
	if min := uint64(mod.minPages) * wasmPage; p.limit < min {
		return nil, fmt.Errorf("plugin %q: memory limit %d bytes is below the module's initial memory of %d bytes", cfg.Name, p.limit, min)
	}
	p.ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	p.instances = make([]*instance, cfg.Instances)
	for i := range p.instances {
		p.instances[i] = &instance{p: p, idx: i}
	}
	if p.timeout > 0 {
		go p.watchdog()
	}
	for _, in := range p.instances {
		in.enter()
		v, err := in.startVM()
		if err == nil {
			in.vm = v
		}
		in.leave()
		if err != nil {
			_ = p.Close(ctx)
			return nil, err
		}
	}
	return p, nil
}

// Name is the plugin name.
func (p *Plugin) Name() string { return p.cfg.Name }

// Config returns the plugin's configuration.
func (p *Plugin) Config() PluginConfig { return p.cfg }

// Module returns the module the plugin runs.
func (p *Plugin) Module() *Module { return p.mod }

// Instances is the number of VM instances (workers).
func (p *Plugin) Instances() int { return len(p.instances) }

// Metrics is the plugin's metric store.
func (p *Plugin) Metrics() *Metrics { return p.metrics }

// SharedData is the shared data of the plugin's vm_id.
func (p *Plugin) SharedData() map[string]SharedValue { return p.rt.data.snapshot(p.cfg.VMID) }

// Stats returns a copy of the plugin's counters.
func (p *Plugin) Stats() PluginStats {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	s := p.stats
	s.Failures = make(map[FailureKind]int64, len(p.stats.Failures))
	for k, v := range p.stats.Failures {
		s.Failures[k] = v
	}
	s.Callbacks, s.CallbackTime = p.callbacks.Load(), time.Duration(p.callbackTime.Load())
	return s
}

func (p *Plugin) count(f func(s *PluginStats)) {
	p.statsMu.Lock()
	f(&p.stats)
	p.statsMu.Unlock()
}

// MemoryBytes reports the current linear memory size of each instance (0 for an instance
// without a running VM).
func (p *Plugin) MemoryBytes() []uint64 {
	out := make([]uint64, len(p.instances))
	for i, in := range p.instances {
		in.enter()
		if in.vm != nil && in.vm.dead == nil {
			out[i] = uint64(in.vm.mod.Memory().Size())
		}
		in.leave()
	}
	return out
}

// CallForeignFunction delivers proxy_on_foreign_function(function_id, args) to the root
// context of every instance, with args readable as the FOREIGN_FUNCTION_ARGUMENTS buffer.
func (p *Plugin) CallForeignFunction(ctx context.Context, functionID uint32, args []byte) error {
	if p.closed.Load() {
		return ErrClosed
	}
	var errs []error
	for _, in := range p.instances {
		in.enter()
		if v := in.vm; v != nil && v.dead == nil {
			vc := &vmCall{vm: v, effective: v.rootID, callback: fnOnForeignFunction,
				foreignActive: true, foreignArgs: args}
			if _, _, err := v.call(vc, fnOnForeignFunction, uint64(v.rootID), uint64(functionID), uint64(len(args))); err != nil {
				errs = append(errs, err)
				in.fail(v, err, nil)
			}
		}
		in.leave()
	}
	return errors.Join(errs...)
}

// Close shuts the plugin down as Envoy does: proxy_on_done on every root context, waiting
// (until ctx is done) for roots that return false to call proxy_done, then
// proxy_on_delete. Timers stop and outstanding HTTP and gRPC calls are cancelled
// (without callbacks).
func (p *Plugin) Close(ctx context.Context) error {
	if !p.closed.CompareAndSwap(false, true) {
		return nil
	}
	defer p.cancel()
	var errs []error
	for _, in := range p.instances {
		in.enter()
		v := in.vm
		var wait chan struct{}
		if v != nil && v.dead == nil {
			vc := &vmCall{vm: v, effective: v.rootID, callback: fnOnDone}
			ret, exported, err := v.call(vc, fnOnDone, uint64(v.rootID))
			switch {
			case err != nil:
				errs = append(errs, err)
				v.kill()
			case exported && ret == 0:
				v.doneCh = make(chan struct{})
				wait = v.doneCh
			}
		}
		in.leave()
		if wait != nil {
			select {
			case <-wait:
			case <-ctx.Done():
				errs = append(errs, fmt.Errorf("plugin %q: waiting for proxy_done: %w", p.cfg.Name, ctx.Err()))
			}
		}
		in.enter()
		if v != nil && v.dead == nil {
			vc := &vmCall{vm: v, effective: v.rootID, callback: fnOnDelete}
			if _, _, err := v.call(vc, fnOnDelete, uint64(v.rootID)); err != nil {
				errs = append(errs, err)
			}
			v.kill()
		}
		in.vm = nil
		in.leave()
	}
	return errors.Join(errs...)
}

// instance is one worker slot. It holds the current VM and replaces it when it fails. mu
// serialises guest execution; events that arrive while the guest is busy wait in queue and
// run, in order, before mu is released.
type instance struct {
	p   *Plugin
	idx int

	mu sync.Mutex
	vm *vm
	// watched is the deadline bookkeeping of the instance's current VM, for the watchdog.
	watched atomic.Pointer[watch]
	// notes are embedder notifications (stream signals) and wake-ups of other instances,
	// collected under mu and run after it is released so the embedder can call back in.
	notes []func()

	qmu    sync.Mutex
	queue  []func()
	active bool
}

func (in *instance) enter() {
	in.mu.Lock()
	in.qmu.Lock()
	in.active = true
	in.qmu.Unlock()
}

// leave runs the events queued while the instance was busy, releases it, then runs the
// notifications collected meanwhile.
func (in *instance) leave() {
	for {
		in.qmu.Lock()
		if len(in.queue) == 0 {
			in.active = false
			in.qmu.Unlock()
			break
		}
		ev := in.queue[0]
		in.queue[0] = nil
		in.queue = in.queue[1:]
		in.qmu.Unlock()
		ev()
	}
	notes := in.notes
	in.notes = nil
	in.mu.Unlock()
	for _, n := range notes {
		n()
	}
}

// enqueue adds an event and reports whether someone is already running the instance (and
// will therefore run the event).
func (in *instance) enqueue(ev func()) (busy bool) {
	in.qmu.Lock()
	defer in.qmu.Unlock()
	in.queue = append(in.queue, ev)
	return in.active
}

// kick runs the queued events if nobody else is.
func (in *instance) kick() {
	in.qmu.Lock()
	busy := in.active || len(in.queue) == 0
	in.qmu.Unlock()
	if busy {
		return
	}
	in.enter()
	in.leave()
}

// post delivers an event from outside any guest call (timers, dispatcher goroutines).
func (in *instance) post(ev func()) {
	if !in.enqueue(ev) {
		in.kick()
	}
}

// postFrom delivers an event from inside a guest call on vc's instance. Waking another
// instance is deferred until vc's instance is released: taking a second instance lock
// while holding one could deadlock with an instance doing the same in reverse.
func (vc *vmCall) postTo(target *instance, ev func()) {
	busy := target.enqueue(ev)
	if busy || target == vc.vm.in {
		return
	}
	vc.vm.in.notes = append(vc.vm.in.notes, target.kick)
}

// ensureVM returns a running VM, starting a new one if the last one failed and could not
// be replaced at the time. Called with the instance entered.
func (in *instance) ensureVM() (*vm, error) {
	if in.vm != nil && in.vm.dead == nil {
		return in.vm, nil
	}
	if in.p.closed.Load() {
		return nil, ErrClosed
	}
	v, err := in.startVM()
	if err != nil {
		in.p.count(func(s *PluginStats) { s.RestartFailures++ })
		return nil, err
	}
	in.vm = v
	in.p.count(func(s *PluginStats) { s.Replacements++ })
	return v, nil
}

// fail handles a guest failure on v: it counts it, kills the VM, tells every other stream
// bound to it that it has lost its filter, and replaces the VM. sync is the stream whose
// own call failed (it learns the outcome from its Result, not a signal).
func (in *instance) fail(v *vm, err error, sync *streamCore) *Failure {
	f := asFailure(err)
	if v.dead != nil {
		return f
	}
	p := in.p
	p.count(func(s *PluginStats) { s.Failures[f.Kind]++ })
	p.log.Error("wasm guest failed; replacing the instance", "kind", f.Kind, "callback", f.Callback,
		"instance", in.idx, "error", f.Err)
	v.dead = f
	for _, gc := range v.contexts {
		s := gc.core()
		if s == nil || s == sync || s.done || s.failed != nil {
			continue
		}
		s.failed, s.failReported = f, true
		sig := Signal{Kind: SignalFailed, Failure: f, LocalResponse: s.failPolicy()}
		if cb := s.onSignal; cb != nil {
			in.notes = append(in.notes, func() { cb(sig) })
		}
		p.count(func(st *PluginStats) { st.Aborted++ })
	}
	v.kill()
	if in.vm == v && !p.closed.Load() {
		nv, serr := in.startVM()
		if serr != nil {
			in.vm = nil
			p.count(func(s *PluginStats) { s.RestartFailures++ })
			p.log.Error("wasm instance could not be restarted", "instance", in.idx, "error", serr)
		} else {
			in.vm = nv
			p.count(func(s *PluginStats) { s.Replacements++ })
		}
	}
	return f
}

// asFailure extracts the *Failure a vm.call error carries.
func asFailure(err error) *Failure {
	var f *Failure
	if errors.As(err, &f) {
		return f
	}
	return &Failure{Kind: FailureTrap, Err: err}
}
