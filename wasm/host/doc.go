// Package host is the host side of the proxy-wasm ABI (0.1.0, 0.2.0 and 0.2.1) on wazero:
// it loads any proxy-wasm module and runs it the way Envoy does, so that the mesh's filters
// behave the same in tests, in the stand-in proxy and in Envoy.
//
// A Runtime (one per process) compiles each distinct module once. A Plugin is one configured
// use of a module (Envoy's PluginConfig): it owns one VM instance per worker, each with its
// own root context, and hands out streams (HTTPStream, NetworkStream) that stay bound to one
// instance for their whole life. An instance runs one guest callback at a time; work that
// arrives while it is busy (HTTP call answers, ticks, queue notifications) is queued and
// delivered after the current callback returns, never re-entrantly.
//
// Faults are contained: a trap, a callback that overruns its deadline, a guest that exhausts
// its memory limit or exits fails only the stream it was serving (fail open or fail closed
// with Envoy's 503), is counted in the plugin's stats, and the broken instance is replaced by
// a fresh one. Shared data and shared queues live in the Runtime, keyed by vm_id as in Envoy,
// so they survive the replacement.
//
// A callback that overruns its deadline is stopped without help from wazero: on compile the
// host adds a stop flag and a check at every loop header to the module (see
// internal/interrupt), which also lets the Go scheduler preempt a long-running guest; only
// modules the check cannot be added to, and interpreter mode, use wazero's slower
// close-on-context-done.
//
// The embedder plugs in through Environment (clock, logger, HTTP call dispatcher,
// process-level properties such as node.*, foreign functions) and through the per-stream
// StreamInfo and Headers it passes to the stream callbacks.
package host
