// Package harness drives a proxy-wasm module through whole HTTP request lifecycles offline,
// in virtual time, and reports what the filter did: actions per phase, header changes as the
// upstream and the client see them, local replies, metrics, logs, shared data and failures.
// It serves Go tests and command-line tools alike; nothing in it needs a testing.TB except
// the NewT convenience.
package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/wasmesh/wasmesh/wasm/host"
)

// DefaultStart is where the harness clock starts unless Options.Start says otherwise.
var DefaultStart = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// DefaultMaxWait bounds how far Do advances virtual time while a stream is paused: Envoy's
// default stream idle timeout.
const DefaultMaxWait = 5 * time.Minute

// Options configure a Harness.
type Options struct {
	// Wasm is the module to load.
	Wasm []byte
	// WasmName names the module in errors, such as the file it was read from; empty names
	// it by its digest.
	WasmName string
	// Runtime, if set, is used (and not closed) instead of a private one, so several
	// harnesses can share compiled modules, shared data and queues.
	Runtime *host.Runtime
	// Plugin configures the plugin; Instances > 1 runs several VMs (workers).
	Plugin host.PluginConfig
	// Properties are process-level attributes such as "node" (see host.Node).
	Properties map[string]any
	// Start is the initial virtual time; zero means DefaultStart.
	Start time.Time
	// HTTPCalls answers the guest's HTTP calls; nil makes every cluster unknown.
	HTTPCalls HTTPCallHandler
	// GRPCCalls answers the guest's gRPC calls; nil makes every cluster unknown.
	GRPCCalls GRPCCallHandler
	// ForeignFunctions are offered to the guest.
	ForeignFunctions map[string]host.ForeignFunction
	// Logger, if set, also receives the plugin's logs.
	Logger *slog.Logger
	// BufferLimit is how much body the filter may hold per direction before the request
	// gets Envoy's 413 (or the response its 500, or a reset), as Envoy's
	// per_connection_buffer_limit_bytes; 0 means no limit.
	BufferLimit int
}

// HTTPCallHandler decides how the "upstream" of an HTTP call answers.
type HTTPCallHandler func(req *host.HTTPCallRequest) HTTPCallAnswer

// HTTPCallAnswer is how an HTTP call ends.
type HTTPCallAnswer struct {
	// Response is delivered after Delay of virtual time (0: right after the current
	// callback). Nil with Fail unset means the call is never answered, so it ends only by
	// timing out.
	Response *host.HTTPCallResponse
	Delay    time.Duration
	// Fail delivers a failed call (a reset) after Delay.
	Fail bool
	// UnknownCluster rejects the call at dispatch (the guest sees BadArgument).
	UnknownCluster bool
}

// Respond is an answer with status, headers and body.
func Respond(status int, headers [][2]string, body string) HTTPCallAnswer {
	h := append([][2]string{{":status", strconv.Itoa(status)}}, headers...)
	return HTTPCallAnswer{Response: &host.HTTPCallResponse{Headers: h, Body: []byte(body)}}
}

// NoAnswer is a call that never completes by itself.
func NoAnswer() HTTPCallAnswer { return HTTPCallAnswer{} }

// ByCluster answers with a fixed answer per cluster; other clusters are unknown.
func ByCluster(answers map[string]HTTPCallAnswer) HTTPCallHandler {
	return func(req *host.HTTPCallRequest) HTTPCallAnswer {
		a, ok := answers[req.Cluster]
		if !ok {
			return HTTPCallAnswer{UnknownCluster: true}
		}
		return a
	}
}

// HTTPCallRecord is one HTTP call the guest made and how it ended.
type HTTPCallRecord = CallRecord[host.HTTPCallRequest, host.HTTPCallResponse]

// CallRecord is one HTTP or gRPC call the guest made and how it ended.
type CallRecord[Req, Resp any] struct {
	Request  Req   `json:"request"`
	Response *Resp `json:"response,omitempty"`
	// Err is set for a call that ended without an answer: a timeout
	// (host.ErrHTTPCallTimeout, host.ErrGRPCCallTimeout), a cancel by the guest
	// (host.ErrGRPCCallCancelled), host.ErrClosed, or the failure the answer asked for.
	Err error `json:"-"`
	// Pending reports that the call has not ended.
	Pending bool `json:"pending,omitempty"`

	ctx context.Context
}

// MarshalJSON includes the error text.
func (c CallRecord[Req, Resp]) MarshalJSON() ([]byte, error) {
	type plain CallRecord[Req, Resp]
	msg := ""
	if c.Err != nil {
		msg = c.Err.Error()
	}
	return json.Marshal(struct {
		plain
		Error string `json:"error,omitempty"`
	}{plain(c), msg})
}

// settle records how the host ended a call the upstream never answered (its context is
// cancelled with the reason, e.g. host.ErrHTTPCallTimeout). Called with h.mu held.
func (c *CallRecord[Req, Resp]) settle() {
	if c.Pending && c.ctx.Err() != nil {
		c.Pending = false
		c.Err = context.Cause(c.ctx)
	}
}

// end records the answer, unless the host ended the call first.
func (c *CallRecord[Req, Resp]) end(h *Harness, resp *Resp, err error) {
	h.mu.Lock()
	c.settle()
	if c.Pending {
		c.Pending, c.Response, c.Err = false, resp, err
	}
	h.mu.Unlock()
}

// settled copies records, settled, for a report. Called with h.mu held.
func settled[Req, Resp any](recs []*CallRecord[Req, Resp]) []CallRecord[Req, Resp] {
	var out []CallRecord[Req, Resp]
	for _, c := range recs {
		c.settle()
		out = append(out, *c)
	}
	return out
}

// schedule runs deliver after delay of virtual time (at once for 0), or never when the
// call has no answer.
func (h *Harness) schedule(answered bool, delay time.Duration, deliver func()) {
	switch {
	case !answered:
	case delay > 0:
		h.clock.AfterFunc(delay, deliver)
	default:
		deliver()
	}
}

// LogEntry is one log record of the plugin.
type LogEntry struct {
	Level host.LogLevel `json:"level"`
	// Source is "proxy_log", "stdout", "stderr" (from the guest) or "host".
	Source   string `json:"source"`
	Message  string `json:"message"`
	Instance int    `json:"instance"`
}

// Harness is a loaded plugin with a virtual clock, an HTTP and gRPC call "upstream" and a
// log and call recorder. Safe for concurrent use; Do calls on different workers run in parallel,
// although their reports' logs and calls then interleave.
type Harness struct {
	opts   Options
	rt     *host.Runtime
	ownRT  bool
	plugin *host.Plugin
	clock  *host.ManualClock

	mu        sync.Mutex
	logs      []LogEntry
	calls     []*HTTPCallRecord
	grpcCalls []*GRPCCallRecord
}

// New loads opts.Wasm and starts the plugin.
func New(ctx context.Context, opts Options) (*Harness, error) {
	start := opts.Start
	if start.IsZero() {
		start = DefaultStart
	}
	h := &Harness{opts: opts, clock: host.NewManualClock(start), rt: opts.Runtime}
	if h.rt == nil {
		rt, err := host.NewRuntime(ctx, host.RuntimeConfig{Logger: slog.New(slog.DiscardHandler),
			CompilationCache: sharedCache()})
		if err != nil {
			return nil, fmt.Errorf("harness: %w", err)
		}
		h.rt, h.ownRT = rt, true
	}
	mod, err := h.rt.Compile(ctx, opts.Wasm)
	if err != nil {
		h.closeRuntime(ctx)
		if ce := (*host.CompileError)(nil); opts.WasmName != "" && errors.As(err, &ce) {
			err = ce.Named(opts.WasmName)
		}
		return nil, fmt.Errorf("harness: %w", err)
	}
	cfg := opts.Plugin
	if cfg.Name == "" {
		cfg.Name = "plugin"
	}
	var handler slog.Handler = &recorder{h: h}
	if opts.Logger != nil {
		handler = fanout{handler, opts.Logger.Handler()}
	}
	env := host.Environment{
		Clock:            h.clock,
		Logger:           slog.New(handler),
		HTTPCalls:        host.HTTPCallDispatcherFunc(h.dispatch),
		GRPCCalls:        host.GRPCCallDispatcherFunc(h.dispatchGRPC),
		Properties:       opts.Properties,
		ForeignFunctions: opts.ForeignFunctions,
	}
	p, err := h.rt.NewPlugin(ctx, mod, cfg, env)
	if err != nil {
		h.closeRuntime(ctx)
		return nil, fmt.Errorf("harness: %w", err)
	}
	h.plugin = p
	return h, nil
}

// sharedCache is the machine code cache of the harnesses' private runtimes, so a process
// compiles each module once however many harnesses load it.
var sharedCache = sync.OnceValue(wazero.NewCompilationCache)

// NewT is New for tests: it fails tb on error and closes the harness when the test ends.
func NewT(tb testing.TB, opts Options) *Harness {
	tb.Helper()
	h, err := New(context.Background(), opts)
	if err != nil {
		tb.Fatalf("harness: %v", err)
	}
	tb.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

// Close stops the plugin (and the runtime, if the harness created it).
func (h *Harness) Close(ctx context.Context) error {
	err := h.plugin.Close(ctx)
	h.closeRuntime(ctx)
	return err
}

func (h *Harness) closeRuntime(ctx context.Context) {
	if h.ownRT {
		_ = h.rt.Close(ctx)
	}
}

// Plugin is the loaded plugin.
func (h *Harness) Plugin() *host.Plugin { return h.plugin }

// Runtime is the runtime the plugin runs in.
func (h *Harness) Runtime() *host.Runtime { return h.rt }

// Clock is the virtual clock.
func (h *Harness) Clock() *host.ManualClock { return h.clock }

// Advance moves virtual time forward, firing ticks and HTTP call answers and timeouts that
// fall due, in order.
func (h *Harness) Advance(d time.Duration) { h.clock.Advance(d) }

// Logs returns every log entry so far.
func (h *Harness) Logs() []LogEntry {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]LogEntry(nil), h.logs...)
}

// HTTPCalls returns every HTTP call so far.
func (h *Harness) HTTPCalls() []HTTPCallRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return settled(h.calls)
}

// Metrics returns every metric of the plugin.
func (h *Harness) Metrics() []host.MetricSnapshot { return h.plugin.Metrics().Snapshot() }

// Metric returns the metric called name, whatever its type.
func (h *Harness) Metric(name string) (host.MetricSnapshot, bool) {
	for _, m := range h.Metrics() {
		if m.Name == name {
			return m, true
		}
	}
	return host.MetricSnapshot{}, false
}

// SharedData returns the shared data of the plugin's vm_id.
func (h *Harness) SharedData() map[string][]byte {
	out := map[string][]byte{}
	for k, v := range h.plugin.SharedData() {
		out[k] = v.Value
	}
	return out
}

// Stats returns the plugin's failure and instance counters.
func (h *Harness) Stats() host.PluginStats { return h.plugin.Stats() }

func (h *Harness) dispatch(ctx context.Context, req *host.HTTPCallRequest, done func(*host.HTTPCallResponse, error)) error {
	rec := &HTTPCallRecord{Request: *req, Pending: true, ctx: ctx}
	var ans HTTPCallAnswer
	if h.opts.HTTPCalls == nil {
		ans.UnknownCluster = true
	} else {
		ans = h.opts.HTTPCalls(req)
	}
	if ans.UnknownCluster {
		return host.ErrUnknownCluster
	}
	h.mu.Lock()
	h.calls = append(h.calls, rec)
	h.mu.Unlock()
	h.schedule(ans.Response != nil || ans.Fail, ans.Delay, func() {
		resp, err := ans.Response, error(nil)
		if ans.Fail {
			resp, err = nil, errors.New("harness: http call reset")
		}
		rec.end(h, resp, err)
		done(resp, err)
	})
	return nil
}

// recorder keeps the plugin's log records.
type recorder struct {
	h     *Harness
	attrs []slog.Attr
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	e := LogEntry{Level: host.LogLevelFromSlog(rec.Level), Source: "host", Message: rec.Message}
	visit := func(a slog.Attr) bool {
		switch a.Key {
		case "source":
			e.Source = a.Value.String()
		case "instance":
			e.Instance = int(a.Value.Int64())
		}
		return true
	}
	for _, a := range r.attrs {
		visit(a)
	}
	rec.Attrs(visit)
	r.h.mu.Lock()
	r.h.logs = append(r.h.logs, e)
	r.h.mu.Unlock()
	return nil
}

func (r *recorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &recorder{h: r.h, attrs: append(append([]slog.Attr(nil), r.attrs...), attrs...)}
}

func (r *recorder) WithGroup(string) slog.Handler { return r }

type fanout []slog.Handler

func (f fanout) Enabled(ctx context.Context, l slog.Level) bool {
	for _, h := range f {
		if h.Enabled(ctx, l) {
			return true
		}
	}
	return false
}

func (f fanout) Handle(ctx context.Context, r slog.Record) error {
	var errs []error
	for _, h := range f {
		if h.Enabled(ctx, r.Level) {
			errs = append(errs, h.Handle(ctx, r.Clone()))
		}
	}
	return errors.Join(errs...)
}

func (f fanout) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := make(fanout, len(f))
	for i, h := range f {
		out[i] = h.WithAttrs(attrs)
	}
	return out
}

func (f fanout) WithGroup(name string) slog.Handler {
	out := make(fanout, len(f))
	for i, h := range f {
		out[i] = h.WithGroup(name)
	}
	return out
}

// headerValue returns the first value of name in pairs (case-insensitive).
func headerValue(pairs [][2]string, name string) (string, bool) {
	for _, p := range pairs {
		if strings.EqualFold(p[0], name) {
			return p[1], true
		}
	}
	return "", false
}
