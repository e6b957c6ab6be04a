//go:build wasip1

package main

//go:wasmimport env proxy_get_property
func hostGetProperty(path *byte, pathSize uint32, returnData, returnSize *uint32) uint32

var (
	rawPath    = []byte("request\x00path")
	rawResults = new([2]uint32)
)

func rawProperty() {
	hostGetProperty(&rawPath[0], uint32(len(rawPath)), &rawResults[0], &rawResults[1])
}
