// Command kitchen is the host's main test guest (ABI 0.2.1). Each request chooses what the
// guest does through the x-op header (comma separated operations) so that one module can
// exercise every host call and callback.
package main

import (
	"encoding/hex"
	"os"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"hostguests/abi"
)

func main() {}

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 { return abi.Alloc(size) }

type stream struct {
	ops map[string]bool
}

var (
	rootID  uint32
	cfg     = map[string]string{}
	streams = map[uint32]*stream{}
	calls   = map[uint32]uint32{}

	counterID, gaugeID, histID, ticksID, queueItemsID, deletesID, logsID, connsID uint32
	queueID                                                                       uint32
	spin                                                                          uint64
	hog                                                                           [][]byte
)

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

func parse(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		m[k] = v
	}
	return m
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {
	if parent == 0 {
		rootID = id
		return
	}
	streams[id] = &stream{ops: map[string]bool{}}
}

//go:wasmexport proxy_on_vm_start
func onVMStart(root, size uint32) uint32 {
	b, st := abi.Buffer(abi.VMConfig, 0, size)
	abi.Log(2, "vm_start config="+string(b)+" status="+itoa(st))
	if string(b) == "fail-start" {
		return 0
	}
	return 1
}

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) uint32 {
	b, _ := abi.Buffer(abi.PluginConfig, 0, size)
	cfg = parse(string(b))
	if _, ok := cfg["fail-configure"]; ok {
		return 0
	}
	if _, ok := cfg["trap-configure"]; ok {
		trap()
	}
	rid, st := abi.Property("plugin_root_id")
	abi.Log(2, "configure root_id="+string(rid)+" status="+itoa(st)+" root="+itoa(root))
	counterID, _ = abi.DefineMetric(0, "requests_total")
	gaugeID, _ = abi.DefineMetric(1, "active_requests")
	histID, _ = abi.DefineMetric(2, "request_size")
	ticksID, _ = abi.DefineMetric(0, "ticks_total")
	queueItemsID, _ = abi.DefineMetric(0, "queue_items_total")
	deletesID, _ = abi.DefineMetric(0, "deletes_total")
	logsID, _ = abi.DefineMetric(0, "logs_total")
	connsID, _ = abi.DefineMetric(0, "connections_total")
	if v, ok := cfg["tick"]; ok {
		ms, _ := strconv.Atoi(v)
		abi.ProxySetTickPeriodMilliseconds(uint32(ms))
	}
	if v, ok := cfg["queue"]; ok {
		queueID, _ = abi.RegisterQueue(v)
	}
	return 1
}

func trap() {
	// An out-of-bounds store: a real wasm trap, not a Go panic.
	*(*byte)(unsafe.Pointer(uintptr(0xFFFFFFF0))) = 1
}

func oom() {
	for {
		hog = append(hog, make([]byte, 1<<20))
	}
}

func loop() {
	for {
		spin++
	}
}

func faults(s *stream) {
	switch {
	case s.ops["trap"]:
		trap()
	case s.ops["panic"]:
		panic("guest panic on purpose")
	case s.ops["loop"]:
		loop()
	case s.ops["oom"]:
		oom()
	case s.ops["exit"]:
		os.Exit(3)
	}
}

// props reads each property named in the x-props header (";" between properties, "." between
// segments) and reports status and hex bytes in a request header, so tests can check the
// exact encoding.
func props(mt uint32, list string, report func(k, v string)) {
	for _, p := range strings.Split(list, ";") {
		if p == "" {
			continue
		}
		v, st := abi.Property(strings.Split(p, ".")...)
		report("x-prop-"+p, itoa(st)+":"+hex.EncodeToString(v))
	}
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	s := streams[id]
	ops, _ := abi.Header(abi.RequestHeaders, "x-op")
	for _, op := range strings.Split(ops, ",") {
		s.ops[op] = true
	}
	abi.ProxyIncrementMetric(counterID, 1)
	abi.ProxyIncrementMetric(gaugeID, 1)
	abi.AddHeader(abi.RequestHeaders, "x-seen-headers", itoa(n)+"/"+itoa(eos))
	add := func(k, v string) { abi.AddHeader(abi.RequestHeaders, k, v) }
	if s.ops["add-header"] {
		add("x-added", "1")
		abi.ReplaceHeader(abi.RequestHeaders, "x-replace", "new")
		abi.RemoveHeader(abi.RequestHeaders, "x-remove")
		v, st := abi.Header(abi.RequestHeaders, "x-missing")
		add("x-missing-status", itoa(st)+":"+v)
		var size uint32
		abi.ProxyGetHeaderMapSize(abi.RequestHeaders, unsafe.Pointer(&size))
		add("x-map-size", itoa(size))
	}
	if s.ops["set-pairs"] {
		pairs, _ := abi.Pairs(abi.RequestHeaders)
		out := [][2]string{}
		for _, p := range pairs {
			if p[0] != "x-drop" {
				out = append(out, p)
			}
		}
		out = append(out, [2]string{"x-pairs", strconv.Itoa(len(pairs))})
		abi.SetPairs(abi.RequestHeaders, out)
	}
	if list, st := abi.Header(abi.RequestHeaders, "x-props"); st == abi.OK {
		props(abi.RequestHeaders, list, add)
	}
	if s.ops["set-prop"] {
		st := abi.SetProperty("wasmesh.test", []byte("hello"))
		v, st2 := abi.Property("wasmesh.test")
		add("x-prop-custom", itoa(st)+":"+itoa(st2)+":"+string(v))
	}
	if s.ops["shared"] {
		v, cas, st := abi.SharedData("counter")
		n, _ := strconv.Atoi(string(v))
		st2 := abi.SetSharedData("counter", []byte(strconv.Itoa(n+1)), cas)
		add("x-shared", strconv.Itoa(n+1)+":"+itoa(st)+":"+itoa(st2))
	}
	if s.ops["cas"] {
		abi.SetSharedData("cas-key", []byte("a"), 0)
		_, cas, _ := abi.SharedData("cas-key")
		st1 := abi.SetSharedData("cas-key", []byte("b"), cas)
		st2 := abi.SetSharedData("cas-key", []byte("c"), cas) // stale
		v, _, _ := abi.SharedData("cas-key")
		_, _, st3 := abi.SharedData("no-such-key")
		add("x-cas", itoa(st1)+":"+itoa(st2)+":"+string(v)+":"+itoa(st3))
	}
	if s.ops["enqueue"] {
		vmID, _ := abi.Header(abi.RequestHeaders, "x-vm-id")
		qid, st := abi.ResolveQueue(vmID, "q")
		st2 := abi.Enqueue(qid, []byte("item"))
		_, st3 := abi.ResolveQueue(vmID, "no-such-queue")
		st4 := abi.Enqueue(999999, []byte("x"))
		add("x-enqueue", itoa(st)+":"+itoa(st2)+":"+itoa(st3)+":"+itoa(st4))
	}
	if s.ops["metrics"] {
		hv, _ := abi.Header(abi.RequestHeaders, "x-hist")
		h, _ := strconv.Atoi(hv)
		abi.ProxyRecordMetric(histID, uint64(h))
		abi.ProxyRecordMetric(histID, uint64(h*2))
		gv, _ := abi.Header(abi.RequestHeaders, "x-gauge")
		g, _ := strconv.Atoi(gv)
		abi.ProxyRecordMetric(gaugeID, uint64(g))
		abi.ProxyIncrementMetric(gaugeID, -2)
		again, _ := abi.DefineMetric(0, "requests_total")
		other, _ := abi.DefineMetric(1, "requests_total") // same name, other type
		c, st := abi.Metric(counterID)
		gauge, _ := abi.Metric(gaugeID)
		neg := abi.ProxyIncrementMetric(counterID, -1)
		_, hst := abi.Metric(histID)
		_, nf := abi.Metric(987654)
		_, bad := abi.DefineMetric(7, "bad")
		add("x-metrics", strings.Join([]string{
			strconv.FormatUint(c, 10), itoa(st), strconv.FormatBool(again == counterID),
			strconv.FormatBool(other != counterID), strconv.FormatInt(int64(gauge), 10),
			itoa(neg), itoa(hst), itoa(nf), itoa(bad),
		}, ":"))
	}
	if s.ops["badptr"] {
		bad := unsafe.Pointer(uintptr(0xFFFFFF00))
		st1 := abi.ProxyLog(2, bad, 1000)
		key := "x-op"
		st2 := abi.ProxyGetHeaderMapValue(abi.RequestHeaders, unsafe.Pointer(unsafe.StringData(key)), 4, bad, bad)
		st3 := abi.ProxyGetProperty(bad, 100, bad, bad)
		st4 := abi.ProxyGetHeaderMapValue(99, unsafe.Pointer(unsafe.StringData(key)), 4, bad, bad)
		_, st5 := abi.Buffer(99, 0, 10)
		st6 := abi.ProxySetHeaderMapPairs(abi.RequestHeaders, unsafe.Pointer(unsafe.StringData(key)), 4) // a huge count
		add("x-badptr", itoa(st1)+":"+itoa(st2)+":"+itoa(st3)+":"+itoa(st4)+":"+itoa(st5)+":"+itoa(st6))
	}
	if s.ops["foreign"] {
		v, st := abi.CallForeign("echo", []byte("ping"))
		_, st2 := abi.CallForeign("nope", nil)
		add("x-foreign", itoa(st)+":"+string(v)+":"+itoa(st2))
	}
	if s.ops["log-levels"] {
		for l := uint32(0); l <= 5; l++ {
			abi.Log(l, "level "+itoa(l))
		}
		st := abi.Log(9, "bad level")
		var lvl uint32
		abi.ProxyGetLogLevel(unsafe.Pointer(&lvl))
		add("x-log-level", itoa(lvl)+":"+itoa(st))
		println("stderr line from guest")
	}
	if s.ops["time"] {
		now, _ := abi.Now()
		add("x-time", strconv.FormatUint(now, 10))
	}
	if s.ops["grpc"] {
		var token uint32
		st := abi.ProxyGrpcCall(nil, nil, 0, nil, 0, nil, 0, nil, 0, nil, 0, unsafe.Pointer(&token))
		add("x-grpc", itoa(st))
	}
	if s.ops["httpcall-bad"] {
		_, st := abi.HTTPCall("auth", [][2]string{{":method", "GET"}}, nil, nil, 1000)
		add("x-call-bad", itoa(st))
	}
	faults(s)
	if s.ops["local"] || s.ops["local-continue"] {
		st := abi.SendLocalResponse(403, "denied by test", []byte("nope"), [][2]string{{"x-local", "yes"}}, -1)
		// Deferral: the stream is still ours after sending, headers are still writable.
		st2 := abi.AddHeader(abi.RequestHeaders, "x-after-local", "1")
		abi.Log(2, "local response sent status="+itoa(st)+" then add="+itoa(st2))
		if s.ops["local-continue"] {
			return 0
		}
		return 1
	}
	if s.ops["httpcall"] || s.ops["deny-on-call"] {
		timeout := uint32(5000)
		if v, st := abi.Header(abi.RequestHeaders, "x-call-timeout"); st == abi.OK {
			t, _ := strconv.Atoi(v)
			timeout = uint32(t)
		}
		token, st := abi.HTTPCall("auth",
			[][2]string{{":method", "POST"}, {":path", "/check"}, {":authority", "auth.local"}, {"x-from", "kitchen"}},
			[]byte("payload"), [][2]string{{"x-trailer", "t"}}, timeout)
		add("x-call", itoa(st))
		if st == abi.OK {
			calls[token] = id
			return 1
		}
	}
	if s.ops["close"] {
		abi.ProxyCloseStream(0)
		return 1
	}
	if s.ops["pause"] {
		return 1
	}
	return 0
}

//go:wasmexport proxy_on_request_body
func onRequestBody(id, size, eos uint32) uint32 {
	s := streams[id]
	logBody(s, "request", size, eos)
	hist := uint64(size)
	abi.ProxyRecordMetric(histID, hist)
	if s.ops["buffer-body"] {
		if eos == 0 {
			return 1
		}
		b, _ := abi.Buffer(abi.RequestBody, 0, size)
		abi.SetBuffer(abi.RequestBody, 0, size, []byte(strings.ToUpper(string(b))))
	}
	if s.ops["append-body"] {
		abi.SetBuffer(abi.RequestBody, size, 0, []byte("!"))
	}
	if s.ops["prepend-body"] {
		abi.SetBuffer(abi.RequestBody, 0, 0, []byte(">"))
	}
	if s.ops["body-trailers"] && eos == 1 {
		abi.AddHeader(abi.RequestTrailers, "x-added-trailer", "from-body")
	}
	if s.ops["buffer-status"] {
		var n, flags uint32
		st := abi.ProxyGetBufferStatus(abi.RequestBody, unsafe.Pointer(&n), unsafe.Pointer(&flags))
		_, st2 := abi.Buffer(abi.PluginConfig, 0, 10) // only available while configuring
		abi.Log(2, "buffer status size="+itoa(n)+" flags="+itoa(flags)+" status="+itoa(st)+" plugin_config="+itoa(st2))
	}
	if s.ops["body-fault"] {
		faults(&stream{ops: map[string]bool{"trap": true}})
	}
	return 0
}

//go:wasmexport proxy_on_request_trailers
func onRequestTrailers(id, n uint32) uint32 {
	if streams[id].ops["trailers"] {
		abi.AddHeader(abi.RequestTrailers, "x-trailer-added", itoa(n))
	}
	return 0
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 {
	s := streams[id]
	if s.ops["log-body"] {
		abi.Log(2, "x-headers-callback response eos="+itoa(eos))
	}
	abi.AddHeader(abi.ResponseHeaders, "x-response-added", itoa(n))
	if s.ops["resp-local"] {
		abi.SendLocalResponse(502, "replaced by test", []byte("replaced"), nil, -1)
		return 1
	}
	if s.ops["resp-fault"] {
		trap()
	}
	return 0
}

// logBody logs a body callback's arguments when the stream asked for it (op log-body,
// which also logs the response headers' end_of_stream).
func logBody(s *stream, dir string, size, eos uint32) {
	if s.ops["log-body"] {
		abi.Log(2, "x-body-callback "+dir+" size="+itoa(size)+" eos="+itoa(eos))
	}
}

//go:wasmexport proxy_on_response_body
func onResponseBody(id, size, eos uint32) uint32 {
	s := streams[id]
	logBody(s, "response", size, eos)
	if s.ops["resp-body"] && eos == 1 {
		abi.SetBuffer(abi.ResponseBody, size, 0, []byte(" world"))
	}
	if s.ops["resp-buffer"] {
		if eos == 0 {
			return 1
		}
		b, _ := abi.Buffer(abi.ResponseBody, 0, size)
		abi.SetBuffer(abi.ResponseBody, 0, size, []byte("["+string(b)+"]"))
	}
	return 0
}

//go:wasmexport proxy_on_response_trailers
func onResponseTrailers(id, n uint32) uint32 {
	if streams[id].ops["resp-trailers"] {
		abi.AddHeader(abi.ResponseTrailers, "x-resp-trailer", itoa(n))
	}
	return 0
}

//go:wasmexport proxy_on_log
func onLog(id uint32) {
	abi.ProxyIncrementMetric(logsID, 1)
	abi.ProxyIncrementMetric(gaugeID, -1)
	path, _ := abi.Header(abi.RequestHeaders, ":path")
	status, _ := abi.Header(abi.ResponseHeaders, ":status")
	msg := "access path=" + path + " status=" + status
	if list, st := abi.Header(abi.RequestHeaders, "x-log-props"); st == abi.OK {
		var parts []string
		props(abi.RequestHeaders, list, func(k, v string) { parts = append(parts, k+"="+v) })
		sort.Strings(parts)
		msg += " " + strings.Join(parts, " ")
	}
	abi.Log(2, msg)
}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 {
	if id == rootID && cfg["defer-done"] == "1" {
		abi.Log(2, "root done deferred")
		return 0
	}
	return 1
}

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {
	delete(streams, id)
	abi.ProxyIncrementMetric(deletesID, 1)
	if id == rootID {
		abi.Log(2, "root deleted")
	}
}

//go:wasmexport proxy_on_http_call_response
func onHTTPCallResponse(root, token, nh, bodySize, nt uint32) {
	sid, ok := calls[token]
	if !ok {
		abi.Log(4, "unknown token "+itoa(token))
		return
	}
	delete(calls, token)
	status, _ := abi.Header(abi.HTTPCallRespHeaders, ":status")
	body, _ := abi.Buffer(abi.HTTPCallRespBody, 0, bodySize)
	trailers, _ := abi.Pairs(abi.HTTPCallRespTrailers)
	var code, mp, ms uint32
	abi.ProxyGetStatus(unsafe.Pointer(&code), unsafe.Pointer(&mp), unsafe.Pointer(&ms))
	msg := string(abi.Take(mp, ms))
	rootSt := abi.ProxySetEffectiveContext(root) // the root context itself, then back to the stream
	st := abi.ProxySetEffectiveContext(sid)
	bad := abi.ProxySetEffectiveContext(424242)
	if nh == 0 {
		abi.AddHeader(abi.RequestHeaders, "x-auth", "failed:"+itoa(code)+":"+msg)
	} else {
		abi.AddHeader(abi.RequestHeaders, "x-auth", status+":"+string(body)+":"+strconv.Itoa(len(trailers))+":"+itoa(nh)+":"+itoa(code))
	}
	abi.AddHeader(abi.RequestHeaders, "x-effective", itoa(st)+":"+itoa(bad)+":"+itoa(rootSt))
	s := streams[sid]
	if s != nil && s.ops["deny-on-call"] {
		abi.SendLocalResponse(401, "denied after call", []byte("call said no"), nil, 16)
		return
	}
	if s != nil && s.ops["call-fault"] {
		trap()
	}
	abi.ProxyContinueStream(0)
}

//go:wasmexport proxy_on_tick
func onTick(root uint32) {
	abi.ProxyIncrementMetric(ticksID, 1)
	now, _ := abi.Now()
	abi.Log(2, "tick at "+strconv.FormatUint(now, 10))
	if cfg["tick-trap"] == "1" {
		trap()
	}
	if cfg["defer-done"] == "1" && cfg["done-on-tick"] == "1" {
		abi.ProxyDone()
	}
}

//go:wasmexport proxy_on_queue_ready
func onQueueReady(root, qid uint32) {
	for {
		_, st := abi.Dequeue(qid)
		if st != abi.OK {
			break
		}
		abi.ProxyIncrementMetric(queueItemsID, 1)
	}
	abi.Log(2, "queue ready root="+itoa(root))
}

//go:wasmexport proxy_on_foreign_function
func onForeignFunction(root, fid, size uint32) {
	b, st := abi.Buffer(abi.ForeignArgs, 0, size)
	abi.Log(2, "foreign function "+itoa(fid)+" args="+string(b)+" status="+itoa(st))
}

//go:wasmexport proxy_on_new_connection
func onNewConnection(id uint32) uint32 {
	abi.ProxyIncrementMetric(connsID, 1)
	// conn-props (plugin configuration): properties to read in a TCP stream's context.
	if list, ok := cfg["conn-props"]; ok {
		var parts []string
		props(0, list, func(k, v string) { parts = append(parts, k+"="+v) })
		sort.Strings(parts)
		abi.Log(2, "connection "+strings.Join(parts, " "))
	}
	return 0
}

//go:wasmexport proxy_on_downstream_data
func onDownstreamData(id, size, eos uint32) uint32 {
	b, _ := abi.Buffer(abi.DownstreamData, 0, size)
	abi.SetBuffer(abi.DownstreamData, 0, size, []byte(strings.ToUpper(string(b))))
	return 0
}

//go:wasmexport proxy_on_upstream_data
func onUpstreamData(id, size, eos uint32) uint32 {
	abi.SetBuffer(abi.UpstreamData, size, 0, []byte("!"))
	return 0
}

//go:wasmexport proxy_on_downstream_connection_close
func onDownstreamClose(id, peer uint32) {
	abi.Log(2, "downstream close peer="+itoa(peer))
}

//go:wasmexport proxy_on_upstream_connection_close
func onUpstreamClose(id, peer uint32) {
	abi.Log(2, "upstream close peer="+itoa(peer))
}

// fuzz_hostcall calls one host function with raw, arbitrary arguments so the host's
// argument decoding can be fuzzed through a real module.
//
//go:wasmexport fuzz_hostcall
func fuzzHostcall(fn, a, b, c, d, e uint32) uint32 {
	p := func(v uint32) unsafe.Pointer { return unsafe.Pointer(uintptr(v)) }
	switch fn % 16 {
	case 0:
		return abi.ProxyLog(a, p(b), c)
	case 1:
		return abi.ProxyGetProperty(p(a), b, p(c), p(d))
	case 2:
		return abi.ProxySetProperty(p(a), b, p(c), d)
	case 3:
		return abi.ProxyGetHeaderMapValue(a, p(b), c, p(d), p(e))
	case 4:
		return abi.ProxySetHeaderMapPairs(a, p(b), c)
	case 5:
		return abi.ProxyGetHeaderMapPairs(a, p(b), p(c))
	case 6:
		return abi.ProxyGetBufferBytes(a, b, c, p(d), p(e))
	case 7:
		return abi.ProxySetBufferBytes(a, b, c, p(d), e)
	case 8:
		return abi.ProxySendLocalResponse(a, p(b), c, p(d), e, p(b), c, int32(e))
	case 9:
		return abi.ProxyGetSharedData(p(a), b, p(c), p(d), p(e))
	case 10:
		return abi.ProxySetSharedData(p(a), b, p(c), d, e)
	case 11:
		return abi.ProxyDefineMetric(a, p(b), c, p(d))
	case 12:
		return abi.ProxyHTTPCall(p(a), b, p(c), d, p(e), a, p(b), c, d, p(e))
	case 13:
		return abi.ProxyAddHeaderMapValue(a, p(b), c, p(d), e)
	case 14:
		return abi.ProxyCallForeignFunction(p(a), b, p(c), d, p(e), p(a))
	default:
		if fn&16 != 0 {
			return abi.ProxyGrpcCall(p(a), p(b), c, p(d), e, p(a), b, p(c), d, p(e), a, p(b))
		}
		return abi.ProxyResolveSharedQueue(p(a), b, p(c), d, p(e))
	}
}
