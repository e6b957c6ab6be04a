//go:build wasip1

package main

import "unsafe"

//go:wasmimport env proxy_get_property
func hostGetProperty(path *byte, pathSize uint32, returnData, returnSize *uint32) uint32

var (
	rawPath    = []byte("request\x00path")
	rawResults = new([2]uint32)
)

func rawProperty() {
	hostGetProperty(&rawPath[0], uint32(len(rawPath)), &rawResults[0], &rawResults[1])
}

// The gRPC call imports and callbacks: the SDK has neither (see grpc.go).

//go:wasmimport env proxy_grpc_call
func hostGRPCCall(service *byte, serviceSize uint32, svcName *byte, svcNameSize uint32, method *byte, methodSize uint32,
	md *byte, mdSize uint32, msg *byte, msgSize uint32, timeoutMs uint32, token *uint32) uint32

//go:wasmimport env proxy_grpc_cancel
func hostGRPCCancel(token uint32) uint32

//go:wasmimport env proxy_grpc_close
func hostGRPCClose(token uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func hostGetBufferBytes(bt, start, size uint32, data unsafe.Pointer, dataSize *uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func hostGetHeaderMapPairs(mt uint32, data unsafe.Pointer, dataSize *uint32) uint32

//go:wasmimport env proxy_get_status
func hostGetStatus(code *uint32, msg unsafe.Pointer, msgSize *uint32) uint32

// ptr is the address of b's first byte, nil for an empty b (the host reads no bytes).
func ptr(b []byte) *byte {
	if len(b) == 0 {
		return nil
	}
	return &b[0]
}

func rawGRPCCall(service []byte, svcName, method string, md, msg []byte, timeoutMs uint32) (uint32, uint32) {
	var token uint32
	sn, mn := []byte(svcName), []byte(method)
	st := hostGRPCCall(ptr(service), uint32(len(service)), ptr(sn), uint32(len(sn)), ptr(mn), uint32(len(mn)),
		ptr(md), uint32(len(md)), ptr(msg), uint32(len(msg)), timeoutMs, &token)
	return token, st
}

func rawGRPCCancel(token uint32) uint32 { return hostGRPCCancel(token) }
func rawGRPCClose(token uint32) uint32  { return hostGRPCClose(token) }

// hostBytes copies what the host allocated in the guest (with the SDK's allocator) at
// address p.
func hostBytes(p *byte, n uint32) []byte {
	if p == nil || n == 0 {
		return nil
	}
	return append([]byte(nil), unsafe.Slice(p, n)...)
}

func rawGetBuffer(bt, start, size uint32) ([]byte, uint32) {
	var p *byte
	var n uint32
	st := hostGetBufferBytes(bt, start, size, unsafe.Pointer(&p), &n)
	return hostBytes(p, n), st
}

func rawGetMap(mt uint32) ([]byte, uint32) {
	var p *byte
	var n uint32
	st := hostGetHeaderMapPairs(mt, unsafe.Pointer(&p), &n)
	return hostBytes(p, n), st
}

func rawGetStatus() (uint32, string) {
	var code, n uint32
	var p *byte
	hostGetStatus(&code, unsafe.Pointer(&p), &n)
	return code, string(hostBytes(p, n))
}

//go:wasmexport proxy_on_grpc_receive_initial_metadata
func exportGRPCInitialMetadata(_, token, n uint32) { onGRPCInitialMetadata(token, n) }

//go:wasmexport proxy_on_grpc_receive
func exportGRPCReceive(_, token, size uint32) { onGRPCReceive(token, size) }

//go:wasmexport proxy_on_grpc_receive_trailing_metadata
func exportGRPCTrailingMetadata(_, token, n uint32) { onGRPCTrailingMetadata(token, n) }

//go:wasmexport proxy_on_grpc_close
func exportGRPCClose(_, token, code uint32) { onGRPCClose(token, code) }
