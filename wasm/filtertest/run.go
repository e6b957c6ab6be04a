package filtertest

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/wasmesh/wasmesh/wasm/harness"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// Result is the outcome of one scenario.
type Result struct {
	// Scenario names the file (or "scenario" when parsed from bytes).
	Scenario string
	// Err is set when the scenario could not run at all (unreadable module, a plugin that
	// failed to start unexpectedly, ...).
	Err error
	// Start is the start-error check of a scenario with plugin.expectStartError.
	Start *CaseResult
	Cases []CaseResult
}

// CaseResult is the outcome of one case.
type CaseResult struct {
	Name string
	// Problems lists every expectation that did not hold; empty means the case passed.
	Problems []string
	// Report is what the harness observed (nil for the start check).
	Report *harness.Report
}

// Passed reports whether the case met every expectation.
func (c CaseResult) Passed() bool { return len(c.Problems) == 0 }

// Passed reports whether the scenario ran and every case passed.
func (r *Result) Passed() bool {
	if r.Err != nil || (r.Start != nil && !r.Start.Passed()) {
		return false
	}
	for _, c := range r.Cases {
		if !c.Passed() {
			return false
		}
	}
	return true
}

// RunFile loads and runs the scenario at path on rt (nil: a private runtime).
func RunFile(ctx context.Context, rt *host.Runtime, path string) *Result {
	s, err := load(path)
	if err != nil {
		return &Result{Scenario: path, Err: err}
	}
	r := Run(ctx, rt, s)
	r.Scenario = path
	return r
}

// Run runs the scenario's cases in order on one plugin, on rt (nil: a private runtime).
func Run(ctx context.Context, rt *host.Runtime, s *Scenario) *Result {
	res := &Result{Scenario: "scenario"}
	wasm, err := os.ReadFile(s.WasmPath())
	if err != nil {
		res.Err = fmt.Errorf("wasm: %w", err)
		return res
	}
	h, err := harness.New(ctx, s.options(wasm, rt))
	if want := s.Plugin.ExpectStartError; want != "" {
		res.Start = &CaseResult{Name: "plugin refuses to start"}
		switch {
		case err == nil:
			_ = h.Close(ctx)
			res.Start.Problems = []string{fmt.Sprintf("plugin started; want a start error containing %q", want)}
		case !strings.Contains(err.Error(), want):
			res.Start.Problems = []string{fmt.Sprintf("start error %q does not contain %q", err, want)}
		}
		return res
	}
	if err != nil {
		res.Err = err
		return res
	}
	defer func() { _ = h.Close(ctx) }()
	for _, c := range s.Cases {
		if c.Advance > 0 {
			h.Advance(time.Duration(c.Advance))
		}
		cr := CaseResult{Name: c.Name}
		rep, err := h.Do(ctx, c.request())
		if err != nil {
			cr.Problems = []string{err.Error()}
		} else {
			cr.Report = rep
			if cr.Problems = c.Expect.check(rep); len(cr.Problems) > 0 {
				// The filter's own failure is the likely cause of the mismatches (a 503, a
				// missing header): say so first, without the -v details.
				cr.Problems = append(failures(rep.Failures), cr.Problems...)
			}
		}
		res.Cases = append(res.Cases, cr)
	}
	return res
}

func (s *Scenario) options(wasm []byte, rt *host.Runtime) harness.Options {
	p := s.Plugin
	opts := harness.Options{
		Wasm:     wasm,
		WasmName: s.WasmPath(),
		Runtime:  rt,
		Plugin: host.PluginConfig{Name: p.Name, RootID: p.RootID, VMID: p.VMID,
			Configuration: configBytes(p.Configuration), VMConfig: configBytes(p.VMConfiguration),
			FailOpen: p.FailOpen, Instances: p.Instances,
			CallbackTimeout: time.Duration(p.CallbackTimeout), MemoryLimit: p.MemoryLimitBytes},
		Properties: s.Properties,
	}
	if len(s.HTTPCalls) > 0 {
		answers := make(map[string]harness.HTTPCallAnswer, len(s.HTTPCalls))
		for cluster, a := range s.HTTPCalls {
			answers[cluster] = a.answer()
		}
		opts.HTTPCalls = harness.ByCluster(answers)
	}
	if len(s.GRPCCalls) > 0 {
		answers := make(map[string]harness.GRPCCallAnswer, len(s.GRPCCalls))
		for cluster, a := range s.GRPCCalls {
			answers[cluster] = a.answer()
		}
		opts.GRPCCalls = harness.GRPCByCluster(answers)
	}
	return opts
}

func (a GRPCAnswer) answer() harness.GRPCCallAnswer {
	out := harness.GRPCCallAnswer{Delay: time.Duration(a.Delay), Fail: a.Fail}
	if a.NoAnswer || a.Fail {
		return out
	}
	msg := []byte(a.Message)
	if a.MessageBase64 != "" {
		msg, _ = base64.StdEncoding.DecodeString(a.MessageBase64) // checked by validate
	}
	out.Response = &host.GRPCCallResponse{Message: msg, Status: a.Status, StatusMessage: a.StatusMessage,
		InitialMetadata: pairs(a.InitialMetadata), TrailingMetadata: pairs(a.TrailingMetadata)}
	return out
}

func (a CallAnswer) answer() harness.HTTPCallAnswer {
	out := harness.HTTPCallAnswer{Delay: time.Duration(a.Delay), Fail: a.Fail}
	if a.NoAnswer || a.Fail {
		return out
	}
	status := a.Status
	if status == 0 {
		status = 200
	}
	out.Response = &host.HTTPCallResponse{
		Headers:  append([][2]string{{":status", strconv.Itoa(status)}}, pairs(a.Headers)...),
		Body:     []byte(a.Body),
		Trailers: pairs(a.Trailers),
	}
	return out
}

func (c Case) request() harness.Request {
	r := c.Request
	req := harness.Request{
		Method: r.Method, Path: r.Path, Authority: r.Authority, Scheme: r.Scheme,
		Headers: pairs(r.Headers), Body: chunks(r.Body), Trailers: pairs(r.Trailers),
		Info: host.StreamInfo{Protocol: r.Protocol,
			Source: host.Address(r.Source), Destination: host.Address(r.Destination)},
		Response: harness.Response{Status: c.Upstream.Status, Headers: pairs(c.Upstream.Headers),
			Body: chunks(c.Upstream.Body), Trailers: pairs(c.Upstream.Trailers)},
	}
	if c.Worker != nil {
		req.Worker, req.PinWorker = *c.Worker, true
	}
	return req
}

// check compares the report with the expectations, one problem per mismatch.
func (e Expect) check(rep *harness.Report) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if e.Status != 0 && rep.Status != e.Status {
		bad("status: got %d, want %d", rep.Status, e.Status)
	}
	if e.LocalResponse != nil && (rep.LocalResponse != nil) != *e.LocalResponse {
		bad("localResponse: got %t, want %t", rep.LocalResponse != nil, *e.LocalResponse)
	}
	if e.Failed != nil && (len(rep.Failures) > 0) != *e.Failed {
		bad("failed: got %t (%d failure(s)), want %t", len(rep.Failures) > 0, len(rep.Failures), *e.Failed)
	}
	if len(e.RequestHeaders) > 0 {
		if rep.Upstream == nil {
			bad("requestHeaders: the request never reached the upstream")
		} else {
			checkHeaders("requestHeaders", e.RequestHeaders, rep.Upstream.Lookup, bad)
		}
	}
	checkHeaders("responseHeaders", e.ResponseHeaders, rep.Client.Lookup, bad)
	if e.Body != nil && string(rep.Client.Body) != *e.Body {
		bad("body: got %q, want %q", rep.Client.Body, *e.Body)
	}
	for _, name := range slices.Sorted(maps.Keys(e.Metrics)) {
		m, ok := rep.Metric(name)
		if !ok {
			bad("metrics[%s]: not defined by the filter (it defines: %s)", name, definedMetrics(rep.Metrics))
			continue
		}
		got := m.Value
		if m.Type == host.MetricHistogram {
			got = int64(m.Count)
		}
		if got != e.Metrics[name] {
			bad("metrics[%s]: got %d, want %d", name, got, e.Metrics[name])
		}
	}
	for _, want := range e.Logs {
		found := false
		for _, l := range rep.Logs {
			if strings.Contains(l.Message, want) {
				found = true
				break
			}
		}
		if !found {
			bad("logs: no line contains %q", want)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(e.SharedData)) {
		got, ok := rep.SharedData[key]
		switch {
		case !ok:
			bad("sharedData[%s]: absent, want %q", key, e.SharedData[key])
		case string(got) != e.SharedData[key]:
			bad("sharedData[%s]: got %q, want %q", key, got, e.SharedData[key])
		}
	}
	return out
}

// failures describes how the filter failed during a case: what it did, in which callback,
// the runtime's error and what the guest wrote to stderr.
func failures(fs []*host.Failure) []string {
	out := make([]string, 0, len(fs))
	for _, f := range fs {
		where := ""
		if f.Callback != "" {
			where = " in " + f.Callback
		}
		out = append(out, fmt.Sprintf("the filter %s%s (instance %d): %s", failureVerb(f.Kind), where, f.Instance, f.Reason()))
	}
	return out
}

func failureVerb(k host.FailureKind) string {
	switch k {
	case host.FailureTrap:
		return "trapped"
	case host.FailureTimeout:
		return "ran past its callback timeout"
	case host.FailureMemory:
		return "hit its memory limit"
	case host.FailureExit:
		return "exited"
	case host.FailureBadReturn:
		return "returned false"
	case host.FailureUnavailable:
		return "had no healthy instance"
	}
	return "failed (" + string(k) + ")"
}

func checkHeaders(field string, want map[string]*string, lookup func(string) (string, bool), bad func(string, ...any)) {
	for _, name := range slices.Sorted(maps.Keys(want)) {
		got, ok := lookup(name)
		switch w := want[name]; {
		case w == nil && ok:
			bad("%s[%s]: got %q, want it absent", field, name, got)
		case w != nil && !ok:
			bad("%s[%s]: absent, want %q", field, name, *w)
		case w != nil && got != *w:
			bad("%s[%s]: got %q, want %q", field, name, got, *w)
		}
	}
}

// Write prints the result: a line per case, the problems of failed ones (which include the
// filter's failures), and with verbose the log lines of every case and the failures of
// passed ones.
func (r *Result) Write(w io.Writer, verbose bool) {
	if r.Err != nil {
		fmt.Fprintf(w, "ERROR %s: %s\n", r.Scenario, indent(r.Err.Error(), "    "))
		return
	}
	cases := r.Cases
	if r.Start != nil {
		cases = []CaseResult{*r.Start}
	}
	passed := 0
	for _, c := range cases {
		verdict := "PASS"
		if c.Passed() {
			passed++
		} else {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "%s %s: %s\n", verdict, r.Scenario, c.Name)
		for _, p := range c.Problems {
			fmt.Fprintf(w, "    %s\n", indent(p, "        "))
		}
		if verbose && c.Report != nil {
			for _, l := range c.Report.Logs {
				fmt.Fprintf(w, "    log %s: %s\n", l.Level, l.Message)
			}
			if c.Passed() {
				for _, f := range c.Report.Failures {
					fmt.Fprintf(w, "    failure: %s\n", indent(f.Error(), "        "))
				}
			}
		}
	}
	fmt.Fprintf(w, "%s: %d of %d passed\n", r.Scenario, passed, len(cases))
}

// indent puts the continuation lines of a multi-line message (a wasm stack trace, the
// guest's stderr) under the line that starts it, each prefixed with by.
func indent(msg, by string) string {
	var b strings.Builder
	for i, line := range strings.Split(msg, "\n") {
		if i > 0 {
			b.WriteByte('\n')
			if line != "" {
				b.WriteString(by)
			}
		}
		b.WriteString(line)
	}
	return b.String()
}

func pairs(m map[string]string) [][2]string {
	out := make([][2]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, [2]string{k, m[k]})
	}
	return out
}

func chunks(s []string) [][]byte {
	out := make([][]byte, 0, len(s))
	for _, c := range s {
		out = append(out, []byte(c))
	}
	return out
}

// definedMetrics lists the metric names a report holds, for an expectation that names
// none of them: tagged names are long, and the list shows the exact spelling.
func definedMetrics(ms []host.MetricSnapshot) string {
	if len(ms) == 0 {
		return "none"
	}
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
