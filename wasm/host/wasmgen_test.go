package host

// Hand-made test modules: command-style modules (_start), modules importing wasi_unstable,
// modules without an ABI marker.

import wg "github.com/wasmesh/wasmesh/wasm/host/internal/wasmgen"

// commandModule is a WASI-command-style guest: it logs through proxy_log and
// wasi_unstable.fd_write from _start, then exits 0; it exports no stream callbacks.
func commandModule(marker string) []byte {
	msg := "started via _start"
	return wg.Module{
		Imports: []wg.Import{
			{Module: "env", Name: "proxy_log", Params: 3, Results: 1},
			{Module: "wasi_unstable", Name: "fd_write", Params: 4, Results: 1},
			{Module: "wasi_snapshot_preview1", Name: "proc_exit", Params: 1, Results: 0},
		},
		Funcs: []wg.Func{
			{Name: "_start", Body: wg.Cat(
				wg.I32Const(2), wg.I32Const(100), wg.I32Const(int32(len(msg))), wg.Call(0), wg.Drop,
				wg.I32Const(1), wg.I32Const(200), wg.I32Const(1), wg.I32Const(400), wg.Call(1), wg.Drop,
				wg.I32Const(0), wg.Call(2),
			)},
			{Name: marker},
			{Name: "proxy_on_memory_allocate", Params: 1, Results: 1, Body: wg.I32Const(1024)},
			{Name: "proxy_on_configure", Params: 2, Results: 1, Body: wg.I32Const(1)},
		},
		MemPages: 1,
		Start:    -1,
		Data: map[uint32][]byte{
			100: []byte(msg),
			200: {44, 1, 0, 0, 13, 0, 0, 0}, // iovec{ptr: 300, len: 13}
			300: []byte("hello stdout\n"),
		},
	}.Encode()
}

// startSectionModule reads plugin_root_id from its wasm start function, that is while it is
// being instantiated (as AssemblyScript's proxy-runtime can), and logs it.
func startSectionModule() []byte {
	path := "plugin_root_id"
	return wg.Module{
		Imports: []wg.Import{
			{Module: "env", Name: "proxy_log", Params: 3, Results: 1},
			{Module: "env", Name: "proxy_get_property", Params: 4, Results: 1},
		},
		Funcs: []wg.Func{
			{Body: wg.Cat(
				wg.I32Const(100), wg.I32Const(int32(len(path))), wg.I32Const(200), wg.I32Const(204), wg.Call(1), wg.Drop,
				wg.I32Const(2), wg.I32Const(200), wg.I32Load, wg.I32Const(204), wg.I32Load, wg.Call(0), wg.Drop,
			)},
			{Name: "proxy_abi_version_0_2_1"},
			{Name: "proxy_on_memory_allocate", Params: 1, Results: 1, Body: wg.I32Const(1024)},
		},
		MemPages: 1,
		Start:    0,
		Data:     map[uint32][]byte{100: []byte(path)},
	}.Encode()
}
