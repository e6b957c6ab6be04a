package host

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// hostFunc is a host call: it reads its arguments from stack and returns the ABI status.
type hostFunc func(vc *vmCall, ctx context.Context, s []uint64) Status

func u32(s []uint64, i int) uint32 { return uint32(s[i]) }

// instantiateEnv registers every proxy_* host call, for all ABI versions at once: a module
// only links against the names it imports, so the 0.1.0 calls do no harm to 0.2.x modules.
func (r *Runtime) instantiateEnv(ctx context.Context, wz wazero.Runtime) error {
	b := wz.NewHostModuleBuilder("env")
	i32, i64 := api.ValueTypeI32, api.ValueTypeI64
	def := func(name string, fn hostFunc, params ...api.ValueType) {
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, mod api.Module, stack []uint64) {
			v, _ := ctx.Value(vmKey{}).(*vm)
			if v == nil || v.cur == nil {
				stack[0] = uint64(StatusInternalFailure)
				return
			}
			vc := v.cur
			if vc.vm.mod == nil {
				vc.vm.adopt(mod)
			}
			stack[0] = uint64(fn(vc, ctx, stack))
		}), params, []api.ValueType{i32}).Export(name)
	}
	n := func(k int) []api.ValueType {
		out := make([]api.ValueType, k)
		for i := range out {
			out[i] = i32
		}
		return out
	}
	def("proxy_log", (*vmCall).proxyLog, n(3)...)
	def("proxy_get_log_level", (*vmCall).proxyGetLogLevel, n(1)...)
	def("proxy_get_current_time_nanoseconds", (*vmCall).proxyGetCurrentTime, n(1)...)
	def("proxy_set_tick_period_milliseconds", (*vmCall).proxySetTickPeriod, n(1)...)
	def("proxy_get_property", (*vmCall).proxyGetProperty, n(4)...)
	def("proxy_set_property", (*vmCall).proxySetProperty, n(4)...)
	def("proxy_get_buffer_bytes", (*vmCall).proxyGetBufferBytes, n(5)...)
	def("proxy_get_buffer_status", (*vmCall).proxyGetBufferStatus, n(3)...)
	def("proxy_set_buffer_bytes", (*vmCall).proxySetBufferBytes, n(5)...)
	def("proxy_get_header_map_pairs", (*vmCall).proxyGetHeaderMapPairs, n(3)...)
	def("proxy_set_header_map_pairs", (*vmCall).proxySetHeaderMapPairs, n(3)...)
	def("proxy_get_header_map_size", (*vmCall).proxyGetHeaderMapSize, n(2)...)
	def("proxy_get_header_map_value", (*vmCall).proxyGetHeaderMapValue, n(5)...)
	def("proxy_add_header_map_value", (*vmCall).proxyAddHeaderMapValue, n(5)...)
	def("proxy_replace_header_map_value", (*vmCall).proxyReplaceHeaderMapValue, n(5)...)
	def("proxy_remove_header_map_value", (*vmCall).proxyRemoveHeaderMapValue, n(3)...)
	def("proxy_send_local_response", (*vmCall).proxySendLocalResponse, n(8)...)
	def("proxy_continue_stream", (*vmCall).proxyContinueStream, n(1)...)
	def("proxy_close_stream", (*vmCall).proxyCloseStream, n(1)...)
	def("proxy_continue_request", func(vc *vmCall, ctx context.Context, _ []uint64) Status {
		return vc.signalStream(SignalContinue, StreamRequest)
	})
	def("proxy_continue_response", func(vc *vmCall, ctx context.Context, _ []uint64) Status {
		return vc.signalStream(SignalContinue, StreamResponse)
	})
	def("proxy_clear_route_cache", func(vc *vmCall, ctx context.Context, _ []uint64) Status {
		return vc.signalStream(SignalClearRouteCache, StreamRequest)
	})
	def("proxy_get_configuration", (*vmCall).proxyGetConfiguration, n(2)...)
	def("proxy_http_call", (*vmCall).proxyHTTPCall, n(10)...)
	def("proxy_get_status", (*vmCall).proxyGetStatus, n(3)...)
	def("proxy_get_shared_data", (*vmCall).proxyGetSharedData, n(5)...)
	def("proxy_set_shared_data", (*vmCall).proxySetSharedData, n(5)...)
	def("proxy_register_shared_queue", (*vmCall).proxyRegisterSharedQueue, n(3)...)
	def("proxy_resolve_shared_queue", (*vmCall).proxyResolveSharedQueue, n(5)...)
	def("proxy_enqueue_shared_queue", (*vmCall).proxyEnqueueSharedQueue, n(3)...)
	def("proxy_dequeue_shared_queue", (*vmCall).proxyDequeueSharedQueue, n(3)...)
	def("proxy_define_metric", (*vmCall).proxyDefineMetric, n(4)...)
	def("proxy_increment_metric", func(vc *vmCall, ctx context.Context, s []uint64) Status {
		return vc.vm.p.metrics.increment(u32(s, 0), int64(s[1]))
	}, i32, i64)
	def("proxy_record_metric", func(vc *vmCall, ctx context.Context, s []uint64) Status {
		return vc.vm.p.metrics.record(u32(s, 0), s[1])
	}, i32, i64)
	def("proxy_get_metric", (*vmCall).proxyGetMetric, n(2)...)
	def("proxy_set_effective_context", (*vmCall).proxySetEffectiveContext, n(1)...)
	def("proxy_done", (*vmCall).proxyDone)
	def("proxy_call_foreign_function", (*vmCall).proxyCallForeignFunction, n(6)...)
	unimplemented := func(*vmCall, context.Context, []uint64) Status { return StatusUnimplemented }
	def("proxy_grpc_call", (*vmCall).proxyGRPCCall, n(12)...)
	def("proxy_grpc_stream", unimplemented, n(9)...)
	def("proxy_grpc_send", unimplemented, n(4)...)
	def("proxy_grpc_cancel", (*vmCall).proxyGRPCCancel, n(1)...)
	def("proxy_grpc_close", (*vmCall).proxyGRPCCancel, n(1)...)
	// Emscripten-built C++ modules import this helper; Envoy provides it too.
	b.NewFunctionBuilder().WithGoFunction(api.GoFunc(func(ctx context.Context, stack []uint64) {
		stack[0] = b2u(uint32(stack[0]) == uint32(stack[1]))
	}), n(2), n(1)).Export("pthread_equal")
	_, err := b.Instantiate(ctx)
	return err
}

func (vc *vmCall) mem() api.Memory { return vc.vm.mod.Memory() }

// name reads a name the guest passes on most calls (a header name, a shared data key) as
// an interned string (see vm.intern).
func (vc *vmCall) name(ptr, size uint32) (string, bool) {
	b, ok := view(vc.mem(), ptr, size)
	if !ok {
		return "", false
	}
	return vc.vm.intern(b), true
}

// ---- logging, time, timers ----

func (vc *vmCall) proxyLog(ctx context.Context, s []uint64) Status {
	level := LogLevel(u32(s, 0))
	if level > LogCritical {
		return StatusBadArgument
	}
	msg, ok := readString(vc.mem(), u32(s, 1), u32(s, 2))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	if level >= LogError {
		vc.vm.lastError = msg
	}
	vc.vm.p.log.Log(ctx, level.Slog(), msg, "source", "proxy_log", "wasm_level", level.String(),
		"instance", vc.vm.in.idx, "context_id", vc.effective)
	return StatusOK
}

func (vc *vmCall) proxyGetLogLevel(ctx context.Context, s []uint64) Status {
	h := vc.vm.p.log.Handler()
	level := LogCritical
	for l := LogTrace; l < LogCritical; l++ {
		if h.Enabled(ctx, l.Slog()) {
			level = l
			break
		}
	}
	if !writeU32(vc.mem(), u32(s, 0), uint32(level)) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func (vc *vmCall) proxyGetCurrentTime(ctx context.Context, s []uint64) Status {
	if !writeU64(vc.mem(), u32(s, 0), uint64(vc.vm.p.env.Clock.Now().UnixNano())) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// proxySetTickPeriod applies to the root context, whatever context calls it, as in Envoy.
func (vc *vmCall) proxySetTickPeriod(ctx context.Context, s []uint64) Status {
	vc.vm.setTick(time.Duration(u32(s, 0)) * time.Millisecond)
	return StatusOK
}

// ---- properties ----

func (vc *vmCall) proxyGetProperty(ctx context.Context, s []uint64) Status {
	raw, ok := view(vc.mem(), u32(s, 0), u32(s, 1))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	// The path's segments are interned strings, so reading a property allocates nothing
	// on the host but the value itself.
	path := vc.vm.splitPath(raw)
	v, state, st := vc.resolveProperty(path)
	if st != StatusOK {
		return st
	}
	ptrPtr, sizePtr := u32(s, 2), u32(s, 3)
	if state != nil {
		return vc.copyOut(ctx, state, ptrPtr, sizePtr)
	}
	switch x := v.(type) {
	case string:
		return vc.copyOutString(ctx, x, ptrPtr, sizePtr)
	case int64:
		return vc.copyOutU64(ctx, uint64(x), ptrPtr, sizePtr)
	case time.Duration:
		return vc.copyOutU64(ctx, uint64(x), ptrPtr, sizePtr)
	}
	b, st := SerializeProperty(v)
	if st != StatusOK {
		return st
	}
	return vc.copyOut(ctx, b, ptrPtr, sizePtr)
}

// proxySetProperty stores a value in the stream's filter state; like Envoy it needs a
// stream (NotFound in the root context).
func (vc *vmCall) proxySetProperty(ctx context.Context, s []uint64) Status {
	path, ok := readBytes(vc.mem(), u32(s, 0), u32(s, 1))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	val, ok := readBytes(vc.mem(), u32(s, 2), u32(s, 3))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	sc := vc.streamCore()
	if sc == nil {
		return StatusNotFound
	}
	parts := SplitPath(path)
	if len(parts) == 0 {
		return StatusBadArgument
	}
	if sc.filterState == nil {
		sc.filterState = map[string][]byte{}
	}
	sc.filterState[joinParts(parts)] = val
	return StatusOK
}

func joinParts(p []string) string { return string(JoinPath(p...)) }

// ---- buffers ----

// buffer returns the bytes of a buffer type for the effective context, and a setter for
// the mutable ones.
func (vc *vmCall) buffer(bt BufferType) (data []byte, set func([]byte), st Status) {
	gc := vc.vm.contexts[vc.effective]
	switch bt {
	case BufferRequestBody, BufferResponseBody:
		if gc == nil || gc.http == nil {
			return nil, nil, StatusNotFound
		}
		h := gc.http
		if bt == BufferRequestBody {
			return h.reqBody, func(b []byte) { h.reqBody = b }, StatusOK
		}
		return h.respBody, func(b []byte) { h.respBody = b }, StatusOK
	case BufferDownstreamData, BufferUpstreamData:
		if gc == nil || gc.net == nil {
			return nil, nil, StatusNotFound
		}
		n := gc.net
		if bt == BufferDownstreamData {
			return n.down, func(b []byte) { n.down = b }, StatusOK
		}
		return n.up, func(b []byte) { n.up = b }, StatusOK
	case BufferHTTPCallResponseBody:
		if !vc.httpCallActive {
			return nil, nil, StatusNotFound
		}
		if vc.httpResp == nil {
			return nil, nil, StatusOK
		}
		return vc.httpResp.Body, nil, StatusOK
	case BufferVMConfiguration:
		return vc.vm.p.cfg.VMConfig, nil, StatusOK
	case BufferPluginConfiguration:
		// Envoy only has the plugin configuration at hand while configuring.
		if !vc.pluginConfig {
			return nil, nil, StatusNotFound
		}
		return vc.vm.p.cfg.Configuration, nil, StatusOK
	case BufferForeignArguments:
		if !vc.foreignActive {
			return nil, nil, StatusNotFound
		}
		return vc.foreignArgs, nil, StatusOK
	case BufferGRPCReceive:
		if !vc.grpcReceive {
			return nil, nil, StatusNotFound
		}
		return vc.grpcResp.Message, nil, StatusOK
	}
	return nil, nil, StatusBadArgument
}

// proxyGetBufferBytes clamps the window to the buffer, as current proxy-wasm-cpp-host does
// (SDKs ask for math.MaxInt32 bytes of the configuration).
func (vc *vmCall) proxyGetBufferBytes(ctx context.Context, s []uint64) Status {
	data, _, st := vc.buffer(BufferType(u32(s, 0)))
	if st != StatusOK {
		return st
	}
	start, length := uint64(u32(s, 1)), uint64(u32(s, 2))
	size := uint64(len(data))
	if start > size {
		length = 0
	} else if start+length > size {
		length = size - start
	}
	var out []byte
	if length > 0 {
		out = data[start : start+length]
	}
	return vc.copyOut(ctx, out, u32(s, 3), u32(s, 4))
}

func (vc *vmCall) proxyGetBufferStatus(ctx context.Context, s []uint64) Status {
	data, _, st := vc.buffer(BufferType(u32(s, 0)))
	if st != StatusOK {
		return st
	}
	if !writeU32(vc.mem(), u32(s, 1), uint32(len(data))) || !writeU32(vc.mem(), u32(s, 2), 0) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// proxySetBufferBytes follows Envoy's Buffer::copyFrom: start 0 replaces the first size
// bytes (size 0 prepends), start at or past the end appends, anything else is rejected.
// Buffers the guest only reads are immutable (BadArgument).
func (vc *vmCall) proxySetBufferBytes(ctx context.Context, s []uint64) Status {
	data, set, st := vc.buffer(BufferType(u32(s, 0)))
	if st != StatusOK {
		return st
	}
	val, ok := readBytes(vc.mem(), u32(s, 3), u32(s, 4))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	if set == nil {
		return StatusBadArgument
	}
	start, length := uint64(u32(s, 1)), uint64(u32(s, 2))
	size := uint64(len(data))
	switch {
	case start == 0:
		if length > size {
			length = size
		}
		out := make([]byte, 0, len(val)+int(size-length))
		out = append(out, val...)
		out = append(out, data[length:]...)
		set(out)
	case start >= size:
		set(append(append(make([]byte, 0, len(data)+len(val)), data...), val...))
	default:
		return StatusBadArgument
	}
	return StatusOK
}

// proxyGetConfiguration is ABI 0.1.0's way to read the configuration: the plugin
// configuration while configuring, the VM configuration otherwise (Envoy's
// getConfiguration).
func (vc *vmCall) proxyGetConfiguration(ctx context.Context, s []uint64) Status {
	cfg := vc.vm.p.cfg.VMConfig
	if vc.pluginConfig {
		cfg = vc.vm.p.cfg.Configuration
	}
	return vc.copyOut(ctx, cfg, u32(s, 0), u32(s, 1))
}

// ---- header maps ----

// headerMap returns the map of type mt for the effective context. write asks for a map
// the guest may modify: maps that are not available then read as BadArgument, as in Envoy;
// trailers can be created from a body callback at end of stream.
func (vc *vmCall) headerMap(mt MapType, write bool) (*Headers, Status) {
	if mt > mapTypeMax {
		return nil, StatusBadArgument
	}
	switch mt {
	case MapHTTPCallResponseHeaders, MapHTTPCallResponseTrailers:
		if write || !vc.httpCallActive {
			return nil, StatusBadArgument
		}
		if vc.httpResp == nil {
			return NewHeaders(), StatusOK
		}
		if mt == MapHTTPCallResponseHeaders {
			return NewHeaders(vc.httpResp.Headers...), StatusOK
		}
		return NewHeaders(vc.httpResp.Trailers...), StatusOK
	case MapGRPCReceiveInitialMetadata, MapGRPCReceiveTrailingMetadata:
		if write || vc.grpcResp == nil {
			return nil, StatusBadArgument
		}
		if mt == MapGRPCReceiveInitialMetadata {
			return NewHeaders(vc.grpcResp.InitialMetadata...), StatusOK
		}
		return NewHeaders(vc.grpcResp.TrailingMetadata...), StatusOK
	}
	gc := vc.vm.contexts[vc.effective]
	if gc == nil || gc.http == nil {
		return nil, StatusBadArgument
	}
	h := gc.http
	var m **Headers
	switch mt {
	case MapRequestHeaders:
		m = &h.reqH
	case MapRequestTrailers:
		m = &h.reqT
		if *m == nil && write && h.phase == phaseRequestBody && h.eos {
			*m = NewHeaders()
		}
	case MapResponseHeaders:
		m = &h.respH
	case MapResponseTrailers:
		m = &h.respT
		if *m == nil && write && h.phase == phaseResponseBody && h.eos {
			*m = NewHeaders()
		}
	}
	if *m == nil {
		if h.phase == phaseLog && !write {
			return nil, StatusNotFound
		}
		return nil, StatusBadArgument
	}
	return *m, StatusOK
}

func (vc *vmCall) proxyGetHeaderMapPairs(ctx context.Context, s []uint64) Status {
	h, st := vc.headerMap(MapType(u32(s, 0)), false)
	if st == StatusNotFound || (st == StatusBadArgument && MapType(u32(s, 0)) <= mapTypeMax) {
		// Envoy returns an empty map for a map that is not available.
		h, st = nil, StatusOK
	}
	if st != StatusOK {
		return st
	}
	pairs := h.Pairs()
	if len(pairs) == 0 {
		return vc.copyOut(ctx, nil, u32(s, 1), u32(s, 2))
	}
	return vc.copyOut(ctx, EncodePairs(pairs), u32(s, 1), u32(s, 2))
}

func (vc *vmCall) proxySetHeaderMapPairs(ctx context.Context, s []uint64) Status {
	h, st := vc.headerMap(MapType(u32(s, 0)), true)
	if st != StatusOK {
		return st
	}
	data, ok := readBytes(vc.mem(), u32(s, 1), u32(s, 2))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	pairs, err := DecodePairs(data)
	if err != nil {
		return StatusBadArgument
	}
	h.SetPairs(pairs)
	return StatusOK
}

func (vc *vmCall) proxyGetHeaderMapSize(ctx context.Context, s []uint64) Status {
	h, st := vc.headerMap(MapType(u32(s, 0)), false)
	if st != StatusOK {
		return st
	}
	if !writeU32(vc.mem(), u32(s, 1), uint32(pairsSize(h.Pairs()))) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func (vc *vmCall) proxyGetHeaderMapValue(ctx context.Context, s []uint64) Status {
	h, st := vc.headerMap(MapType(u32(s, 0)), false)
	if st != StatusOK {
		return st
	}
	raw, ok := view(vc.mem(), u32(s, 1), u32(s, 2))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	v, found := h.Get(vc.vm.intern(raw))
	if !found {
		// ABI 0.1.0 reported a missing header as an empty value.
		if vc.vm.p.mod.abi != ABI010 {
			return StatusNotFound
		}
		v = ""
	}
	return vc.copyOutString(ctx, v, u32(s, 3), u32(s, 4))
}

func (vc *vmCall) keyValue(s []uint64) (*Headers, string, string, Status) {
	h, st := vc.headerMap(MapType(u32(s, 0)), true)
	if st != StatusOK {
		return nil, "", "", st
	}
	key, ok := vc.name(u32(s, 1), u32(s, 2))
	if !ok {
		return nil, "", "", StatusInvalidMemoryAccess
	}
	val, ok := readString(vc.mem(), u32(s, 3), u32(s, 4))
	if !ok {
		return nil, "", "", StatusInvalidMemoryAccess
	}
	return h, key, val, StatusOK
}

func (vc *vmCall) proxyAddHeaderMapValue(ctx context.Context, s []uint64) Status {
	h, k, v, st := vc.keyValue(s)
	if st == StatusOK {
		h.Add(k, v)
	}
	return st
}

func (vc *vmCall) proxyReplaceHeaderMapValue(ctx context.Context, s []uint64) Status {
	h, k, v, st := vc.keyValue(s)
	if st == StatusOK {
		h.Set(k, v)
	}
	return st
}

func (vc *vmCall) proxyRemoveHeaderMapValue(ctx context.Context, s []uint64) Status {
	h, st := vc.headerMap(MapType(u32(s, 0)), true)
	if st != StatusOK {
		return st
	}
	key, ok := vc.name(u32(s, 1), u32(s, 2))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	h.Del(key)
	return StatusOK
}

// ---- stream control ----

// signalStream records an action on the effective stream. Nothing happens to the stream
// until the callback returns: the action is either part of the running stream method's
// Result or a Signal delivered afterwards (Envoy defers these with addAfterVmCallAction).
func (vc *vmCall) signalStream(kind SignalKind, t StreamType) Status {
	sc := vc.streamCore()
	if sc == nil || sc.done {
		// Envoy silently ignores stream actions without a stream.
		return StatusOK
	}
	sig := Signal{Kind: kind, Stream: t}
	if sc == vc.sync {
		vc.signals = append(vc.signals, sig)
	} else {
		sc.emit(sig)
	}
	return StatusOK
}

func (vc *vmCall) proxyContinueStream(ctx context.Context, s []uint64) Status {
	t := StreamType(u32(s, 0))
	switch t {
	case StreamRequest, StreamResponse, StreamDownstream:
		return vc.signalStream(SignalContinue, t)
	case StreamUpstream:
		return StatusUnimplemented
	}
	return StatusBadArgument
}

func (vc *vmCall) proxyCloseStream(ctx context.Context, s []uint64) Status {
	t := StreamType(u32(s, 0))
	if t > StreamUpstream {
		return StatusBadArgument
	}
	return vc.signalStream(SignalClose, t)
}

func (vc *vmCall) proxySendLocalResponse(ctx context.Context, s []uint64) Status {
	mem := vc.mem()
	details, ok1 := readString(mem, u32(s, 1), u32(s, 2))
	body, ok2 := readBytes(mem, u32(s, 3), u32(s, 4))
	hdrs, ok3 := readBytes(mem, u32(s, 5), u32(s, 6))
	if !ok1 || !ok2 || !ok3 {
		return StatusInvalidMemoryAccess
	}
	pairs, err := DecodePairs(hdrs)
	if err != nil {
		return StatusBadArgument
	}
	sc := vc.streamCore()
	if sc == nil || sc.done {
		return StatusOK
	}
	lr := &LocalResponse{StatusCode: int(u32(s, 0)), Details: details, Body: body, Headers: pairs, GRPCStatus: int32(u32(s, 7))}
	if sc == vc.sync {
		if vc.local == nil {
			vc.local = lr
		}
		return StatusOK
	}
	sc.emit(Signal{Kind: SignalLocalResponse, Stream: StreamRequest, LocalResponse: lr})
	return StatusOK
}

func (vc *vmCall) proxySetEffectiveContext(ctx context.Context, s []uint64) Status {
	id := u32(s, 0)
	gc, ok := vc.vm.contexts[id]
	if !ok {
		return StatusBadArgument
	}
	if sc := gc.core(); sc != nil && sc.done {
		return StatusBadArgument
	}
	vc.effective = id
	return StatusOK
}

// proxyDone completes a root context's deferred shutdown (proxy_on_done returned false).
func (vc *vmCall) proxyDone(ctx context.Context, s []uint64) Status {
	v := vc.vm
	if v.doneCh == nil || vc.effective != v.rootID {
		return StatusNotFound
	}
	close(v.doneCh)
	v.doneCh = nil
	return StatusOK
}

// ---- HTTP calls ----

func (vc *vmCall) proxyHTTPCall(ctx context.Context, s []uint64) Status {
	mem := vc.mem()
	cluster, ok1 := readString(mem, u32(s, 0), u32(s, 1))
	hdrs, ok2 := readBytes(mem, u32(s, 2), u32(s, 3))
	body, ok3 := readBytes(mem, u32(s, 4), u32(s, 5))
	trls, ok4 := readBytes(mem, u32(s, 6), u32(s, 7))
	tokenPtr := u32(s, 9)
	if !ok1 || !ok2 || !ok3 || !ok4 || !canWrite(mem, tokenPtr, 4) {
		return StatusInvalidMemoryAccess
	}
	headers, err1 := DecodePairs(hdrs)
	trailers, err2 := DecodePairs(trls)
	if err1 != nil || err2 != nil {
		return StatusBadArgument
	}
	v := vc.vm
	p := v.p
	if p.env.HTTPCalls == nil {
		return StatusUnimplemented
	}
	hm := NewHeaders(headers...)
	for _, k := range []string{":method", ":path", ":authority"} {
		if _, ok := hm.Get(k); !ok {
			return StatusBadArgument
		}
	}
	v.nextToken++
	if v.nextToken == 0 {
		v.nextToken++
	}
	token := v.nextToken
	timeout := time.Duration(u32(s, 8)) * time.Millisecond
	req := &HTTPCallRequest{Cluster: cluster, Headers: hm.Pairs(), Body: body, Trailers: trailers, Timeout: timeout, Plugin: p.cfg.Name}

	pc, callCtx, finish := startCall(v, v.calls, token, timeout, ErrHTTPCallTimeout, func(pc *pendingCall, resp *HTTPCallResponse, err error) {
		v.deliverHTTPCall(token, pc, resp, err)
	})
	if err := p.env.HTTPCalls.DispatchHTTPCall(callCtx, req, finish); err != nil {
		pc.abandon(err)
		delete(v.calls, token)
		if errors.Is(err, ErrUnknownCluster) {
			return StatusBadArgument
		}
		p.log.Warn("http call dispatch failed", "cluster", cluster, "error", err)
		return StatusInternalFailure
	}
	writeU32(mem, tokenPtr, token)
	return StatusOK
}

// deliverHTTPCall runs proxy_on_http_call_response in the root context, with the response
// readable through the HTTP-call maps and buffer. A failed call has no headers.
func (v *vm) deliverHTTPCall(token uint32, pc *pendingCall, resp *HTTPCallResponse, err error) {
	if !v.alive() || v.calls[token] != pc {
		return
	}
	delete(v.calls, token)
	if pc.stop != nil {
		pc.stop()
	}
	if err != nil {
		resp = nil
	}
	vc := &vmCall{vm: v, effective: v.rootID, callback: fnOnHTTPCallResponse,
		httpCallActive: true, httpResp: resp, httpErr: err}
	var nh, nb, nt int
	if resp != nil {
		nh, nb, nt = len(resp.Headers), len(resp.Body), len(resp.Trailers)
	}
	if _, _, cerr := v.call(vc, fnOnHTTPCallResponse, uint64(v.rootID), uint64(token), uint64(nh), uint64(nb), uint64(nt)); cerr != nil {
		v.in.fail(v, cerr, nil)
	}
}

// proxyGetStatus reports the HTTP call being delivered: its :status, or Envoy's
// BrokenConnection code with a reason when it failed; or the gRPC call being delivered:
// its grpc-status and grpc-message.
func (vc *vmCall) proxyGetStatus(ctx context.Context, s []uint64) Status {
	var code uint32
	var msg string
	if vc.grpcResp != nil {
		code, msg = vc.grpcStatus()
	} else if vc.httpCallActive {
		if vc.httpResp == nil {
			code = uint32(StatusBrokenConnection)
			msg = "reset"
			if errors.Is(vc.httpErr, ErrHTTPCallTimeout) {
				msg = "timeout"
			}
		} else if st, ok := NewHeaders(vc.httpResp.Headers...).Get(":status"); ok {
			n, _ := strconv.ParseUint(st, 10, 32)
			code = uint32(n)
		}
	}
	if !writeU32(vc.mem(), u32(s, 0), code) {
		return StatusInvalidMemoryAccess
	}
	return vc.copyOut(ctx, []byte(msg), u32(s, 1), u32(s, 2))
}

// ---- shared data and queues ----

func (vc *vmCall) proxyGetSharedData(ctx context.Context, s []uint64) Status {
	key, ok := vc.name(u32(s, 0), u32(s, 1))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	casPtr := u32(s, 4)
	if !canWrite(vc.mem(), casPtr, 4) {
		return StatusInvalidMemoryAccess
	}
	val, cas, st := vc.vm.p.rt.data.get(vc.vm.p.cfg.VMID, key)
	if st != StatusOK {
		return st
	}
	if st := vc.copyOut(ctx, val, u32(s, 2), u32(s, 3)); st != StatusOK {
		return st
	}
	if !writeU32(vc.mem(), casPtr, cas) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func (vc *vmCall) proxySetSharedData(ctx context.Context, s []uint64) Status {
	key, ok := vc.name(u32(s, 0), u32(s, 1))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	val, ok := readBytes(vc.mem(), u32(s, 2), u32(s, 3))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	return vc.vm.p.rt.data.set(vc.vm.p.cfg.VMID, key, val, u32(s, 4))
}

// proxyRegisterSharedQueue registers for the root context (onQueueReady is a root
// callback, whichever context registers).
func (vc *vmCall) proxyRegisterSharedQueue(ctx context.Context, s []uint64) Status {
	name, ok := readString(vc.mem(), u32(s, 0), u32(s, 1))
	if !ok || !canWrite(vc.mem(), u32(s, 2), 4) {
		return StatusInvalidMemoryAccess
	}
	tok := vc.vm.p.rt.queues.register(vc.vm.p.cfg.VMID, name, vc.vm.in)
	writeU32(vc.mem(), u32(s, 2), tok)
	return StatusOK
}

func (vc *vmCall) proxyResolveSharedQueue(ctx context.Context, s []uint64) Status {
	vmID, ok1 := readString(vc.mem(), u32(s, 0), u32(s, 1))
	name, ok2 := readString(vc.mem(), u32(s, 2), u32(s, 3))
	if !ok1 || !ok2 || !canWrite(vc.mem(), u32(s, 4), 4) {
		return StatusInvalidMemoryAccess
	}
	tok, st := vc.vm.p.rt.queues.resolve(vmID, name)
	if st != StatusOK {
		return st
	}
	writeU32(vc.mem(), u32(s, 4), tok)
	return StatusOK
}

func (vc *vmCall) proxyEnqueueSharedQueue(ctx context.Context, s []uint64) Status {
	tok := u32(s, 0)
	val, ok := readBytes(vc.mem(), u32(s, 1), u32(s, 2))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	owner, st := vc.vm.p.rt.queues.enqueue(tok, val)
	if st != StatusOK {
		return st
	}
	if owner != nil {
		vc.postTo(owner, func() { owner.deliverQueueReady(tok) })
	}
	return StatusOK
}

// deliverQueueReady runs proxy_on_queue_ready in the root context of the instance's
// current VM.
func (in *instance) deliverQueueReady(tok uint32) {
	v := in.vm
	if v == nil || v.dead != nil || in.p.closed.Load() {
		return
	}
	vc := &vmCall{vm: v, effective: v.rootID, callback: fnOnQueueReady}
	if _, _, err := v.call(vc, fnOnQueueReady, uint64(v.rootID), uint64(tok)); err != nil {
		in.fail(v, err, nil)
	}
}

func (vc *vmCall) proxyDequeueSharedQueue(ctx context.Context, s []uint64) Status {
	if !canWrite(vc.mem(), u32(s, 1), 4) || !canWrite(vc.mem(), u32(s, 2), 4) {
		return StatusInvalidMemoryAccess
	}
	val, st := vc.vm.p.rt.queues.dequeue(u32(s, 0))
	if st != StatusOK {
		return st
	}
	return vc.copyOut(ctx, val, u32(s, 1), u32(s, 2))
}

// ---- metrics ----

func (vc *vmCall) proxyDefineMetric(ctx context.Context, s []uint64) Status {
	name, ok := readString(vc.mem(), u32(s, 1), u32(s, 2))
	if !ok || !canWrite(vc.mem(), u32(s, 3), 4) {
		return StatusInvalidMemoryAccess
	}
	id, st := vc.vm.p.metrics.define(MetricType(u32(s, 0)), name)
	if st != StatusOK {
		return st
	}
	writeU32(vc.mem(), u32(s, 3), id)
	return StatusOK
}

func (vc *vmCall) proxyGetMetric(ctx context.Context, s []uint64) Status {
	v, st := vc.vm.p.metrics.get(u32(s, 0))
	if st != StatusOK {
		return st
	}
	if !writeU64(vc.mem(), u32(s, 1), v) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// ---- foreign functions ----

func (vc *vmCall) proxyCallForeignFunction(ctx context.Context, s []uint64) Status {
	name, ok1 := readString(vc.mem(), u32(s, 0), u32(s, 1))
	args, ok2 := readBytes(vc.mem(), u32(s, 2), u32(s, 3))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	ff := vc.vm.p.env.ForeignFunctions
	if len(ff) == 0 {
		return StatusUnimplemented
	}
	fn, ok := ff[name]
	if !ok {
		return StatusNotFound
	}
	out, st := fn(ctx, args)
	if u32(s, 4) != 0 || u32(s, 5) != 0 {
		if cst := vc.copyOut(ctx, out, u32(s, 4), u32(s, 5)); cst != StatusOK {
			return cst
		}
	}
	return st
}
