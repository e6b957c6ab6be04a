//go:build !wasip1

// Package emulator starts the proxy-wasm-go-sdk's proxytest host emulator for the filters'
// native unit tests, one at a time.
//
// The SDK's emulator is process-wide: NewHostEmulator blocks until the previous emulator is
// reset. A test that runs the client side and then the server side of a hop (or several
// configurations in a loop) must therefore end one emulator before starting the next, which
// Start does; the last one ends with the test.
package emulator

import (
	"sync"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
)

var (
	mu      sync.Mutex
	release func()
)

// Start ends the emulator a previous Start created, if it still runs, and starts a new one
// with opt, ended when t ends. Tests that use it must not run in parallel.
func Start(t testing.TB, opt *proxytest.EmulatorOption) proxytest.HostEmulator {
	t.Helper()
	mu.Lock()
	prev := release
	mu.Unlock()
	if prev != nil {
		prev()
	}
	host, reset := proxytest.NewHostEmulator(opt)
	var once sync.Once
	end := func() { once.Do(reset) }
	mu.Lock()
	release = end
	mu.Unlock()
	t.Cleanup(end)
	return host
}
