//go:build !wasip1

package main

// rawProperty calls the host's import directly, which exists only in a wasip1 build; the
// native build (the tests' package) never runs the loop ops.
func rawProperty() { panic("sdkguest: loop-raw-property runs only in a wasip1 build") }

// The gRPC imports exist only in a wasip1 build; the native build never calls them.

func rawGRPCCall([]byte, string, string, []byte, []byte, uint32) (uint32, uint32) {
	panic("sdkguest: gRPC calls run only in a wasip1 build")
}
func rawGRPCCancel(uint32) uint32 { panic("sdkguest: gRPC calls run only in a wasip1 build") }
func rawGRPCClose(uint32) uint32  { panic("sdkguest: gRPC calls run only in a wasip1 build") }
func rawGetBuffer(uint32, uint32, uint32) ([]byte, uint32) {
	panic("sdkguest: raw buffer reads run only in a wasip1 build")
}
func rawGetMap(uint32) ([]byte, uint32) { panic("sdkguest: raw map reads run only in a wasip1 build") }
func rawGetStatus() (uint32, string)    { panic("sdkguest: raw status reads run only in a wasip1 build") }
