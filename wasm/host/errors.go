package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
	// Stderr is what the guest wrote to stderr (fd 2) during the failed callback, at most
	// its first 1 KiB and last 3 KiB: where Go and Rust guests print a panic's message and
	// stack before they trap, which the trap itself ("unreachable") does not tell.
	Stderr string
}

func (f *Failure) Error() string {
	return fmt.Sprintf("plugin %q instance %d: %s failed (%s): %s", f.Plugin, f.Instance, f.Callback, f.Kind, f.Reason())
}

// Reason is what went wrong: the runtime's error followed, when the guest wrote to stderr
// during the callback, by that output, one indented line per line.
func (f *Failure) Reason() string {
	var b strings.Builder
	fmt.Fprint(&b, f.Err)
	if out := strings.TrimRight(f.Stderr, "\n"); out != "" {
		b.WriteString("\nguest stderr:")
		for line := range strings.SplitSeq(out, "\n") {
			b.WriteString("\n")
			if line != "" {
				b.WriteString("\t" + line)
			}
		}
	}
	return b.String()
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
		Stderr   string      `json:"stderr,omitempty"`
	}{f.Kind, f.Plugin, f.Callback, f.Instance, msg, f.Stderr})
}

// CompileError is a module the runtime cannot load: not WebAssembly, or not a proxy-wasm
// module the host can run.
type CompileError struct {
	// Name names the module for people, such as the file it was read from; empty names it
	// by its digest, all the runtime knows of it.
	Name string
	// SHA256 is the hex digest of the module bytes.
	SHA256 string
	Err    error
}

func (e *CompileError) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("wasm module %s: %v", e.Name, e.Err)
	}
	return fmt.Sprintf("wasm module %.12s: %v", e.SHA256, e.Err)
}

func (e *CompileError) Unwrap() error { return e.Err }

// Named returns a copy of e named name, for an embedder that knows where the module came
// from (e is shared with every caller that compiled the same bytes at once).
func (e *CompileError) Named(name string) *CompileError {
	c := *e
	c.Name = name
	return &c
}

// procExit is the panic value the host's proc_exit raises to unwind the guest without
// letting wazero close the module (the module is replaced anyway, but start-up code that
// exits 0 — WASI commands — must be able to finish cleanly).
type procExit struct{ code uint32 }

func (e *procExit) Error() string { return fmt.Sprintf("guest called proc_exit(%d)", e.code) }
