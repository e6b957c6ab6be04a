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
// # gRPC calls
//
// proxy_grpc_call makes a unary call through Environment.GRPCCalls. The service argument is
// a serialized envoy.config.core.v3.GrpcService (envoy_grpc.cluster_name and authority and
// initial_metadata are used; google_grpc is refused with BadArgument) or, when it does not
// parse as one, a plain cluster name, as in Envoy; bytes that happen to parse but name no
// cluster are taken as a plain name too (Envoy would try an empty cluster). The message is
// passed without gRPC framing; the dispatcher frames it. Call ids are odd (Envoy's stream
// ids are even) and separate from HTTP call tokens. An unknown cluster is BadArgument, as
// for proxy_http_call here (Envoy answers ParseFailure for an unknown plain name), so a
// guest should take any status but Ok as a call that was not made.
//
// The answer is delivered to the root context (context_id is the root context id, as
// proxy-wasm-cpp-host's exports.cc makes the root context own every call, like
// proxy_http_call); the guest makes its stream effective with proxy_set_effective_context
// before continuing or answering it. As Envoy does for a unary call (its async request's
// onSuccess and onFailure), a call that succeeded (grpc-status 0) gets
// proxy_on_grpc_receive(root, id, message_size) alone, and a failed one
// proxy_on_grpc_close(root, id, code) alone; the metadata callbacks belong to streams. (The
// C++ SDK's GrpcCallHandler, for one, takes a close after a receive for a failure.)
//
// During either callback the response's metadata maps (GrpcReceiveInitialMetadata 4,
// GrpcReceiveTrailingMetadata 5) are readable (not writable; a wasmesh extension), the message is the
// GrpcReceiveBuffer (5) during proxy_on_grpc_receive only (as in Envoy), and
// proxy_get_status returns the grpc-status and grpc-message. The host times a call out
// with its Clock: DEADLINE_EXCEEDED (4), message "timeout". A dispatcher that fails
// without an answer (no healthy host, connect failure) gives UNAVAILABLE (14) with its
// error's text. proxy_grpc_cancel and proxy_grpc_close (the same for a unary call, as in
// Envoy) end a pending call: no callback follows, the dispatcher's context is cancelled
// with ErrGRPCCallCancelled; an unknown id is NotFound. The id stays known until
// its callback returns, as in Envoy. Closing the plugin or losing the
// VM cancels pending calls (cause ErrClosed) without callbacks. Streaming calls
// (proxy_grpc_stream, proxy_grpc_send) return Unimplemented.
//
// The embedder plugs in through Environment (clock, logger, HTTP and gRPC call dispatchers,
// process-level properties such as node.*, foreign functions) and through the per-stream
// StreamInfo and Headers it passes to the stream callbacks.
package host
