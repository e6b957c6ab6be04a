// Command abi010 is a guest written against ABI 0.1.0, as older SDKs produced: it exports
// proxy_abi_version_0_1_0 and malloc, its header callbacks have no end_of_stream argument,
// and it uses proxy_get_configuration and proxy_continue_request.
package main

import (
	"strconv"
	"unsafe"

	"hostguests/abi"
)

func main() {}

//go:wasmimport env proxy_get_configuration
func proxyGetConfiguration(retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_continue_request
func proxyContinueRequest() uint32

//go:wasmimport env proxy_continue_response
func proxyContinueResponse() uint32

//go:wasmimport env proxy_clear_route_cache
func proxyClearRouteCache() uint32

//go:wasmexport proxy_abi_version_0_1_0
func abiVersion() {}

//go:wasmexport malloc
func malloc(size uint32) uint32 { return abi.Alloc(size) }

var (
	config  string
	vmConf  string
	pending = map[uint32]uint32{}
)

func getConfiguration() string {
	var p, n uint32
	if proxyGetConfiguration(unsafe.Pointer(&p), unsafe.Pointer(&n)) != abi.OK {
		return "<error>"
	}
	return string(abi.Take(p, n))
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_vm_start
func onVMStart(root, size uint32) uint32 {
	vmConf = getConfiguration()
	return 1
}

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) uint32 {
	config = getConfiguration()
	return 1
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n uint32) uint32 {
	abi.AddHeader(abi.RequestHeaders, "x-abi", "0.1.0")
	abi.AddHeader(abi.RequestHeaders, "x-config", vmConf+"|"+config)
	v, st := abi.Header(abi.RequestHeaders, "x-missing")
	abi.AddHeader(abi.RequestHeaders, "x-missing-status", strconv.Itoa(int(st))+":"+v)
	if op, _ := abi.Header(abi.RequestHeaders, "x-op"); op == "call" {
		token, st := abi.HTTPCall("auth", [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "a"}}, nil, nil, 1000)
		if st == abi.OK {
			pending[token] = id
			return 1
		}
	}
	return 0
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n uint32) uint32 {
	abi.AddHeader(abi.ResponseHeaders, "x-abi-response", strconv.Itoa(int(n)))
	// ABI 0.1.0 reads a missing header as "", so test the value.
	if v, _ := abi.Header(abi.ResponseHeaders, "x-continue"); v != "" {
		proxyClearRouteCache()
		proxyContinueResponse()
		return 1
	}
	return 0
}

//go:wasmexport proxy_on_http_call_response
func onHTTPCallResponse(root, token, nh, bs, nt uint32) {
	id := pending[token]
	delete(pending, token)
	abi.ProxySetEffectiveContext(id)
	abi.AddHeader(abi.RequestHeaders, "x-called", strconv.Itoa(int(nh)))
	proxyContinueRequest()
}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 { return 1 }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {}
