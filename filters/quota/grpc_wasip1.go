//go:build wasip1

package main

import (
	"time"
	"unsafe"
)

// The gRPC imports of proxy-wasm ABI 0.2.1 and the callbacks the SDK does not export.

//go:wasmimport env proxy_grpc_call
func hostGrpcCall(service *byte, serviceSize uint32, serviceName *byte, serviceNameSize uint32,
	method *byte, methodSize uint32, metadata *byte, metadataSize uint32,
	message *byte, messageSize uint32, timeoutMs uint32, calloutID *uint32) uint32

//go:wasmimport env proxy_grpc_cancel
func hostGrpcCancel(calloutID uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func hostGetBufferBytes(bufferType, start, maxSize uint32, data unsafe.Pointer, size *uint32) uint32

//go:wasmimport env proxy_get_status
func hostGetStatus(code *uint32, message unsafe.Pointer, size *uint32) uint32

// bufferGrpcReceive is BufferType GrpcReceiveBuffer.
const bufferGrpcReceive = 5

// rawGRPC calls the host's imports.
type rawGRPC struct{}

func (rawGRPC) call(target []byte, service, method string, message []byte, timeout time.Duration) (uint32, error) {
	var id uint32
	st := hostGrpcCall(unsafe.SliceData(target), uint32(len(target)),
		unsafe.StringData(service), uint32(len(service)),
		unsafe.StringData(method), uint32(len(method)),
		nil, 0,
		unsafe.SliceData(message), uint32(len(message)),
		uint32(timeout/time.Millisecond), &id)
	if st != 0 {
		return 0, errStatus(st)
	}
	return id, nil
}

func (rawGRPC) cancel(calloutID uint32) error {
	if st := hostGrpcCancel(calloutID); st != 0 {
		return errStatus(st)
	}
	return nil
}

func (rawGRPC) message(size uint32) ([]byte, error) {
	var data *byte
	var n uint32
	if st := hostGetBufferBytes(bufferGrpcReceive, 0, size, unsafe.Pointer(&data), &n); st != 0 {
		return nil, errStatus(st)
	}
	if data == nil {
		return nil, nil
	}
	// The host wrote into memory from proxy_on_memory_allocate, which nothing else holds.
	return unsafe.Slice(data, n), nil
}

func (rawGRPC) statusMessage() string {
	var code, n uint32
	var data *byte
	if hostGetStatus(&code, unsafe.Pointer(&data), &n) != 0 || data == nil {
		return ""
	}
	return string(unsafe.Slice(data, n))
}

//go:wasmexport proxy_on_grpc_receive
func proxyOnGrpcReceive(contextID, calloutID, messageSize uint32) {
	theVM.onGrpcReceive(calloutID, messageSize)
}

//go:wasmexport proxy_on_grpc_close
func proxyOnGrpcClose(contextID, calloutID, statusCode uint32) {
	theVM.onGrpcClose(calloutID, statusCode)
}

// Metadata is not used: the decision is in the message and the status.

//go:wasmexport proxy_on_grpc_receive_initial_metadata
func proxyOnGrpcReceiveInitialMetadata(contextID, calloutID, elements uint32) {}

//go:wasmexport proxy_on_grpc_receive_trailing_metadata
func proxyOnGrpcReceiveTrailingMetadata(contextID, calloutID, elements uint32) {}
