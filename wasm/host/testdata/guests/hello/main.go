// Command hello is the smallest useful guest: it adds one request header. Benchmarks use it
// to measure the host's per-request cost.
package main

import "hostguests/abi"

func main() {}

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 { return abi.Alloc(size) }

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) uint32 { return 1 }

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	abi.AddHeader(abi.RequestHeaders, "x-hello", "world")
	return 0
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 {
	return 0
}
