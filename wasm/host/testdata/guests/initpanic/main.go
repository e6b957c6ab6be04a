// Command initpanic is a guest whose package initialisation panics, as a filter does when
// it cannot set itself up: the host must show the panic text Go's runtime writes to
// stderr.
package main

import "hostguests/abi"

func init() {
	panic("initpanic: cannot load the filter's settings")
}

func main() {}

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 { return abi.Alloc(size) }

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) uint32 { return 1 }
