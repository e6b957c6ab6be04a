// Package abi is a minimal guest-side binding of the proxy-wasm ABI for the host's test
// guests. It calls the host directly through //go:wasmimport so that the host is tested
// against real modules without depending on any SDK.
package abi

import (
	"encoding/binary"
	"unsafe"
)

// Status codes of ABI 0.2.1.
const (
	OK                  = 0
	NotFound            = 1
	BadArgument         = 2
	InvalidMemoryAccess = 6
	Empty               = 7
	CasMismatch         = 8
	Unimplemented       = 12
)

// Map types.
const (
	RequestHeaders       = 0
	RequestTrailers      = 1
	ResponseHeaders      = 2
	ResponseTrailers     = 3
	HTTPCallRespHeaders  = 6
	HTTPCallRespTrailers = 7
)

// Buffer types.
const (
	RequestBody      = 0
	ResponseBody     = 1
	DownstreamData   = 2
	UpstreamData     = 3
	HTTPCallRespBody = 4
	VMConfig         = 6
	PluginConfig     = 7
	ForeignArgs      = 8
)

//go:wasmimport env proxy_log
func ProxyLog(level uint32, ptr unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_get_log_level
func ProxyGetLogLevel(ret unsafe.Pointer) uint32

//go:wasmimport env proxy_get_current_time_nanoseconds
func ProxyGetCurrentTimeNanoseconds(ret unsafe.Pointer) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func ProxySetTickPeriodMilliseconds(ms uint32) uint32

//go:wasmimport env proxy_get_property
func ProxyGetProperty(pathPtr unsafe.Pointer, pathSize uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_set_property
func ProxySetProperty(pathPtr unsafe.Pointer, pathSize uint32, valPtr unsafe.Pointer, valSize uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func ProxyGetBufferBytes(bt, start, max uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_get_buffer_status
func ProxyGetBufferStatus(bt uint32, retSize, retFlags unsafe.Pointer) uint32

//go:wasmimport env proxy_set_buffer_bytes
func ProxySetBufferBytes(bt, start, size uint32, ptr unsafe.Pointer, n uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func ProxyGetHeaderMapPairs(mt uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_set_header_map_pairs
func ProxySetHeaderMapPairs(mt uint32, ptr unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_get_header_map_size
func ProxyGetHeaderMapSize(mt uint32, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_value
func ProxyGetHeaderMapValue(mt uint32, kPtr unsafe.Pointer, kSize uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_add_header_map_value
func ProxyAddHeaderMapValue(mt uint32, kPtr unsafe.Pointer, kSize uint32, vPtr unsafe.Pointer, vSize uint32) uint32

//go:wasmimport env proxy_replace_header_map_value
func ProxyReplaceHeaderMapValue(mt uint32, kPtr unsafe.Pointer, kSize uint32, vPtr unsafe.Pointer, vSize uint32) uint32

//go:wasmimport env proxy_remove_header_map_value
func ProxyRemoveHeaderMapValue(mt uint32, kPtr unsafe.Pointer, kSize uint32) uint32

//go:wasmimport env proxy_send_local_response
func ProxySendLocalResponse(code uint32, dPtr unsafe.Pointer, dSize uint32, bPtr unsafe.Pointer, bSize uint32, hPtr unsafe.Pointer, hSize uint32, grpc int32) uint32

//go:wasmimport env proxy_continue_stream
func ProxyContinueStream(st uint32) uint32

//go:wasmimport env proxy_close_stream
func ProxyCloseStream(st uint32) uint32

//go:wasmimport env proxy_http_call
func ProxyHTTPCall(uPtr unsafe.Pointer, uSize uint32, hPtr unsafe.Pointer, hSize uint32, bPtr unsafe.Pointer, bSize uint32, tPtr unsafe.Pointer, tSize uint32, timeout uint32, token unsafe.Pointer) uint32

//go:wasmimport env proxy_get_status
func ProxyGetStatus(code, msgPtr, msgSize unsafe.Pointer) uint32

//go:wasmimport env proxy_get_shared_data
func ProxyGetSharedData(kPtr unsafe.Pointer, kSize uint32, retPtr, retSize, cas unsafe.Pointer) uint32

//go:wasmimport env proxy_set_shared_data
func ProxySetSharedData(kPtr unsafe.Pointer, kSize uint32, vPtr unsafe.Pointer, vSize uint32, cas uint32) uint32

//go:wasmimport env proxy_register_shared_queue
func ProxyRegisterSharedQueue(nPtr unsafe.Pointer, nSize uint32, token unsafe.Pointer) uint32

//go:wasmimport env proxy_resolve_shared_queue
func ProxyResolveSharedQueue(vPtr unsafe.Pointer, vSize uint32, nPtr unsafe.Pointer, nSize uint32, token unsafe.Pointer) uint32

//go:wasmimport env proxy_enqueue_shared_queue
func ProxyEnqueueSharedQueue(token uint32, ptr unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_dequeue_shared_queue
func ProxyDequeueSharedQueue(token uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_define_metric
func ProxyDefineMetric(mt uint32, nPtr unsafe.Pointer, nSize uint32, id unsafe.Pointer) uint32

//go:wasmimport env proxy_increment_metric
func ProxyIncrementMetric(id uint32, delta int64) uint32

//go:wasmimport env proxy_record_metric
func ProxyRecordMetric(id uint32, v uint64) uint32

//go:wasmimport env proxy_get_metric
func ProxyGetMetric(id uint32, ret unsafe.Pointer) uint32

//go:wasmimport env proxy_set_effective_context
func ProxySetEffectiveContext(id uint32) uint32

//go:wasmimport env proxy_done
func ProxyDone() uint32

//go:wasmimport env proxy_call_foreign_function
func ProxyCallForeignFunction(nPtr unsafe.Pointer, nSize uint32, aPtr unsafe.Pointer, aSize uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_grpc_call
func ProxyGrpcCall(a, b unsafe.Pointer, c uint32, d unsafe.Pointer, e uint32, f unsafe.Pointer, g uint32, h unsafe.Pointer, i uint32, j unsafe.Pointer, k uint32, token unsafe.Pointer) uint32

// keep holds buffers the host allocated through proxy_on_memory_allocate until the guest
// reads them: the GC would otherwise be free to reuse them.
var keep = map[uint32][]byte{}

// Alloc is the body of proxy_on_memory_allocate (or malloc).
func Alloc(size uint32) uint32 {
	n := size
	if n == 0 {
		n = 1
	}
	b := make([]byte, n)
	p := uint32(uintptr(unsafe.Pointer(&b[0])))
	keep[p] = b
	return p
}

// Take returns and releases a host-allocated buffer.
func Take(ptr, size uint32) []byte {
	if ptr == 0 || size == 0 {
		delete(keep, ptr)
		return nil
	}
	b, ok := keep[ptr]
	if !ok {
		// Not allocated by us: read the memory directly.
		return unsafe.Slice((*byte)(unsafe.Pointer(uintptr(ptr))), size)
	}
	delete(keep, ptr)
	return b[:size]
}

// Kept reports how many host buffers are still held (leak detection in tests).
func Kept() int { return len(keep) }

func ptr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

func sptr(s string) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.StringData(s))
}

// Log logs at level (2 = info).
func Log(level uint32, msg string) uint32 {
	return ProxyLog(level, sptr(msg), uint32(len(msg)))
}

// Header reads one header of map mt.
func Header(mt uint32, key string) (string, uint32) {
	var p, n uint32
	st := ProxyGetHeaderMapValue(mt, sptr(key), uint32(len(key)), unsafe.Pointer(&p), unsafe.Pointer(&n))
	if st != OK {
		return "", st
	}
	return string(Take(p, n)), OK
}

// AddHeader adds a header.
func AddHeader(mt uint32, k, v string) uint32 {
	return ProxyAddHeaderMapValue(mt, sptr(k), uint32(len(k)), sptr(v), uint32(len(v)))
}

// ReplaceHeader sets a header.
func ReplaceHeader(mt uint32, k, v string) uint32 {
	return ProxyReplaceHeaderMapValue(mt, sptr(k), uint32(len(k)), sptr(v), uint32(len(v)))
}

// RemoveHeader removes a header.
func RemoveHeader(mt uint32, k string) uint32 {
	return ProxyRemoveHeaderMapValue(mt, sptr(k), uint32(len(k)))
}

// Pairs reads a whole map.
func Pairs(mt uint32) ([][2]string, uint32) {
	var p, n uint32
	st := ProxyGetHeaderMapPairs(mt, unsafe.Pointer(&p), unsafe.Pointer(&n))
	if st != OK {
		return nil, st
	}
	return DecodePairs(Take(p, n)), OK
}

// SetPairs replaces a whole map.
func SetPairs(mt uint32, pairs [][2]string) uint32 {
	b := EncodePairs(pairs)
	return ProxySetHeaderMapPairs(mt, ptr(b), uint32(len(b)))
}

// Buffer reads buffer bt.
func Buffer(bt, start, max uint32) ([]byte, uint32) {
	var p, n uint32
	st := ProxyGetBufferBytes(bt, start, max, unsafe.Pointer(&p), unsafe.Pointer(&n))
	if st != OK {
		return nil, st
	}
	return append([]byte(nil), Take(p, n)...), OK
}

// SetBuffer writes buffer bt.
func SetBuffer(bt, start, size uint32, data []byte) uint32 {
	return ProxySetBufferBytes(bt, start, size, ptr(data), uint32(len(data)))
}

// Property reads a property at path.
func Property(path ...string) ([]byte, uint32) {
	var b []byte
	for i, s := range path {
		if i > 0 {
			b = append(b, 0)
		}
		b = append(b, s...)
	}
	var p, n uint32
	st := ProxyGetProperty(ptr(b), uint32(len(b)), unsafe.Pointer(&p), unsafe.Pointer(&n))
	if st != OK {
		return nil, st
	}
	return append([]byte(nil), Take(p, n)...), OK
}

// SetProperty sets a property.
func SetProperty(path string, value []byte) uint32 {
	return ProxySetProperty(sptr(path), uint32(len(path)), ptr(value), uint32(len(value)))
}

// SendLocalResponse sends a local reply.
func SendLocalResponse(code uint32, details string, body []byte, headers [][2]string, grpc int32) uint32 {
	h := EncodePairs(headers)
	return ProxySendLocalResponse(code, sptr(details), uint32(len(details)), ptr(body), uint32(len(body)), ptr(h), uint32(len(h)), grpc)
}

// HTTPCall dispatches an HTTP call.
func HTTPCall(cluster string, headers [][2]string, body []byte, trailers [][2]string, timeout uint32) (uint32, uint32) {
	h := EncodePairs(headers)
	var t []byte
	if len(trailers) > 0 {
		t = EncodePairs(trailers)
	}
	var token uint32
	st := ProxyHTTPCall(sptr(cluster), uint32(len(cluster)), ptr(h), uint32(len(h)), ptr(body), uint32(len(body)), ptr(t), uint32(len(t)), timeout, unsafe.Pointer(&token))
	return token, st
}

// SharedData reads shared data.
func SharedData(key string) ([]byte, uint32, uint32) {
	var p, n, cas uint32
	st := ProxyGetSharedData(sptr(key), uint32(len(key)), unsafe.Pointer(&p), unsafe.Pointer(&n), unsafe.Pointer(&cas))
	if st != OK {
		return nil, 0, st
	}
	return append([]byte(nil), Take(p, n)...), cas, OK
}

// SetSharedData writes shared data.
func SetSharedData(key string, v []byte, cas uint32) uint32 {
	return ProxySetSharedData(sptr(key), uint32(len(key)), ptr(v), uint32(len(v)), cas)
}

// RegisterQueue registers a shared queue.
func RegisterQueue(name string) (uint32, uint32) {
	var id uint32
	st := ProxyRegisterSharedQueue(sptr(name), uint32(len(name)), unsafe.Pointer(&id))
	return id, st
}

// ResolveQueue resolves a shared queue.
func ResolveQueue(vmID, name string) (uint32, uint32) {
	var id uint32
	st := ProxyResolveSharedQueue(sptr(vmID), uint32(len(vmID)), sptr(name), uint32(len(name)), unsafe.Pointer(&id))
	return id, st
}

// Enqueue enqueues.
func Enqueue(id uint32, v []byte) uint32 { return ProxyEnqueueSharedQueue(id, ptr(v), uint32(len(v))) }

// Dequeue dequeues.
func Dequeue(id uint32) ([]byte, uint32) {
	var p, n uint32
	st := ProxyDequeueSharedQueue(id, unsafe.Pointer(&p), unsafe.Pointer(&n))
	if st != OK {
		return nil, st
	}
	return append([]byte(nil), Take(p, n)...), OK
}

// DefineMetric defines a metric.
func DefineMetric(mt uint32, name string) (uint32, uint32) {
	var id uint32
	st := ProxyDefineMetric(mt, sptr(name), uint32(len(name)), unsafe.Pointer(&id))
	return id, st
}

// Metric reads a metric.
func Metric(id uint32) (uint64, uint32) {
	var v uint64
	st := ProxyGetMetric(id, unsafe.Pointer(&v))
	return v, st
}

// CallForeign calls a foreign function.
func CallForeign(name string, args []byte) ([]byte, uint32) {
	var p, n uint32
	st := ProxyCallForeignFunction(sptr(name), uint32(len(name)), ptr(args), uint32(len(args)), unsafe.Pointer(&p), unsafe.Pointer(&n))
	if st != OK {
		return nil, st
	}
	return append([]byte(nil), Take(p, n)...), OK
}

// Now reads the host clock.
func Now() (uint64, uint32) {
	var v uint64
	st := ProxyGetCurrentTimeNanoseconds(unsafe.Pointer(&v))
	return v, st
}

// EncodePairs serialises pairs the proxy-wasm way.
func EncodePairs(pairs [][2]string) []byte {
	size := 4
	for _, p := range pairs {
		size += 8 + len(p[0]) + len(p[1]) + 2
	}
	b := make([]byte, 0, size)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pairs)))
	for _, p := range pairs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[1])))
	}
	for _, p := range pairs {
		b = append(b, p[0]...)
		b = append(b, 0)
		b = append(b, p[1]...)
		b = append(b, 0)
	}
	return b
}

// DecodePairs parses serialised pairs; malformed input yields what could be read.
func DecodePairs(b []byte) [][2]string {
	if len(b) < 4 {
		return nil
	}
	n := int(binary.LittleEndian.Uint32(b))
	if 4+8*n > len(b) {
		return nil
	}
	out := make([][2]string, 0, n)
	data := 4 + 8*n
	for i := 0; i < n; i++ {
		kl := int(binary.LittleEndian.Uint32(b[4+8*i:]))
		vl := int(binary.LittleEndian.Uint32(b[8+8*i:]))
		if data+kl+vl+2 > len(b) {
			return out
		}
		k := string(b[data : data+kl])
		data += kl + 1
		v := string(b[data : data+vl])
		data += vl + 1
		out = append(out, [2]string{k, v})
	}
	return out
}
