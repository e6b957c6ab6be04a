package host

import (
	"context"
	"fmt"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// instantiateHostModules registers env (the proxy_* calls) and WASI under both module names
// guests use: wasi_snapshot_preview1 (Go, TinyGo, Rust) and wasi_unstable (AssemblyScript's
// proxy-runtime), as Envoy does. The WASI calls are wazero's, reading each instance's
// configuration: fd_write goes to the plugin logger one line at a time, clocks come from the
// plugin's Clock, random_get from Environment.Rand, and there are no arguments, environment
// or files.
func (r *Runtime) instantiateHostModules(ctx context.Context, wz wazero.Runtime) error {
	if err := r.instantiateEnv(ctx, wz); err != nil {
		return fmt.Errorf("wasm runtime: env module: %w", err)
	}
	for _, name := range []string{wasi_snapshot_preview1.ModuleName, "wasi_unstable"} {
		b := wz.NewHostModuleBuilder(name)
		wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(b)
		// wazero's proc_exit closes the module, which would make a command-style module that
		// exits 0 at the end of _start unusable. This one unwinds the guest instead; the host
		// treats a non-zero exit (Go and TinyGo exit 2 on panic) as a failure.
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
			panic(&procExit{code: uint32(stack[0])})
		}), []api.ValueType{api.ValueTypeI32}, nil).Export("proc_exit")
		if _, err := b.Instantiate(ctx); err != nil {
			return fmt.Errorf("wasm runtime: %s module: %w", name, err)
		}
	}
	return nil
}
