//go:build !unix && !wasip1

package wasmtest

// cpuTime is not measured here.
func cpuTime() int64 { return 0 }
