package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/wasmesh/wasmesh/wasm/host/internal/interrupt"
)

// RuntimeConfig configures a Runtime. The zero value is ready to use.
type RuntimeConfig struct {
	// Interpreter selects wazero's interpreter instead of its compiler (the default on
	// platforms that support it). The interpreter starts faster and runs slower.
	Interpreter bool
	// CompilationCacheDir, if set, keeps wazero's compiled machine code on disk between
	// processes.
	CompilationCacheDir string
	// CompilationCache, if set, is a wazero cache shared with other runtimes in the process
	// (it takes precedence over CompilationCacheDir). Runtimes sharing one still count
	// their own Compilations.
	CompilationCache wazero.CompilationCache
	// Logger receives the host's own logs; plugins log through Environment.Logger and fall
	// back to this. Nil means slog.Default().
	Logger *slog.Logger
}

// Runtime is the process-wide wasm engine: it owns the wazero runtime and the host modules
// (env, wasi_snapshot_preview1, wasi_unstable), compiles each distinct module once, and
// holds the shared data and shared queues that Envoy keeps per process, keyed by vm_id.
type Runtime struct {
	// wz runs modules that carry their own interrupt check (package interrupt): the
	// compiler's default. stoppable, created on first use, runs modules the check could
	// not be added to (and everything in interpreter mode) with wazero's
	// close-on-context-done instead, which costs a goroutine per call (see interrupt).
	wz         wazero.Runtime
	stoppable  wazero.Runtime
	instrument bool
	cfg        wazero.RuntimeConfig
	log        *slog.Logger
	closed     atomic.Bool

	mu       sync.Mutex
	modules  map[[32]byte]*compileEntry
	compiles atomic.Int64

	data   sharedData
	queues sharedQueues
}

type compileEntry struct {
	ready chan struct{}
	mod   *Module
	err   error
}

// NewRuntime creates a Runtime.
func NewRuntime(ctx context.Context, cfg RuntimeConfig) (*Runtime, error) {
	var rc wazero.RuntimeConfig
	if cfg.Interpreter {
		rc = wazero.NewRuntimeConfigInterpreter()
	} else {
		rc = wazero.NewRuntimeConfig()
	}
	if cfg.CompilationCache != nil {
		rc = rc.WithCompilationCache(cfg.CompilationCache)
	} else if cfg.CompilationCacheDir != "" {
		cache, err := wazero.NewCompilationCacheWithDir(cfg.CompilationCacheDir)
		if err != nil {
			return nil, fmt.Errorf("wasm runtime: compilation cache: %w", err)
		}
		rc = rc.WithCompilationCache(cache)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	r := &Runtime{
		cfg:        rc,
		instrument: !cfg.Interpreter,
		log:        log.With("scope", "wasm"),
		modules:    map[[32]byte]*compileEntry{},
		data:       sharedData{byVM: map[string]map[string]*sharedEntry{}},
		queues:     sharedQueues{byName: map[queueName]uint32{}, queues: map[uint32]*sharedQueue{}},
	}
	if r.instrument {
		// The interpreter reads globals from Go code, so setting the interrupt global from the
		// watchdog would race with it: it keeps wazero's own mechanism.
		r.wz = wazero.NewRuntimeWithConfig(ctx, rc)
		if err := r.instantiateHostModules(ctx, r.wz); err != nil {
			_ = r.wz.Close(ctx)
			return nil, err
		}
	} else if _, err := r.stoppableRuntime(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// stoppableRuntime returns the wazero runtime with close-on-context-done, creating it on
// first use. Called with r.mu held or before r is shared.
func (r *Runtime) stoppableRuntime(ctx context.Context) (wazero.Runtime, error) {
	if r.stoppable != nil {
		return r.stoppable, nil
	}
	// Closing a module when its context is done is what stops a runaway guest at its
	// callback deadline.
	wz := wazero.NewRuntimeWithConfig(ctx, r.cfg.WithCloseOnContextDone(true))
	if err := r.instantiateHostModules(ctx, wz); err != nil {
		_ = wz.Close(ctx)
		return nil, err
	}
	r.stoppable = wz
	return wz, nil
}

// Close releases the wazero runtime and every module and instance created from it.
func (r *Runtime) Close(ctx context.Context) error {
	if !r.closed.CompareAndSwap(false, true) {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, wz := range []wazero.Runtime{r.wz, r.stoppable} {
		if wz != nil {
			if err := wz.Close(ctx); err != nil {
				errs = append(errs, fmt.Errorf("wasm runtime: close: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// Compilations counts the modules this Runtime actually compiled; loading the same bytes
// again is served from the cache and does not count.
func (r *Runtime) Compilations() int64 { return r.compiles.Load() }

// SharedData returns a copy of the shared data of vm_id.
func (r *Runtime) SharedData(vmID string) map[string]SharedValue { return r.data.snapshot(vmID) }

// SetSharedData writes shared data as a guest would (cas 0 = unconditional), for embedders
// that seed or inspect it.
func (r *Runtime) SetSharedData(vmID, key string, value []byte, cas uint32) Status {
	return r.data.set(vmID, key, value, cas)
}

// SharedQueues returns a copy of every shared queue.
func (r *Runtime) SharedQueues() []QueueSnapshot { return r.queues.snapshot() }

// Module is a compiled proxy-wasm module, ready to back any number of plugins.
type Module struct {
	compiled wazero.CompiledModule
	// wz is the wazero runtime the module was compiled in and is instantiated in.
	wz wazero.Runtime
	// interruptible says the module carries the interrupt global (package interrupt).
	interruptible bool
	abi           ABIVersion
	sha           string
	exports       map[string]api.FunctionDefinition
	minPages      uint32
}

// ABIVersion is the ABI the module declared.
func (m *Module) ABIVersion() ABIVersion { return m.abi }

// SHA256 is the hex digest of the module bytes, the cache key.
func (m *Module) SHA256() string { return m.sha }

// Exports lists the module's exported function names.
func (m *Module) Exports() []string {
	out := make([]string, 0, len(m.exports))
	for name := range m.exports {
		out = append(out, name)
	}
	return out
}

// wasmMagic starts every WebAssembly binary.
const wasmMagic = "\x00asm"

// Compile validates and compiles a module, or returns the cached Module for bytes seen
// before. Concurrent calls with the same bytes compile once. A module that cannot be loaded
// is a *CompileError.
func (r *Runtime) Compile(ctx context.Context, wasm []byte) (*Module, error) {
	if r.closed.Load() {
		return nil, ErrClosed
	}
	sum := sha256.Sum256(wasm)
	r.mu.Lock()
	e, ok := r.modules[sum]
	if !ok {
		e = &compileEntry{ready: make(chan struct{})}
		r.modules[sum] = e
	}
	r.mu.Unlock()
	if ok {
		select {
		case <-e.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return e.mod, e.err
	}
	e.mod, e.err = r.compile(ctx, wasm, sum)
	if e.err != nil {
		// Do not cache failures: the next attempt may have a better context.
		r.mu.Lock()
		delete(r.modules, sum)
		r.mu.Unlock()
	}
	close(e.ready)
	return e.mod, e.err
}

func (r *Runtime) compile(ctx context.Context, wasm []byte, sum [32]byte) (*Module, error) {
	sha := hex.EncodeToString(sum[:])
	if head := wasm[:min(len(wasm), len(wasmMagic))]; string(head) != wasmMagic {
		// Said before instrumenting, which would only warn about the same bytes.
		return nil, &CompileError{SHA256: sha, Err: fmt.Errorf("compile: not a WebAssembly binary: it starts with %q, not %q",
			head, wasmMagic)}
	}
	wz, code, interruptible := r.wz, wasm, false
	if r.instrument {
		if ins, err := interrupt.Instrument(wasm); err == nil {
			code, interruptible = ins, true
		} else {
			r.log.Warn("wasm module: cannot add the interrupt check; running it with wazero's slower close-on-context-done",
				"sha256", sha, "error", err)
		}
	}
	if !interruptible {
		r.mu.Lock()
		var err error
		wz, err = r.stoppableRuntime(ctx)
		r.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	compiled, err := wz.CompileModule(ctx, code)
	if err != nil {
		return nil, &CompileError{SHA256: sha, Err: fmt.Errorf("compile: %w", err)}
	}
	r.compiles.Add(1)
	m := &Module{compiled: compiled, wz: wz, interruptible: interruptible, sha: sha, exports: compiled.ExportedFunctions()}
	if err := m.validate(); err != nil {
		_ = compiled.Close(ctx)
		return nil, &CompileError{SHA256: sha, Err: err}
	}
	return m, nil
}

// validate detects the ABI version and checks what the host needs from the module, so a
// module that cannot work fails when it is loaded rather than on its first request.
func (m *Module) validate() error {
	switch {
	case m.has("proxy_abi_version_0_2_1"):
		m.abi = ABI021
	case m.has("proxy_abi_version_0_2_0"):
		m.abi = ABI020
	case m.has("proxy_abi_version_0_1_0"):
		m.abi = ABI010
	default:
		return fmt.Errorf("no proxy_abi_version_0_1_0, _0_2_0 or _0_2_1 export: not a proxy-wasm module of a supported ABI")
	}
	if !m.has(fnMemoryAllocate) && !m.has(fnMalloc) {
		return fmt.Errorf("exports neither %s nor %s: the host cannot return data to it", fnMemoryAllocate, fnMalloc)
	}
	mems := m.compiled.ExportedMemories()
	if len(mems) == 0 {
		return fmt.Errorf("exports no memory")
	}
	for _, md := range mems {
		m.minPages = md.Min()
	}
	if len(m.compiled.ImportedMemories()) > 0 {
		return fmt.Errorf("imports its memory; only modules that define their own memory are supported")
	}
	for name, want := range callbackArity {
		def, ok := m.exports[name]
		if !ok {
			continue
		}
		if err := checkSignature(name, def, want.params, want.returns); err != nil {
			return err
		}
	}
	return nil
}

func (m *Module) has(name string) bool {
	_, ok := m.exports[name]
	return ok
}

func checkSignature(name string, def api.FunctionDefinition, params []int, returns bool) error {
	pt, rt := def.ParamTypes(), def.ResultTypes()
	okParams := false
	for _, n := range params {
		if len(pt) == n {
			okParams = true
		}
	}
	for _, t := range pt {
		if t != api.ValueTypeI32 {
			okParams = false
		}
	}
	okResults := len(rt) == 0 || (len(rt) == 1 && rt[0] == api.ValueTypeI32)
	if returns && len(rt) == 0 && name != fnOnVMStart && name != fnOnConfigure && name != fnOnDone {
		okResults = false
	}
	if !okParams || !okResults {
		return fmt.Errorf("export %s has signature %v -> %v; want %v i32 params", name, pt, rt, params)
	}
	return nil
}
