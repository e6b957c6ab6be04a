package main

import (
	"errors"
	"time"
)

// grpcHost is the gRPC half of the proxy-wasm ABI, which the SDK does not wrap: the
// calls of grpc_wasip1.go on a proxy, a test's host natively.
type grpcHost interface {
	// call starts a unary call of service/method on target (a serialized
	// envoy.config.core.v3.GrpcService) with the serialized request message (unframed)
	// and returns its callout id.
	call(target []byte, service, method string, message []byte, timeout time.Duration) (uint32, error)
	// cancel drops the call: the host delivers no callback for it afterwards.
	cancel(calloutID uint32) error
	// message is the response message, readable during proxy_on_grpc_receive.
	message(size uint32) ([]byte, error)
	// statusMessage is the call's grpc-message, readable during proxy_on_grpc_close.
	statusMessage() string
}

// errStatus is a proxy-wasm status other than OK from a gRPC host call.
type errStatus uint32

func (e errStatus) Error() string {
	switch e {
	case 1:
		return "not found"
	case 2:
		return "bad argument"
	case 12:
		return "unimplemented"
	}
	return "status " + uitoa(uint32(e))
}

var errNoGRPC = errors.New("gRPC calls need a wasip1 build on a proxy-wasm host")

// The proxy_on_grpc_* callbacks, exported by grpc_wasip1.go, go to the VM context: the
// context id the host passes is the root context's (as for proxy_http_call), and callout
// ids are unique in the VM, so the call itself says which stream it was for.

// onGrpcReceive is proxy_on_grpc_receive: the response message of a unary call.
func (vm *vmContext) onGrpcReceive(calloutID, size uint32) {
	h, ok := vm.calls[calloutID]
	if !ok {
		return // cancelled, or answered already
	}
	delete(vm.calls, calloutID)
	msg, err := vm.host().message(size)
	h.answered(msg, err)
}

// onGrpcClose is proxy_on_grpc_close: the end of a call. After a received message it
// changes nothing; without one, it is the failure that ends the call.
func (vm *vmContext) onGrpcClose(calloutID, code uint32) {
	h, ok := vm.calls[calloutID]
	if !ok {
		return
	}
	delete(vm.calls, calloutID)
	h.closed(code, vm.host().statusMessage())
}

// host is the gRPC host: the test's, or the proxy's.
func (vm *vmContext) host() grpcHost {
	if vm.grpc != nil {
		return vm.grpc
	}
	return rawGRPC{}
}
