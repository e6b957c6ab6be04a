//go:build wasip1 && !tinygo

package proxywasm

// Host functions of proxy-wasm ABI v0.2.1, module "env", names as in the spec and in the
// SDK's internal/abi_hostcalls.go.
//
// Every pointer and size is 32-bit on the wire, but GOARCH=wasm is a 64-bit Go port
// (int, uintptr and pointers are 8 bytes in Go's view). So:
//   - sizes and ids are uint32 here, never int;
//   - results the host writes (a pointer, a size, an id) go through *uint32 (or *uint64
//     for metric values), never through **byte or *int: the host writes exactly 4 bytes,
//     and the address it writes is memory from proxy_on_memory_allocate that the guest
//     resolves through its allocation table (see hostmem);
//   - input buffers are passed as *byte plus a uint32 length, strings as string (which
//     go:wasmimport lowers to an i32 pointer and an i32 length).
//
// The compiler treats every pointer passed to a go:wasmimport function as escaping, so the
// result slots and buffers live on the heap, never on a goroutine stack. That matters
// because the host calls back into the guest during these calls (proxy_on_memory_allocate
// at least), and a callback that grows the stack would move a stack slot after the host
// took its address. Buffers are also passed to runtime.KeepAlive after each call (see
// keepBytes/keepString) so a GC during such a callback cannot free them.

//go:wasmimport env proxy_log
func hostLog(level uint32, message string) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func hostSetTickPeriodMilliseconds(period uint32) uint32

//go:wasmimport env proxy_set_effective_context
func hostSetEffectiveContext(contextID uint32) uint32

//go:wasmimport env proxy_done
func hostDone() uint32

//go:wasmimport env proxy_get_buffer_bytes
func hostGetBufferBytes(bufferType, start, maxSize uint32, returnData, returnSize *uint32) uint32

//go:wasmimport env proxy_set_buffer_bytes
func hostSetBufferBytes(bufferType, start, size uint32, data *byte, dataSize uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func hostGetHeaderMapPairs(mapType uint32, returnData, returnSize *uint32) uint32

//go:wasmimport env proxy_set_header_map_pairs
func hostSetHeaderMapPairs(mapType uint32, data *byte, size uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func hostGetHeaderMapValue(mapType uint32, key string, returnData, returnSize *uint32) uint32

//go:wasmimport env proxy_add_header_map_value
func hostAddHeaderMapValue(mapType uint32, key, value string) uint32

//go:wasmimport env proxy_replace_header_map_value
func hostReplaceHeaderMapValue(mapType uint32, key, value string) uint32

//go:wasmimport env proxy_remove_header_map_value
func hostRemoveHeaderMapValue(mapType uint32, key string) uint32

//go:wasmimport env proxy_continue_stream
func hostContinueStream(streamType uint32) uint32

//go:wasmimport env proxy_close_stream
func hostCloseStream(streamType uint32) uint32

//go:wasmimport env proxy_send_local_response
func hostSendLocalResponse(statusCode uint32, details string, body *byte, bodySize uint32,
	headers *byte, headersSize uint32, grpcStatus int32) uint32

//go:wasmimport env proxy_http_call
func hostHTTPCall(upstream string, headers *byte, headersSize uint32, body *byte, bodySize uint32,
	trailers *byte, trailersSize uint32, timeoutMilliseconds uint32, returnToken *uint32) uint32

//go:wasmimport env proxy_get_shared_data
func hostGetSharedData(key string, returnData, returnSize, returnCas *uint32) uint32

//go:wasmimport env proxy_set_shared_data
func hostSetSharedData(key string, value *byte, valueSize uint32, cas uint32) uint32

//go:wasmimport env proxy_register_shared_queue
func hostRegisterSharedQueue(name string, returnID *uint32) uint32

//go:wasmimport env proxy_resolve_shared_queue
func hostResolveSharedQueue(vmID, name string, returnID *uint32) uint32

//go:wasmimport env proxy_enqueue_shared_queue
func hostEnqueueSharedQueue(queueID uint32, value *byte, valueSize uint32) uint32

//go:wasmimport env proxy_dequeue_shared_queue
func hostDequeueSharedQueue(queueID uint32, returnData, returnSize *uint32) uint32

//go:wasmimport env proxy_define_metric
func hostDefineMetric(metricType uint32, name string, returnID *uint32) uint32

//go:wasmimport env proxy_increment_metric
func hostIncrementMetric(metricID uint32, offset int64) uint32

//go:wasmimport env proxy_record_metric
func hostRecordMetric(metricID uint32, value uint64) uint32

//go:wasmimport env proxy_get_metric
func hostGetMetric(metricID uint32, returnValue *uint64) uint32

//go:wasmimport env proxy_get_property
func hostGetProperty(path *byte, pathSize uint32, returnData, returnSize *uint32) uint32

//go:wasmimport env proxy_set_property
func hostSetProperty(path *byte, pathSize uint32, value *byte, valueSize uint32) uint32

//go:wasmimport env proxy_call_foreign_function
func hostCallForeignFunction(name string, args *byte, argsSize uint32, returnData, returnSize *uint32) uint32
