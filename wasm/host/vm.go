package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/wasmesh/wasmesh/wasm/host/internal/interrupt"
)

// vm is one instantiation of a module: a wazero module instance with its contexts, timers
// and outstanding calls. It is only touched with its instance entered.
type vm struct {
	in  *instance
	p   *Plugin
	mod api.Module
	mem *limitedMemory

	fns     map[string]api.Function
	allocFn api.Function
	// exports are the callbacks with their parameter and result counts, so a call costs
	// one map lookup and no definition lookups.
	exports map[string]*export
	// stacks are the parameter/result stacks of the calls in progress, by nesting depth,
	// reused from call to call (wazero's Call allocates one per call).
	stacks [][]uint64
	// spare holds vmCalls for reuse (see newCall).
	spare []*vmCall
	// interned holds the strings of property path segments and header names guests pass
	// (see intern); path is the segments of the path being resolved.
	interned map[string]string
	path     []string

	rootID   uint32
	nextID   uint32
	contexts map[uint32]*guestContext

	tick *ticker

	nextToken uint32
	calls     map[uint32]*pendingCall
	// grpcToken is the last gRPC call id handed out; grpcCalls are the pending ones.
	grpcToken uint32
	grpcCalls map[uint32]*pendingCall

	// doneCh is set while Close waits for the root context to call proxy_done.
	doneCh chan struct{}
	dead   *Failure
	killed bool
	// w carries the VM's call context and callback deadline; cur is the running callback.
	w   *watch
	cur *vmCall
	// lastError is the last error-level line the guest logged, quoted when a start-up
	// callback returns false (Envoy logs it just before "Unable to configure").
	lastError string
	// stderr keeps what the guest wrote to fd 2 during the outermost callback, quoted in
	// its Failure.
	stderr outputCapture
}

// guestContext is a context id known to the guest: the root context or a stream.
type guestContext struct {
	id   uint32
	http *HTTPStream
	net  *NetworkStream
}

func (g *guestContext) core() *streamCore {
	switch {
	case g.http != nil:
		return &g.http.streamCore
	case g.net != nil:
		return &g.net.streamCore
	}
	return nil
}

// pendingCall is an HTTP or gRPC call a guest made and the host has not delivered yet.
type pendingCall struct {
	// once is taken by the call's first outcome (its answer, failure or timeout), or by
	// abandon: later ones are dropped.
	once sync.Once
	stop func() bool // the timeout's timer; nil without one
	// cancel ends the dispatcher's context with a cause.
	cancel context.CancelCauseFunc
}

// startCall registers a call of the VM under token in calls and returns its dispatcher's
// context and finish, which the dispatcher calls with the call's outcome: the first one
// (or timeoutErr once timeout passes, if it is not 0) ends the context and is handed to
// deliver on the instance. deliver is posted outside the Once: post may run it at once,
// and a callback that cancels the call takes the Once too.
func startCall[R any](v *vm, calls map[uint32]*pendingCall, token uint32, timeout time.Duration, timeoutErr error,
	deliver func(pc *pendingCall, r R, err error)) (*pendingCall, context.Context, func(R, error)) {
	ctx, cancel := context.WithCancelCause(v.p.ctx)
	pc := &pendingCall{cancel: cancel}
	calls[token] = pc
	finish := func(r R, err error) {
		first := false
		pc.once.Do(func() {
			first = true
			if err == nil {
				cancel(context.Canceled)
			} else {
				cancel(err)
			}
		})
		if first {
			v.in.post(func() { deliver(pc, r, err) })
		}
	}
	if timeout > 0 {
		var none R
		pc.stop = v.p.env.Clock.AfterFunc(timeout, func() { finish(none, timeoutErr) })
	}
	return pc, ctx, finish
}

// abandon ends a call with nothing delivered (its dispatch failed, the guest cancelled it,
// or the VM went away): its timer stops and the dispatcher's context ends with cause.
func (pc *pendingCall) abandon(cause error) {
	pc.once.Do(func() {})
	if pc.stop != nil {
		pc.stop()
	}
	pc.cancel(cause)
}

// vmCall is the state of one guest callback, reachable from host functions through the
// call's context. Host calls act on the effective context (the callback's own context
// unless the guest changed it with proxy_set_effective_context).
type vmCall struct {
	vm        *vm
	effective uint32
	callback  string
	// sync is the stream whose method is running this callback; its own actions are
	// returned in the Result rather than signalled.
	sync *streamCore

	pluginConfig   bool
	httpCallActive bool
	httpResp       *HTTPCallResponse
	httpErr        error
	foreignActive  bool
	foreignArgs    []byte
	// grpcResp is the gRPC call being delivered; grpcReceive marks its receive callback,
	// the only one with the GrpcReceiveBuffer.
	grpcResp    *GRPCCallResponse
	grpcReceive bool

	local   *LocalResponse
	signals []Signal
}

// startVM instantiates the module and runs it up to a configured root context. Called
// with the instance entered.
func (in *instance) startVM() (*vm, error) {
	p := in.p
	v := &vm{
		in: in, p: p,
		mem:       newLimitedMemory(p.limit),
		fns:       map[string]api.Function{},
		exports:   map[string]*export{},
		interned:  map[string]string{},
		contexts:  map[uint32]*guestContext{},
		calls:     map[uint32]*pendingCall{},
		grpcCalls: map[uint32]*pendingCall{},
		nextID:    1,
	}
	clock := p.env.Clock
	base := clock.Now()
	logw := func(level slog.Level, stream string) *lineWriter {
		return &lineWriter{emit: func(line string) {
			if level >= slog.LevelError {
				v.lastError = line
			}
			p.log.Log(p.ctx, level, line, "source", stream, "instance", in.idx, "wasm_level", LogLevelFromSlog(level).String())
		}}
	}
	stdout, stderr := logw(slog.LevelInfo, "stdout"), logw(slog.LevelError, "stderr")
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions().
		WithStdout(stdout).
		WithStderr(io.MultiWriter(stderr, &v.stderr)).
		WithRandSource(p.env.Rand).
		WithWalltime(func() (int64, int32) {
			t := clock.Now()
			return t.Unix(), int32(t.Nanosecond())
		}, 1).
		// Monotonic time starts at 1ns: the Go runtime refuses to start on a zero clock, and
		// a manual clock does not move while the guest initialises.
		WithNanotime(func() int64 { return int64(clock.Now().Sub(base)) + 1 }, 1)

	v.w = newWatch(p.ctx, v)
	in.watched.Store(v.w)
	v.cur = &vmCall{vm: v, callback: "instantiate"}
	v.w.begin()
	mod, err := instantiate(experimental.WithMemoryAllocator(v.w.ctx, v.mem), p.mod.wz, p.mod.compiled, cfg)
	v.w.end()
	v.cur = nil
	if err != nil {
		f := v.classify("instantiate", err)
		v.w.cancel(ErrClosed)
		return nil, fmt.Errorf("plugin %q: instantiate: %w", p.cfg.Name, f)
	}
	if v.mod == nil {
		v.adopt(mod)
	}
	p.count(func(s *PluginStats) { s.VMStarts++ })

	startErr := func(phase string, err error) (*vm, error) {
		v.kill()
		var f *Failure
		if errors.As(err, &f) {
			if f.Kind == FailureBadReturn {
				msg := fmt.Sprintf("plugin %q: %s returned false", p.cfg.Name, phase)
				if v.lastError != "" {
					msg += " (the guest logged: " + v.lastError + ")"
				}
				return nil, &startError{msg: msg, err: f}
			}
			return nil, &startError{msg: fmt.Sprintf("plugin %q: %s: %s: %s", p.cfg.Name, phase, f.Kind, f.Reason()), err: f}
		}
		return nil, fmt.Errorf("plugin %q: %s: %w", p.cfg.Name, phase, err)
	}
	// Reactors (Go c-shared, AssemblyScript, Emscripten) export _initialize, and maybe main;
	// WASI commands (older TinyGo) export _start, which may end with proc_exit(0).
	if _, ok := v.fns[fnInitialize]; ok {
		if _, _, err := v.call(&vmCall{vm: v, callback: fnInitialize}, fnInitialize); err != nil {
			return startErr(fnInitialize, err)
		}
		if fn := v.fns[fnMain]; fn != nil && len(fn.Definition().ParamTypes()) == 2 {
			if _, _, err := v.call(&vmCall{vm: v, callback: fnMain}, fnMain, 0, 0); err != nil {
				return startErr(fnMain, err)
			}
		}
	} else if _, ok := v.fns[fnStart]; ok {
		if _, _, err := v.call(&vmCall{vm: v, callback: fnStart}, fnStart); err != nil {
			var pe *procExit
			if !errors.As(err, &pe) || pe.code != 0 {
				return startErr(fnStart, err)
			}
		}
	}

	v.rootID = v.newContextID()
	v.contexts[v.rootID] = &guestContext{id: v.rootID}
	root := func(cb string) *vmCall {
		return &vmCall{vm: v, effective: v.rootID, callback: cb}
	}
	if _, _, err := v.call(root(fnOnContextCreate), fnOnContextCreate, uint64(v.rootID), 0); err != nil {
		return startErr("on_context_create", err)
	}
	ret, exported, err := v.call(root(fnOnVMStart), fnOnVMStart, uint64(v.rootID), uint64(len(p.cfg.VMConfig)))
	if err != nil {
		return startErr("on_vm_start", err)
	}
	if exported && ret == 0 && v.returns(fnOnVMStart) {
		return startErr("on_vm_start", &Failure{Kind: FailureBadReturn, Plugin: p.cfg.Name, Callback: fnOnVMStart,
			Instance: in.idx, Err: errors.New("on_vm_start returned false")})
	}
	cvc := root(fnOnConfigure)
	cvc.pluginConfig = true
	ret, exported, err = v.call(cvc, fnOnConfigure, uint64(v.rootID), uint64(len(p.cfg.Configuration)))
	if err != nil {
		return startErr("on_configure", err)
	}
	if exported && ret == 0 && v.returns(fnOnConfigure) {
		return startErr("on_configure", &Failure{Kind: FailureBadReturn, Plugin: p.cfg.Name, Callback: fnOnConfigure,
			Instance: in.idx, Err: errors.New("on_configure returned false")})
	}
	return v, nil
}

// startError reports a VM that failed to start, keeping the Failure reachable with
// errors.As.
type startError struct {
	msg string
	err error
}

func (e *startError) Error() string { return e.msg }
func (e *startError) Unwrap() error { return e.err }

// adopt binds the VM to its module instance and looks up the exports the host calls. It
// runs as soon as the guest first calls the host, which may be during instantiation (a
// start section) when InstantiateModule has not returned yet.
func (v *vm) adopt(mod api.Module) {
	v.mod = mod
	if v.p.mod.interruptible {
		if g, ok := mod.ExportedGlobal(interrupt.GlobalName).(api.MutableGlobal); ok {
			v.w.arm(g)
		}
	}
	for name := range callbackArity {
		if fn := mod.ExportedFunction(name); fn != nil {
			v.fns[name] = fn
		}
	}
	for _, name := range []string{fnInitialize, fnStart, fnMain} {
		if fn := mod.ExportedFunction(name); fn != nil {
			v.fns[name] = fn
		}
	}
	for name, fn := range v.fns {
		d := fn.Definition()
		v.exports[name] = &export{fn: fn, params: len(d.ParamTypes()), results: len(d.ResultTypes())}
	}
	// The spec prefers proxy_on_memory_allocate and keeps malloc for older modules.
	if v.allocFn = v.fns[fnMemoryAllocate]; v.allocFn == nil {
		v.allocFn = v.fns[fnMalloc]
	}
}

// instantiate guards against panics inside wazero while instantiating (a module whose
// initial memory the allocator cannot provide, for instance).
func instantiate(ctx context.Context, wz wazero.Runtime, c wazero.CompiledModule, cfg wazero.ModuleConfig) (mod api.Module, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("instantiation panicked: %v", r)
		}
	}()
	return wz.InstantiateModule(ctx, c, cfg)
}

func (v *vm) returns(name string) bool {
	fn := v.fns[name]
	return fn != nil && len(fn.Definition().ResultTypes()) == 1
}

func (v *vm) newContextID() uint32 {
	for {
		id := v.nextID
		v.nextID++
		if id == 0 {
			continue
		}
		if _, used := v.contexts[id]; !used {
			return id
		}
	}
}

// call runs one guest export under the plugin's callback deadline. A missing export
// returns exported=false and no error (optional callbacks default to Continue, as in
// Envoy). An error is a *Failure; the VM must then be failed by the caller.
func (v *vm) call(vc *vmCall, name string, args ...uint64) (ret uint64, exported bool, err error) {
	e := v.exports[name]
	if e == nil {
		return 0, false, nil
	}
	if v.dead != nil {
		return 0, true, v.dead
	}
	if v.w.depth == 0 {
		v.stderr.reset()
	}
	if v.w.ctx.Err() != nil {
		// Stopped (deadline, plugin closing) between callbacks: as wazero does for a
		// context already done, do not enter the guest.
		return 0, true, v.classify(name, context.Cause(v.w.ctx))
	}
	// The callback deadline is independent of any request context: a client going away
	// must not tear down an instance in the middle of a callback (see watchdog.go).
	prev := v.cur
	v.cur = vc
	// A top-level callback is timed whole, the host calls it makes and the guest calls
	// they make back (proxy_on_memory_allocate) included.
	top := v.w.depth == 0
	var start time.Time
	if top {
		start = time.Now()
	}
	v.w.begin()
	defer func() {
		v.w.end()
		v.cur = prev
		if top {
			v.p.callbackTime.Add(int64(time.Since(start)))
			v.p.callbacks.Add(1)
		}
	}()
	v.mem.refused = false
	// 0.1.0 header callbacks lack end_of_stream: extra arguments are dropped.
	stack := v.stack(v.w.depth, max(e.params, e.results))
	copy(stack, args[:min(len(args), e.params)])
	if cerr := e.fn.CallWithStack(v.w.ctx, stack); cerr != nil {
		return 0, true, v.classify(name, cerr)
	}
	if e.results > 0 {
		return stack[0], true, nil
	}
	return 1, true, nil
}

// export is a guest callback and its parameter and result counts.
type export struct {
	fn              api.Function
	params, results int
}

// stack returns the reusable call stack for a call at depth, of at least n values.
func (v *vm) stack(depth, n int) []uint64 {
	for len(v.stacks) <= depth {
		v.stacks = append(v.stacks, make([]uint64, 8))
	}
	if len(v.stacks[depth]) < n {
		v.stacks[depth] = make([]uint64, n)
	}
	s := v.stacks[depth][:n]
	clear(s)
	return s
}

// maxInterned bounds the strings a VM interns: a guest that passes ever new names only
// loses the saving.
const maxInterned = 512

// intern returns b as a string, the same string each time while the table has room, so
// the names guests pass on every call (header names, property path segments) are not
// allocated each time.
func (v *vm) intern(b []byte) string {
	if s, ok := v.interned[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(v.interned) < maxInterned {
		v.interned[s] = s
	}
	return s
}

// splitPath is SplitPath with interned segments, in a buffer reused until the next call.
func (v *vm) splitPath(path []byte) []string {
	parts := v.path[:0]
	for start := 0; start < len(path); {
		end := start
		for end < len(path) && path[end] != 0 {
			end++
		}
		parts = append(parts, v.intern(path[start:end]))
		start = end + 1
	}
	v.path = parts
	return parts
}

// newCall returns a vmCall for a callback, reusing one that release gave back: a
// callback on a hot path would otherwise allocate one per call.
func (v *vm) newCall(effective uint32, callback string, sync *streamCore) *vmCall {
	var vc *vmCall
	if n := len(v.spare); n > 0 {
		vc, v.spare = v.spare[n-1], v.spare[:n-1]
	} else {
		vc = &vmCall{vm: v}
	}
	vc.effective, vc.callback, vc.sync = effective, callback, sync
	return vc
}

// release gives vc back for reuse once its callback has returned and its results (local
// reply, signals) have been taken: nothing may hold it afterwards.
func (v *vm) release(vc *vmCall) {
	*vc = vmCall{vm: v}
	if len(v.spare) < 4 {
		v.spare = append(v.spare, vc)
	}
}

// classify turns a runtime error into a Failure.
func (v *vm) classify(name string, err error) *Failure {
	f := &Failure{Kind: FailureTrap, Plugin: v.p.cfg.Name, Callback: name, Instance: v.in.idx, Err: err,
		Stderr: v.stderr.String()}
	var exit *sys.ExitError
	var pe *procExit
	switch {
	case v.w.interrupted():
		// The interrupt check trapped (or the call was refused) because the watch context
		// ended: what wazero reports as a context exit for modules without the check.
		f.Kind = FailureTimeout
		if cause := context.Cause(v.w.ctx); cause != err {
			f.Err = fmt.Errorf("%w: %w", cause, err)
		}
	case errors.As(err, &exit):
		switch exit.ExitCode() {
		case sys.ExitCodeDeadlineExceeded, sys.ExitCodeContextCanceled:
			f.Kind = FailureTimeout
		default:
			f.Kind = FailureExit
		}
	case errors.As(err, &pe):
		f.Kind = FailureExit
	}
	if v.mem.refused {
		f.Kind = FailureMemory
	}
	return f
}

// kill stops the VM's timers and calls and closes its module.
func (v *vm) kill() {
	if v.killed {
		return
	}
	v.killed = true
	if v.dead == nil {
		v.dead = &Failure{Kind: FailureUnavailable, Plugin: v.p.cfg.Name, Instance: v.in.idx, Err: ErrClosed}
	}
	if v.tick != nil {
		v.tick.halt()
		v.tick = nil
	}
	for tok, pc := range v.calls {
		pc.abandon(ErrClosed)
		delete(v.calls, tok)
	}
	for tok, pc := range v.grpcCalls {
		pc.abandon(ErrClosed)
		delete(v.grpcCalls, tok)
	}
	if v.doneCh != nil {
		close(v.doneCh)
		v.doneCh = nil
	}
	if v.mod != nil {
		_ = v.mod.Close(context.Background())
	}
	v.w.cancel(ErrClosed)
}

// alive reports whether v is still the instance's VM and usable.
func (v *vm) alive() bool { return v.in.vm == v && v.dead == nil }

// ticker drives proxy_on_tick for a root context. The next tick is armed when one fires,
// before the guest runs, so ticks keep their cadence on a manual clock however long the
// callbacks take; a tick that fires while the previous one still waits for the instance
// is coalesced with it rather than queued, so a slow guest is never flooded.
type ticker struct {
	mu      sync.Mutex
	stop    func() bool
	stopped bool
	pending bool
}

func (t *ticker) halt() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	if t.stop != nil {
		t.stop()
	}
}

// setTick (re)arms the root context's timer; 0 disables it.
func (v *vm) setTick(period time.Duration) {
	if v.tick != nil {
		v.tick.halt()
		v.tick = nil
	}
	if period <= 0 {
		return
	}
	t := &ticker{}
	v.tick = t
	clock := v.p.env.Clock
	var fire func()
	fire = func() {
		t.mu.Lock()
		if t.stopped {
			t.mu.Unlock()
			return
		}
		t.stop = clock.AfterFunc(period, fire)
		already := t.pending
		t.pending = true
		t.mu.Unlock()
		if already {
			return
		}
		v.in.post(func() {
			t.mu.Lock()
			t.pending = false
			stopped := t.stopped
			t.mu.Unlock()
			if stopped || !v.alive() {
				return
			}
			vc := &vmCall{vm: v, effective: v.rootID, callback: fnOnTick}
			if _, _, err := v.call(vc, fnOnTick, uint64(v.rootID)); err != nil {
				v.in.fail(v, err, nil)
			}
		})
	}
	t.mu.Lock()
	t.stop = clock.AfterFunc(period, fire)
	t.mu.Unlock()
}

// lineWriter turns the guest's stdout/stderr into one log record per line, the way Envoy
// logs fd_write (stripping the newline).
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(string)
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.emit(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	// A guest that never writes a newline still gets its output logged in bounded pieces.
	if len(w.buf) >= 4096 {
		w.emit(string(w.buf))
		w.buf = nil
	}
	return len(b), nil
}
