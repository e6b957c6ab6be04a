// Package proxywasm is wasmesh's guest SDK for proxy-wasm filters: the API of
// proxy-wasm-go-sdk's proxywasm package (v0.24.0), function for function, over the SDK's
// own proxywasm/types, so a filter reads exactly like an SDK filter.
//
// Which implementation a build gets depends on the toolchain:
//
//   - GOOS=wasip1 with the standard Go toolchain: this package's own ABI layer for
//     proxy-wasm ABI v0.2.1 (//go:wasmimport env proxy_*, //go:wasmexport proxy_on_*),
//     because the SDK only targets TinyGo (its host calls are TinyGo exports and it
//     assumes a 32-bit int). Filters are built as reactors:
//     GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o filter.wasm ./filter
//   - Everything else, natively for unit tests with the SDK's proxytest emulator and
//     under TinyGo: thin wrappers over the SDK itself.
//
// A reactor is started by the host calling _initialize, which runs package init
// functions but never main. So a filter registers its VM context in init and leaves main
// empty:
//
//	func init() { proxywasm.SetVMContext(&vmContext{}) }
//	func main() {}
//
// The wasip1 layer follows the SDK's context bookkeeping (see internal/vmstate) and adds
// what the standard toolchain needs: 32-bit pointers and sizes at the boundary, buffers
// kept alive across host calls, and memory the host allocates in the guest kept
// reachable until the guest reads it (see internal/hostmem). The SDK v0.24.0 has no
// foreign-function callback in its types, so proxy_on_foreign_function is not exported.
//
// Allocation is dear in a standard-Go Wasm guest (a small allocation costs about as much as
// a host call), so the wasip1 layer hands host call results over through a reused arena
// rather than a heap allocation each, and the package adds, in every build, a few calls
// that are not in the SDK for filters' hot paths: AppendProperty, AppendHttpRequestHeader,
// AppendHttpResponseHeader and AppendSharedData read into a caller's buffer instead of
// allocating their result. The wasip1 build also sets the garbage collector's target to 25%
// (GOGC, which a guest cannot get from its environment), which keeps each instance's heap
// near 1 MiB rather than 4 MiB.
//
// Code runs only inside callbacks: once a callback returns to the host, no goroutine
// runs until the next one, so filters must not start goroutines or wait on timers.
//
// What a host must provide beyond the proxy-wasm functions: the Go runtime imports
// wasi_snapshot_preview1 sched_yield, poll_oneoff (clock subscriptions, used to sleep),
// proc_exit, args_*, environ_*, clock_time_get, fd_write and random_get; the os package
// (which fmt and encoding/json import) adds fd_close, fd_fdstat_get, fd_fdstat_set_flags,
// fd_prestat_get and fd_prestat_dir_name. wazero's WASI implements all of them. Envoy's
// proxy-wasm-cpp-host added the ones it lacked only in 2026 (proxy-wasm-cpp-host#533);
// older Envoys refuse to load standard-Go modules (missing import), and hosts that stub
// poll_oneoff with ENOSYS can crash the runtime (golang/go#78513).
package proxywasm
