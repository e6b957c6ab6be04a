//go:build !wasip1

package main

// rawProperty calls the host's import directly, which exists only in a wasip1 build; the
// native build (the tests' package) never runs the loop ops.
func rawProperty() { panic("sdkguest: loop-raw-property runs only in a wasip1 build") }
