package host

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Errors the embedder can test for with errors.Is.
var (
	// ErrClosed is returned when a Plugin or Runtime is used after Close.
	ErrClosed = errors.New("wasm host: closed")
	// ErrUnknownCluster is returned by an HTTPCallDispatcher for an upstream it does not
	// know; the guest sees BadArgument, as in Envoy.
	ErrUnknownCluster = errors.New("wasm host: unknown cluster")
	// ErrHTTPCallTimeout is what a timed-out HTTP call fails with.
	ErrHTTPCallTimeout = errors.New("wasm host: http call timed out")
	// ErrUnavailable means no healthy VM instance could be provided for a stream.
	ErrUnavailable = errors.New("wasm host: plugin has no healthy instance")
)

// FailureKind classifies why a guest failed.
type FailureKind string

// Failure kinds.
const (
	// FailureTrap is a wasm trap (unreachable, out-of-bounds access, ...) or a panic the
	// runtime recovered while the guest was running.
	FailureTrap FailureKind = "trap"
	// FailureTimeout is a callback that overran PluginConfig.CallbackTimeout.
	FailureTimeout FailureKind = "timeout"
	// FailureMemory is a guest that hit PluginConfig.MemoryLimit.
	FailureMemory FailureKind = "memory"
	// FailureExit is a guest that called proc_exit (Go and TinyGo runtimes do this when
	// they panic or throw).
	FailureExit FailureKind = "exit"
	// FailureBadReturn is a start-up callback that returned false.
	FailureBadReturn FailureKind = "bad_return"
	// FailureUnavailable is a stream that found no healthy instance (its VM could not be
	// restarted).
	FailureUnavailable FailureKind = "unavailable"
)

// Failure describes one guest failure. It is an error.
type Failure struct {
	Kind FailureKind
	// Plugin is the plugin name.
	Plugin string
	// Callback is the export that was running (e.g. "proxy_on_request_headers").
	Callback string
	// Instance is the worker index of the failed instance.
	Instance int
	// Err is the underlying error from the runtime.
	Err error
}

func (f *Failure) Error() string {
	return fmt.Sprintf("plugin %q instance %d: %s failed (%s): %v", f.Plugin, f.Instance, f.Callback, f.Kind, f.Err)
}

func (f *Failure) Unwrap() error { return f.Err }

// MarshalJSON renders the failure with its error text.
func (f *Failure) MarshalJSON() ([]byte, error) {
	msg := ""
	if f.Err != nil {
		msg = f.Err.Error()
	}
	return json.Marshal(struct {
		Kind     FailureKind `json:"kind"`
		Plugin   string      `json:"plugin"`
		Callback string      `json:"callback"`
		Instance int         `json:"instance"`
		Error    string      `json:"error"`
	}{f.Kind, f.Plugin, f.Callback, f.Instance, msg})
}

// procExit is the panic value the host's proc_exit raises to unwind the guest without
// letting wazero close the module (the module is replaced anyway, but start-up code that
// exits 0 — WASI commands — must be able to finish cleanly).
type procExit struct{ code uint32 }

func (e *procExit) Error() string { return fmt.Sprintf("guest called proc_exit(%d)", e.code) }
