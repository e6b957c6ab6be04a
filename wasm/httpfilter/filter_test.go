package httpfilter

import (
	"context"
	"maps"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/wasmesh/wasmesh/wasm/host"
)

// semanticsCase drives a filter over a scripted guest (limit is the buffer limit) and
// compares the transcript: every callback the guest got (with the body it saw) and what it
// returned, then every event with its verdict, what each direction let go on, and whether
// the event's direction is held (full: the filter takes no more of it).
type semanticsCase struct {
	name   string
	limit  int
	script map[Phase][]host.Result
	events []event
	want   []string
}

// semanticsCases are the decisions of Envoy's HTTP filter stream semantics, one a case.
var semanticsCases = []semanticsCase{{
	name:   "Continue lets each part go on as it comes",
	events: []event{headers(req, false), data(req, "ab", false), data(req, "cd", true), headers(resp, true)},
	want: []string{
		"guest request_headers -> continue",
		"headers request: request headers",
		`guest request_body "ab" -> continue`,
		`data request "ab": request "ab"`,
		`guest request_body "cd" eos -> continue`,
		`data request "cd" eos: request "cd" end`,
		"guest response_headers eos -> continue",
		"headers response eos: response headers end",
	},
}, {
	name:   "StopIteration holds the headers alone: the body reaches the guest, whose Continue lets the headers go on with it",
	script: map[Phase][]host.Result{RequestHeaders: {stopHdr}, RequestBody: {buffer}},
	events: []event{headers(req, false), data(req, "ab", false), data(req, "cd", true)},
	want: []string{
		"guest request_headers -> stop(1)",
		"headers request: held",
		`guest request_body "ab" -> stop(1)`,
		`data request "ab": held`,
		`guest request_body "abcd" eos -> continue`,
		`data request "cd" eos: request headers "abcd" end`,
	},
}, {
	name:   "StopAllIteration keeps the body and trailers from the guest until it resumes the direction",
	script: map[Phase][]host.Result{RequestHeaders: {stopAllW}},
	events: []event{headers(req, false), data(req, "ab", false), data(req, "cd", false), trailers(req),
		signal(req, continueSig(req))},
	want: []string{
		"guest request_headers -> stop(4)",
		"headers request: held",
		`data request "ab": held`,
		`data request "cd": held`,
		"trailers request: held",
		`guest request_body "abcd" -> continue`,
		"guest request_trailers -> continue",
		`signal continue request: request headers "abcd" trailers end`,
	},
}, {
	name:   "a direction resumed after StopAllIteration can be stopped again by the body it then gets",
	script: map[Phase][]host.Result{RequestHeaders: {stopAll}, RequestBody: {buffer}},
	events: []event{headers(req, false), data(req, "ab", true), signal(req, continueSig(req)), signal(req, continueSig(req))},
	want: []string{
		"guest request_headers -> stop(3)",
		"headers request: held",
		`data request "ab" eos: held`,
		`guest request_body "ab" eos -> stop(1)`,
		"signal continue request: request headers; held",
		`signal continue request: request "ab" end`,
	},
}, {
	name:   "StopAllIterationAndBuffer: a body kept past the buffer limit gets the request a 413",
	limit:  4,
	script: map[Phase][]host.Result{RequestHeaders: {stopAll}},
	events: []event{headers(req, false), data(req, "abc", false), data(req, "de", true)},
	want: []string{
		"guest request_headers -> stop(3)",
		"headers request: held",
		`data request "abc": held`,
		`data request "de" eos: local reply 413`,
	},
}, {
	name:   "StopAllIterationAndWatermark: past the buffer limit the filter takes no more, without an error",
	limit:  4,
	script: map[Phase][]host.Result{RequestHeaders: {stopAllW}},
	events: []event{headers(req, false), data(req, "abcde", false), signal(req, continueSig(req))},
	want: []string{
		"guest request_headers -> stop(4)",
		"headers request: held",
		`data request "abcde": held, full`,
		`guest request_body "abcde" -> continue`,
		`signal continue request: request headers "abcde"`,
	},
}, {
	name:   "StopIterationAndBuffer: the guest sees what it holds with each chunk; past the limit the request gets a 413 before the guest sees the chunk",
	limit:  4,
	script: map[Phase][]host.Result{RequestBody: {buffer, buffer}},
	events: []event{headers(req, false), data(req, "ab", false), data(req, "cd", false), data(req, "e", true)},
	want: []string{
		"guest request_headers -> continue",
		"headers request: request headers",
		`guest request_body "ab" -> stop(1)`,
		`data request "ab": held`,
		`guest request_body "abcd" -> stop(1)`,
		`data request "cd": held`,
		`data request "e" eos: local reply 413`,
	},
}, {
	name:   "StopIterationAndWatermark holds the body past the limit without an error, taking no more until resumed",
	limit:  4,
	script: map[Phase][]host.Result{RequestBody: {mark}},
	events: []event{headers(req, false), data(req, "abcde", false), signal(req, continueSig(req)), data(req, "f", true)},
	want: []string{
		"guest request_headers -> continue",
		"headers request: request headers",
		`guest request_body "abcde" -> stop(2)`,
		`data request "abcde": held, full`,
		`signal continue request: request "abcde"`,
		`guest request_body "f" eos -> continue`,
		`data request "f" eos: request "f" end`,
	},
}, {
	name:   "a response body held past the limit after the response headers went on resets the stream",
	limit:  4,
	script: map[Phase][]host.Result{ResponseBody: {buffer}},
	events: []event{headers(req, true), headers(resp, false), data(resp, "abcde", true)},
	want: []string{
		"guest request_headers eos -> continue",
		"headers request eos: request headers end",
		"guest response_headers -> continue",
		"headers response: response headers",
		`guest response_body "abcde" eos -> stop(1)`,
		`data response "abcde" eos: reset response_payload_too_large; over`,
	},
}, {
	name:   "a response body held past the limit while the response headers are held gets a 500 instead",
	limit:  4,
	script: map[Phase][]host.Result{ResponseHeaders: {stopHdr}, ResponseBody: {buffer}},
	events: []event{headers(req, true), headers(resp, false), data(resp, "abcde", true)},
	want: []string{
		"guest request_headers eos -> continue",
		"headers request eos: request headers end",
		"guest response_headers -> stop(1)",
		"headers response: held",
		`guest response_body "abcde" eos -> stop(1)`,
		`data response "abcde" eos: direct reply 500; over`,
	},
}, {
	name:   "trailers that continue let the body the guest held go on with them",
	script: map[Phase][]host.Result{RequestBody: {buffer}},
	events: []event{headers(req, false), data(req, "ab", false), trailers(req)},
	want: []string{
		"guest request_headers -> continue",
		"headers request: request headers",
		`guest request_body "ab" -> stop(1)`,
		`data request "ab": held`,
		"guest request_trailers -> continue",
		`trailers request: request "ab" trailers end`,
	},
}, {
	name:   "trailers that stop hold the direction until the guest resumes it",
	script: map[Phase][]host.Result{RequestTrailers: {stopTrl}},
	events: []event{headers(req, false), trailers(req), signal(req, continueSig(req))},
	want: []string{
		"guest request_headers -> continue",
		"headers request: request headers",
		"guest request_trailers -> stop(1)",
		"trailers request: held",
		"signal continue request: request trailers end",
	},
}, {
	name: "a continue asked for during the stopping callback resumes its direction at once; one for the other direction does nothing",
	script: map[Phase][]host.Result{RequestHeaders: {with(stopAllW, continueSig(resp))},
		RequestBody: {with(buffer, continueSig(req))}},
	events: []event{headers(req, false), signal(req, continueSig(resp)), signal(req, continueSig(req)), data(req, "ab", true)},
	want: []string{
		"guest request_headers -> stop(4), continue response",
		"headers request: held",
		"signal continue response: held",
		"signal continue request: request headers",
		`guest request_body "ab" eos -> stop(1), continue request`,
		`data request "ab" eos: request "ab" end`,
	},
}, {
	name:   "a local reply from the request path goes through the response path, the filter's callbacks included; the request goes no further",
	script: map[Phase][]host.Result{RequestHeaders: {replying(403, host.HeadersStopAllIterationAndWatermark)}},
	events: []event{headers(req, false), data(req, "ab", true), headers(resp, false), data(resp, "nope", true)},
	want: []string{
		"guest request_headers -> stop(4), reply 403",
		"headers request: local reply 403",
		`data request "ab" eos: -`,
		"guest response_headers -> continue",
		"headers response: response headers",
		`guest response_body "nope" eos -> continue`,
		`data response "nope" eos: response "nope" end`,
	},
}, {
	name:   "a local reply from the response headers replaces the response",
	script: map[Phase][]host.Result{ResponseHeaders: {replying(502, host.HeadersStopAllIterationAndWatermark)}},
	events: []event{headers(req, true), headers(resp, false), data(resp, "x", true)},
	want: []string{
		"guest request_headers eos -> continue",
		"headers request eos: request headers end",
		"guest response_headers -> stop(4), reply 502",
		"headers response: direct reply 502; over",
		`data response "x" eos: over`,
	},
}, {
	name: "a local reply while the filter's own local reply goes through the response path replaces it",
	script: map[Phase][]host.Result{RequestHeaders: {replying(403, host.HeadersStopAllIterationAndWatermark)},
		ResponseHeaders: {replying(500, host.HeadersStopAllIterationAndWatermark)}},
	events: []event{headers(req, true), headers(resp, true)},
	want: []string{
		"guest request_headers eos -> stop(4), reply 403",
		"headers request eos: local reply 403",
		"guest response_headers eos -> stop(4), reply 500",
		"headers response eos: direct reply 500; over",
	},
}, {
	name:   "a local reply after the response headers went on resets the stream",
	script: map[Phase][]host.Result{ResponseBody: {replying(500, host.DataStopIterationNoBuffer)}},
	events: []event{headers(req, true), headers(resp, false), data(resp, "x", true)},
	want: []string{
		"guest request_headers eos -> continue",
		"headers request eos: request headers end",
		"guest response_headers -> continue",
		"headers response: response headers",
		`guest response_body "x" eos -> stop(3), reply 500`,
		`data response "x" eos: reset reply_500; over`,
	},
}, {
	name:   "a local reply from a signal (an HTTP call's answer) answers a held stream; a second one before the response path is ignored",
	script: map[Phase][]host.Result{RequestHeaders: {stopAllW}},
	events: []event{headers(req, false),
		signal(req, host.Signal{Kind: host.SignalLocalResponse, LocalResponse: reply(401)}),
		signal(req, host.Signal{Kind: host.SignalLocalResponse, LocalResponse: reply(403)})},
	want: []string{
		"guest request_headers -> stop(4)",
		"headers request: held",
		"signal local_response request 401: local reply 401",
		"signal local_response request 403: -",
	},
}, {
	name:   "proxy_close_stream during a callback resets the stream",
	script: map[Phase][]host.Result{RequestHeaders: {with(stopAllW, closeSig(req))}},
	events: []event{headers(req, true), headers(resp, true)},
	want: []string{
		"guest request_headers eos -> stop(4), close request",
		"headers request eos: reset wasm_close_stream; over",
		"headers response eos: over",
	},
}, {
	name:   "proxy_close_stream from a signal resets the stream",
	script: map[Phase][]host.Result{ResponseHeaders: {stopAllW}},
	events: []event{headers(req, true), headers(resp, false), signal(resp, closeSig(resp)), data(resp, "x", true)},
	want: []string{
		"guest request_headers eos -> continue",
		"headers request eos: request headers end",
		"guest response_headers -> stop(4)",
		"headers response: held",
		"signal close response: reset wasm_close_stream; over",
		`data response "x" eos: over`,
	},
}, {
	name: "failing closed answers with the plugin's 503, which the failed guest no longer sees",
	script: map[Phase][]host.Result{RequestHeaders: {failClosed(host.HeadersStopAllIterationAndWatermark)},
		ResponseHeaders: {skipped}},
	events: []event{headers(req, true), headers(resp, true)},
	want: []string{
		"guest request_headers eos -> failed, reply 503",
		"failure trap",
		"headers request eos: local reply 503",
		"guest response_headers eos -> continue, skipped",
		"headers response eos: response headers end",
	},
}, {
	name:   "failing open takes the guest out of the stream: what it held goes on, and it sees no more",
	script: map[Phase][]host.Result{RequestHeaders: {stopHdr}, RequestBody: {buffer, failOpen}},
	events: []event{headers(req, false), data(req, "ab", false), data(req, "cd", false), data(req, "ef", true), headers(resp, true)},
	want: []string{
		"guest request_headers -> stop(1)",
		"headers request: held",
		`guest request_body "ab" -> stop(1)`,
		`data request "ab": held`,
		`guest request_body "abcd" -> failed`,
		"failure trap",
		`data request "cd": request headers "abcd"`,
		`data request "ef" eos: request "ef" end`,
		"headers response eos: response headers end",
	},
}, {
	name:   "failing open in one direction lets go of what the guest held of the other",
	script: map[Phase][]host.Result{RequestHeaders: {stopHdr}, ResponseHeaders: {failOpen}},
	events: []event{headers(req, false), headers(resp, true), data(req, "ab", true)},
	want: []string{
		"guest request_headers -> stop(1)",
		"headers request: held",
		"guest response_headers eos -> failed",
		"failure trap",
		"headers response eos: request headers; response headers end",
		`data request "ab" eos: request "ab" end`,
	},
}, {
	name:   "a failure signal without a reply fails the stream open: what the guest held goes on",
	script: map[Phase][]host.Result{RequestHeaders: {stopHdr}, RequestBody: {buffer}},
	events: []event{headers(req, false), data(req, "ab", true), signal(req, host.Signal{Kind: host.SignalFailed, Failure: failed})},
	want: []string{
		"guest request_headers -> stop(1)",
		"headers request: held",
		`guest request_body "ab" eos -> stop(1)`,
		`data request "ab" eos: held`,
		"failure trap",
		`signal failed request: request headers "ab" end`,
	},
}, {
	name:   "a failure signal with a reply fails the stream closed",
	script: map[Phase][]host.Result{RequestHeaders: {stopAllW}},
	events: []event{headers(req, false), signal(req, host.Signal{Kind: host.SignalFailed, Failure: failed, LocalResponse: reply(503)})},
	want: []string{
		"guest request_headers -> stop(4)",
		"headers request: held",
		"failure trap",
		"signal failed request 503: local reply 503",
	},
}, {
	name:   "a skipped callback (the stream's failure was reported elsewhere) lets everything pass",
	script: map[Phase][]host.Result{RequestHeaders: {skipped}},
	events: []event{headers(req, false), data(req, "ab", true)},
	want: []string{
		"guest request_headers -> continue, skipped",
		"headers request: request headers",
		`data request "ab" eos: request "ab" end`,
	},
}, {
	name:   "an aborted stream takes nothing more; Finish still runs the guest's end",
	script: map[Phase][]host.Result{RequestHeaders: {stopAllW}},
	events: []event{headers(req, false), abort(req), data(req, "ab", true), signal(req, continueSig(req)), finish(req)},
	want: []string{
		"guest request_headers -> stop(4)",
		"headers request: held",
		"abort: over",
		`data request "ab" eos: over`,
		"signal continue request: over",
		"guest finish",
		"finish: over",
	},
}}

func TestStreamSemantics(t *testing.T) {
	for _, tc := range semanticsCases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			var log []string
			// The guest takes its results off the script as it goes: a copy leaves the
			// case as written for the next run (go test -count).
			g := &guest{script: maps.Clone(tc.script), log: &log}
			if g.script == nil {
				g.script = map[Phase][]host.Result{}
			}
			f := New(g, Config{BufferLimit: tc.limit, Observer: failureLog{&log}})
			for _, ev := range tc.events {
				v := ev.do(ctx, &f)
				log = append(log, ev.text+": "+describe(&f, ev.dir, v))
			}
			assert.Equal(t, tc.want, log)
		})
	}
}

// failureLog writes the failures the filter reports to the transcript.
type failureLog struct{ log *[]string }

func (failureLog) Callback(Callback) {}

func (l failureLog) Failure(f *host.Failure) { *l.log = append(*l.log, "failure "+string(f.Kind)) }
