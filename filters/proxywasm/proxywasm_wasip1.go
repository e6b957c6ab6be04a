//go:build wasip1 && !tinygo

package proxywasm

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"unsafe"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasmesh/wasmesh/filters/proxywasm/internal/abi"
)

// errForeignMemory means the host returned a pointer the guest never allocated for it,
// or a size larger than it asked for. Reading it could hand the filter freed or foreign
// memory, so the call fails instead.
var errForeignMemory = fmt.Errorf("proxywasm: host returned memory not allocated through proxy_on_memory_allocate: %w",
	types.ErrorInternalFailure)

// keepBytes and keepString keep a buffer handed to the host alive until the host call
// has returned, even if the host calls back into the guest and a GC runs meanwhile.
// KeepAlive on the data pointer rather than on the slice or string avoids boxing them.
func keepBytes(b []byte)  { runtime.KeepAlive(unsafe.SliceData(b)) }
func keepString(s string) { runtime.KeepAlive(unsafe.StringData(s)) }

// SetVMContext installs the filter's VM context. Call it from func init(): a reactor
// module is started with _initialize, which runs package initialisers but never main.
func SetVMContext(ctx types.VMContext) { guest.vm.SetVMContext(ctx) }

// GetVMConfiguration returns vm_config.configuration; only available in OnVMStart.
func GetVMConfiguration() ([]byte, error) {
	return getBuffer(abi.BufferVMConfiguration, 0, math.MaxInt32)
}

// GetPluginConfiguration returns the plugin's configuration; only available in
// OnPluginStart.
func GetPluginConfiguration() ([]byte, error) {
	return getBuffer(abi.BufferPluginConfiguration, 0, math.MaxInt32)
}

// SetTickPeriodMilliSeconds sets the period of PluginContext.OnTick; 0 stops it.
func SetTickPeriodMilliSeconds(millSec uint32) error {
	return abi.StatusError(hostSetTickPeriodMilliseconds(millSec))
}

// SetEffectiveContext makes later host calls act on contextID, e.g. a stream from OnTick.
func SetEffectiveContext(contextID uint32) error {
	return abi.StatusError(hostSetEffectiveContext(contextID))
}

// RegisterSharedQueue registers (or opens) a shared queue whose OnQueueReady goes to the
// current plugin context.
func RegisterSharedQueue(name string) (queueID uint32, err error) {
	id := new(uint32)
	st := hostRegisterSharedQueue(name, id)
	keepString(name)
	return *id, abi.StatusError(st)
}

// ResolveSharedQueue finds the queue named queueName of the VM vmID.
func ResolveSharedQueue(vmID, queueName string) (queueID uint32, err error) {
	id := new(uint32)
	st := hostResolveSharedQueue(vmID, queueName, id)
	keepString(vmID)
	keepString(queueName)
	return *id, abi.StatusError(st)
}

// EnqueueSharedQueue appends data to a shared queue.
func EnqueueSharedQueue(queueID uint32, data []byte) error {
	p, n := bytesPtr(data)
	st := hostEnqueueSharedQueue(queueID, p, n)
	keepBytes(data)
	return abi.StatusError(st)
}

// DequeueSharedQueue removes and returns the oldest item of a shared queue;
// types.ErrorStatusEmpty when there is none.
func DequeueSharedQueue(queueID uint32) ([]byte, error) {
	var r hostResult
	r.begin()
	defer r.end()
	return r.owned(hostDequeueSharedQueue(queueID, r.ptr(), r.size()))
}

// PluginDone tells the host that a plugin context which returned false from OnPluginDone
// has finished.
func PluginDone() { hostDone() }

// DispatchHttpCall sends an HTTP request to cluster; callBack runs with the response
// (GetHttpCallResponse* are available inside it) on the context that dispatched it.
func DispatchHttpCall(
	cluster string,
	headers [][2]string,
	body []byte,
	trailers [][2]string,
	timeoutMillisecond uint32,
	callBack func(numHeaders, bodySize, numTrailers int),
) (calloutID uint32, err error) {
	hs := abi.EncodePairs(headers)
	ts := abi.EncodePairs(trailers)
	return guest.vm.DispatchHTTPCall(callBack, func() (uint32, error) {
		token := new(uint32)
		hp, hn := bytesPtr(hs)
		bp, bn := bytesPtr(body)
		tp, tn := bytesPtr(ts)
		st := hostHTTPCall(cluster, hp, hn, bp, bn, tp, tn, timeoutMillisecond, token)
		keepString(cluster)
		keepBytes(hs)
		keepBytes(body)
		keepBytes(ts)
		return *token, abi.StatusError(st)
	})
}

// GetHttpCallResponseHeaders returns the headers of a DispatchHttpCall response.
func GetHttpCallResponseHeaders() ([][2]string, error) {
	return getMap(abi.MapHTTPCallResponseHeaders)
}

// GetHttpCallResponseBody returns up to maxSize bytes from start of a DispatchHttpCall
// response body.
func GetHttpCallResponseBody(start, maxSize int) ([]byte, error) {
	return getBuffer(abi.BufferHTTPCallResponseBody, start, maxSize)
}

// GetHttpCallResponseTrailers returns the trailers of a DispatchHttpCall response.
func GetHttpCallResponseTrailers() ([][2]string, error) {
	return getMap(abi.MapHTTPCallResponseTrailers)
}

// GetDownstreamData returns buffered downstream TCP data; only in OnDownstreamData.
func GetDownstreamData(start, maxSize int) ([]byte, error) {
	return getBuffer(abi.BufferDownstreamData, start, maxSize)
}

// AppendDownstreamData appends to the buffered downstream TCP data.
func AppendDownstreamData(data []byte) error { return appendToBuffer(abi.BufferDownstreamData, data) }

// PrependDownstreamData prepends to the buffered downstream TCP data.
func PrependDownstreamData(data []byte) error {
	return prependToBuffer(abi.BufferDownstreamData, data)
}

// ReplaceDownstreamData replaces the buffered downstream TCP data.
func ReplaceDownstreamData(data []byte) error { return replaceBuffer(abi.BufferDownstreamData, data) }

// GetUpstreamData returns buffered upstream TCP data; only in OnUpstreamData.
func GetUpstreamData(start, maxSize int) ([]byte, error) {
	return getBuffer(abi.BufferUpstreamData, start, maxSize)
}

// AppendUpstreamData appends to the buffered upstream TCP data.
func AppendUpstreamData(data []byte) error { return appendToBuffer(abi.BufferUpstreamData, data) }

// PrependUpstreamData prepends to the buffered upstream TCP data.
func PrependUpstreamData(data []byte) error { return prependToBuffer(abi.BufferUpstreamData, data) }

// ReplaceUpstreamData replaces the buffered upstream TCP data.
func ReplaceUpstreamData(data []byte) error { return replaceBuffer(abi.BufferUpstreamData, data) }

// ContinueTcpStream resumes a TCP stream paused by a TcpContext callback. Like the SDK it
// passes the downstream stream type: Envoy does not implement continuing by direction.
func ContinueTcpStream() error {
	return abi.StatusError(hostContinueStream(abi.StreamDownstream))
}

// CloseDownstream closes the downstream connection of this TCP context.
func CloseDownstream() error { return abi.StatusError(hostCloseStream(abi.StreamDownstream)) }

// CloseUpstream closes the upstream connection of this TCP context.
func CloseUpstream() error { return abi.StatusError(hostCloseStream(abi.StreamUpstream)) }

// GetHttpRequestHeaders returns all request headers.
func GetHttpRequestHeaders() ([][2]string, error) { return getMap(abi.MapHTTPRequestHeaders) }

// ReplaceHttpRequestHeaders replaces all request headers.
func ReplaceHttpRequestHeaders(headers [][2]string) error {
	return setMap(abi.MapHTTPRequestHeaders, headers)
}

// GetHttpRequestHeader returns the first value of a request header.
func GetHttpRequestHeader(key string) (string, error) {
	return getMapValue(abi.MapHTTPRequestHeaders, key)
}

// RemoveHttpRequestHeader removes a request header.
func RemoveHttpRequestHeader(key string) error {
	return removeMapValue(abi.MapHTTPRequestHeaders, key)
}

// ReplaceHttpRequestHeader sets a request header, replacing its first value.
func ReplaceHttpRequestHeader(key, value string) error {
	return replaceMapValue(abi.MapHTTPRequestHeaders, key, value)
}

// AddHttpRequestHeader adds a value to a request header.
func AddHttpRequestHeader(key, value string) error {
	return addMapValue(abi.MapHTTPRequestHeaders, key, value)
}

// GetHttpRequestBody returns buffered request body bytes; only in OnHttpRequestBody.
func GetHttpRequestBody(start, maxSize int) ([]byte, error) {
	return getBuffer(abi.BufferHTTPRequestBody, start, maxSize)
}

// AppendHttpRequestBody appends to the buffered request body.
func AppendHttpRequestBody(data []byte) error {
	return appendToBuffer(abi.BufferHTTPRequestBody, data)
}

// PrependHttpRequestBody prepends to the buffered request body.
func PrependHttpRequestBody(data []byte) error {
	return prependToBuffer(abi.BufferHTTPRequestBody, data)
}

// ReplaceHttpRequestBody replaces the buffered request body.
func ReplaceHttpRequestBody(data []byte) error {
	return replaceBuffer(abi.BufferHTTPRequestBody, data)
}

// GetHttpRequestTrailers returns all request trailers.
func GetHttpRequestTrailers() ([][2]string, error) { return getMap(abi.MapHTTPRequestTrailers) }

// ReplaceHttpRequestTrailers replaces all request trailers.
func ReplaceHttpRequestTrailers(trailers [][2]string) error {
	return setMap(abi.MapHTTPRequestTrailers, trailers)
}

// GetHttpRequestTrailer returns the first value of a request trailer.
func GetHttpRequestTrailer(key string) (string, error) {
	return getMapValue(abi.MapHTTPRequestTrailers, key)
}

// RemoveHttpRequestTrailer removes a request trailer.
func RemoveHttpRequestTrailer(key string) error {
	return removeMapValue(abi.MapHTTPRequestTrailers, key)
}

// ReplaceHttpRequestTrailer sets a request trailer, replacing its first value.
func ReplaceHttpRequestTrailer(key, value string) error {
	return replaceMapValue(abi.MapHTTPRequestTrailers, key, value)
}

// AddHttpRequestTrailer adds a value to a request trailer.
func AddHttpRequestTrailer(key, value string) error {
	return addMapValue(abi.MapHTTPRequestTrailers, key, value)
}

// ResumeHttpRequest resumes a request paused by an HttpContext callback.
func ResumeHttpRequest() error { return abi.StatusError(hostContinueStream(abi.StreamHTTPRequest)) }

// GetHttpResponseHeaders returns all response headers.
func GetHttpResponseHeaders() ([][2]string, error) { return getMap(abi.MapHTTPResponseHeaders) }

// ReplaceHttpResponseHeaders replaces all response headers.
func ReplaceHttpResponseHeaders(headers [][2]string) error {
	return setMap(abi.MapHTTPResponseHeaders, headers)
}

// GetHttpResponseHeader returns the first value of a response header.
func GetHttpResponseHeader(key string) (string, error) {
	return getMapValue(abi.MapHTTPResponseHeaders, key)
}

// RemoveHttpResponseHeader removes a response header.
func RemoveHttpResponseHeader(key string) error {
	return removeMapValue(abi.MapHTTPResponseHeaders, key)
}

// ReplaceHttpResponseHeader sets a response header, replacing its first value.
func ReplaceHttpResponseHeader(key, value string) error {
	return replaceMapValue(abi.MapHTTPResponseHeaders, key, value)
}

// AddHttpResponseHeader adds a value to a response header.
func AddHttpResponseHeader(key, value string) error {
	return addMapValue(abi.MapHTTPResponseHeaders, key, value)
}

// GetHttpResponseBody returns buffered response body bytes; only in OnHttpResponseBody.
func GetHttpResponseBody(start, maxSize int) ([]byte, error) {
	return getBuffer(abi.BufferHTTPResponseBody, start, maxSize)
}

// AppendHttpResponseBody appends to the buffered response body.
func AppendHttpResponseBody(data []byte) error {
	return appendToBuffer(abi.BufferHTTPResponseBody, data)
}

// PrependHttpResponseBody prepends to the buffered response body.
func PrependHttpResponseBody(data []byte) error {
	return prependToBuffer(abi.BufferHTTPResponseBody, data)
}

// ReplaceHttpResponseBody replaces the buffered response body.
func ReplaceHttpResponseBody(data []byte) error {
	return replaceBuffer(abi.BufferHTTPResponseBody, data)
}

// GetHttpResponseTrailers returns all response trailers.
func GetHttpResponseTrailers() ([][2]string, error) { return getMap(abi.MapHTTPResponseTrailers) }

// ReplaceHttpResponseTrailers replaces all response trailers.
func ReplaceHttpResponseTrailers(trailers [][2]string) error {
	return setMap(abi.MapHTTPResponseTrailers, trailers)
}

// GetHttpResponseTrailer returns the first value of a response trailer.
func GetHttpResponseTrailer(key string) (string, error) {
	return getMapValue(abi.MapHTTPResponseTrailers, key)
}

// RemoveHttpResponseTrailer removes a response trailer.
func RemoveHttpResponseTrailer(key string) error {
	return removeMapValue(abi.MapHTTPResponseTrailers, key)
}

// ReplaceHttpResponseTrailer sets a response trailer, replacing its first value.
func ReplaceHttpResponseTrailer(key, value string) error {
	return replaceMapValue(abi.MapHTTPResponseTrailers, key, value)
}

// AddHttpResponseTrailer adds a value to a response trailer.
func AddHttpResponseTrailer(key, value string) error {
	return addMapValue(abi.MapHTTPResponseTrailers, key, value)
}

// ResumeHttpResponse resumes a response paused by an HttpContext callback.
func ResumeHttpResponse() error {
	return abi.StatusError(hostContinueStream(abi.StreamHTTPResponse))
}

// SendHttpResponse answers the request locally instead of forwarding it. gRPCStatus -1
// means the response is not a gRPC status. The host may run this stream's response
// callbacks before the call returns.
func SendHttpResponse(statusCode uint32, headers [][2]string, body []byte, gRPCStatus int32) error {
	hs := abi.EncodePairs(headers)
	hp, hn := bytesPtr(hs)
	bp, bn := bytesPtr(body)
	st := hostSendLocalResponse(statusCode, "", bp, bn, hp, hn, gRPCStatus)
	keepBytes(hs)
	keepBytes(body)
	return abi.StatusError(st)
}

// GetSharedData returns the value and CAS of a key in the VM-wide shared data.
func GetSharedData(key string) (value []byte, cas uint32, err error) {
	var r hostResult
	r.begin()
	defer r.end()
	st := hostGetSharedData(key, r.ptr(), r.size(), r.cas())
	keepString(key)
	value, err = r.owned(st)
	if err != nil {
		return nil, 0, err
	}
	return value, *r.cas(), nil
}

// AppendSharedData appends the value of a key in the VM-wide shared data to dst and
// returns it with its CAS (dst unchanged on error): GetSharedData without a result
// allocation. Not in the SDK.
func AppendSharedData(dst []byte, key string) ([]byte, uint32, error) {
	var r hostResult
	r.begin()
	defer r.end()
	st := hostGetSharedData(key, r.ptr(), r.size(), r.cas())
	keepString(key)
	b, err := r.view(st)
	if err != nil {
		return dst, 0, err
	}
	return append(dst, b...), *r.cas(), nil
}

// SetSharedData sets a key in the VM-wide shared data; a non-zero cas must match
// (types.ErrorStatusCasMismatch otherwise).
func SetSharedData(key string, data []byte, cas uint32) error {
	p, n := bytesPtr(data)
	st := hostSetSharedData(key, p, n, cas)
	keepString(key)
	keepBytes(data)
	return abi.StatusError(st)
}

// GetProperty returns the host property at path; see the SDK for Envoy's attributes.
func GetProperty(path []string) ([]byte, error) {
	if len(path) == 0 {
		return nil, errors.New("path must not be empty")
	}
	var r hostResult
	r.begin()
	defer r.end()
	raw := encodePath(path)
	pp, pn := bytesPtr(raw)
	st := hostGetProperty(pp, pn, r.ptr(), r.size())
	keepBytes(raw)
	return r.owned(st)
}

// encodePath returns path encoded (see abi.EncodePath), from a small cache of recent
// paths: filters read the same few properties on every request, and encoding in the guest
// costs more than the host call itself. The cache holds copies of the segment strings'
// headers, not the caller's slice, so a path built in place does not escape.
func encodePath(path []string) []byte {
	if len(path) == 0 {
		return nil
	}
	last := path[len(path)-1]
	slot := len(path)*31 + len(last)*7
	if len(last) > 0 {
		slot += int(last[0])
	}
	e := &guest.paths[slot%len(guest.paths)]
	if slices.Equal(e.path, path) {
		return e.raw
	}
	e.path = append(e.path[:0], path...)
	e.raw = abi.EncodePath(path)
	return e.raw
}

// AppendProperty appends the value of the host property at path to dst and returns the
// extended slice (dst unchanged on error). It is GetProperty for hot paths that decode or
// compare the value at once: the result is not allocated. Not in the SDK.
func AppendProperty(dst []byte, path []string) ([]byte, error) {
	if len(path) == 0 {
		return dst, errors.New("path must not be empty")
	}
	var r hostResult
	r.begin()
	defer r.end()
	raw := encodePath(path)
	pp, pn := bytesPtr(raw)
	st := hostGetProperty(pp, pn, r.ptr(), r.size())
	keepBytes(raw)
	b, err := r.view(st)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

// AppendHttpRequestHeader appends the first value of a request header to dst, like
// AppendProperty for GetHttpRequestHeader. Not in the SDK.
func AppendHttpRequestHeader(dst []byte, key string) ([]byte, error) {
	return appendMapValue(dst, abi.MapHTTPRequestHeaders, key)
}

// AppendHttpResponseHeader appends the first value of a response header to dst, like
// AppendProperty for GetHttpResponseHeader. Not in the SDK.
func AppendHttpResponseHeader(dst []byte, key string) ([]byte, error) {
	return appendMapValue(dst, abi.MapHTTPResponseHeaders, key)
}

// GetPropertyMap returns a map-typed host property decoded as pairs.
func GetPropertyMap(path []string) ([][2]string, error) {
	b, err := GetProperty(path)
	if err != nil {
		return nil, err
	}
	return abi.DecodePairs(b)
}

// SetProperty sets the host property at path.
func SetProperty(path []string, data []byte) error {
	if len(path) == 0 {
		return errors.New("path must not be empty")
	} else if len(data) == 0 {
		return errors.New("data must not be empty")
	}
	raw := abi.EncodePath(path)
	pp, pn := bytesPtr(raw)
	dp, dn := bytesPtr(data)
	st := hostSetProperty(pp, pn, dp, dn)
	keepBytes(raw)
	keepBytes(data)
	return abi.StatusError(st)
}

// CallForeignFunction calls a host-specific function by name.
func CallForeignFunction(funcName string, param []byte) (ret []byte, err error) {
	pp, pn := bytesPtr(param)
	var r hostResult
	r.begin()
	defer r.end()
	st := hostCallForeignFunction(funcName, pp, pn, r.ptr(), r.size())
	keepString(funcName)
	keepBytes(param)
	return r.owned(st)
}

// LogTrace logs msg at trace level.
func LogTrace(msg string) { logMessage(abi.LogTrace, msg) }

// LogTracef logs a formatted message at trace level.
func LogTracef(format string, args ...any) { logMessage(abi.LogTrace, fmt.Sprintf(format, args...)) }

// LogDebug logs msg at debug level.
func LogDebug(msg string) { logMessage(abi.LogDebug, msg) }

// LogDebugf logs a formatted message at debug level.
func LogDebugf(format string, args ...any) { logMessage(abi.LogDebug, fmt.Sprintf(format, args...)) }

// LogInfo logs msg at info level.
func LogInfo(msg string) { logMessage(abi.LogInfo, msg) }

// LogInfof logs a formatted message at info level.
func LogInfof(format string, args ...any) { logMessage(abi.LogInfo, fmt.Sprintf(format, args...)) }

// LogWarn logs msg at warn level.
func LogWarn(msg string) { logMessage(abi.LogWarn, msg) }

// LogWarnf logs a formatted message at warn level.
func LogWarnf(format string, args ...any) { logMessage(abi.LogWarn, fmt.Sprintf(format, args...)) }

// LogError logs msg at error level.
func LogError(msg string) { logMessage(abi.LogError, msg) }

// LogErrorf logs a formatted message at error level.
func LogErrorf(format string, args ...any) { logMessage(abi.LogError, fmt.Sprintf(format, args...)) }

// LogCritical logs msg at critical level.
func LogCritical(msg string) { logMessage(abi.LogCritical, msg) }

// LogCriticalf logs a formatted message at critical level.
func LogCriticalf(format string, args ...any) {
	logMessage(abi.LogCritical, fmt.Sprintf(format, args...))
}

func logMessage(level uint32, msg string) {
	hostLog(level, msg)
	keepString(msg)
}

type (
	// MetricCounter is a counter; create it with DefineCounterMetric.
	MetricCounter uint32
	// MetricGauge is a gauge; create it with DefineGaugeMetric.
	MetricGauge uint32
	// MetricHistogram is a histogram; create it with DefineHistogramMetric.
	MetricHistogram uint32
)

// DefineCounterMetric defines (or finds) the counter called name. It panics if the host
// refuses, as the SDK does.
func DefineCounterMetric(name string) MetricCounter {
	return MetricCounter(defineMetric(abi.MetricCounter, name))
}

// Value returns the counter's current value.
func (m MetricCounter) Value() uint64 { return metricValue(uint32(m)) }

// Increment adds offset to the counter.
func (m MetricCounter) Increment(offset uint64) { incrementMetric(uint32(m), int64(offset)) }

// DefineGaugeMetric defines (or finds) the gauge called name.
func DefineGaugeMetric(name string) MetricGauge {
	return MetricGauge(defineMetric(abi.MetricGauge, name))
}

// Value returns the gauge's current value.
func (m MetricGauge) Value() int64 { return int64(metricValue(uint32(m))) }

// Add adds offset (which may be negative) to the gauge.
func (m MetricGauge) Add(offset int64) { incrementMetric(uint32(m), offset) }

// DefineHistogramMetric defines (or finds) the histogram called name.
func DefineHistogramMetric(name string) MetricHistogram {
	return MetricHistogram(defineMetric(abi.MetricHistogram, name))
}

// Value returns the histogram's current value as the host reports it.
func (m MetricHistogram) Value() uint64 { return metricValue(uint32(m)) }

// Record records a value in the histogram.
func (m MetricHistogram) Record(value uint64) {
	if err := abi.StatusError(hostRecordMetric(uint32(m), value)); err != nil {
		panic(fmt.Sprintf("record %d in metric %d: %v", value, uint32(m), err))
	}
}

func defineMetric(metricType uint32, name string) uint32 {
	id := new(uint32)
	st := hostDefineMetric(metricType, name, id)
	keepString(name)
	if err := abi.StatusError(st); err != nil {
		panic(fmt.Sprintf("define metric %q: %v", name, err))
	}
	return *id
}

func metricValue(id uint32) uint64 {
	v := new(uint64)
	if err := abi.StatusError(hostGetMetric(id, v)); err != nil {
		panic(fmt.Sprintf("get metric %d: %v", id, err))
	}
	return *v
}

func incrementMetric(id uint32, offset int64) {
	if err := abi.StatusError(hostIncrementMetric(id, offset)); err != nil {
		panic(fmt.Sprintf("increment metric %d by %d: %v", id, offset, err))
	}
}

func setMap(mapType uint32, pairs [][2]string) error {
	b := abi.EncodePairs(pairs)
	p, n := bytesPtr(b)
	st := hostSetHeaderMapPairs(mapType, p, n)
	keepBytes(b)
	return abi.StatusError(st)
}

func getMap(mapType uint32) ([][2]string, error) {
	var r hostResult
	r.begin()
	defer r.end()
	// Owned: the decoded strings share the buffer.
	b, err := r.owned(hostGetHeaderMapPairs(mapType, r.ptr(), r.size()))
	if err != nil {
		return nil, err
	}
	if b == nil { // the SDK reports a map the host returned no memory for as not found
		return nil, types.ErrorStatusNotFound
	}
	return abi.DecodePairs(b)
}

func getMapValue(mapType uint32, key string) (string, error) {
	var r hostResult
	r.begin()
	defer r.end()
	st := hostGetHeaderMapValue(mapType, key, r.ptr(), r.size())
	keepString(key)
	b, err := r.view(st)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func appendMapValue(dst []byte, mapType uint32, key string) ([]byte, error) {
	var r hostResult
	r.begin()
	defer r.end()
	st := hostGetHeaderMapValue(mapType, key, r.ptr(), r.size())
	keepString(key)
	b, err := r.view(st)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

func addMapValue(mapType uint32, key, value string) error {
	st := hostAddHeaderMapValue(mapType, key, value)
	keepString(key)
	keepString(value)
	return abi.StatusError(st)
}

func replaceMapValue(mapType uint32, key, value string) error {
	st := hostReplaceHeaderMapValue(mapType, key, value)
	keepString(key)
	keepString(value)
	return abi.StatusError(st)
}

func removeMapValue(mapType uint32, key string) error {
	st := hostRemoveHeaderMapValue(mapType, key)
	keepString(key)
	return abi.StatusError(st)
}

// bufferRange converts the SDK's int offsets to the ABI's u32, rejecting what cannot be
// represented rather than truncating it (int is 64-bit on GOARCH=wasm).
func bufferRange(start, maxSize int) (uint32, uint32, error) {
	if start < 0 || maxSize < 0 || start > math.MaxUint32 {
		return 0, 0, types.ErrorStatusBadArgument
	}
	return uint32(start), uint32(min(maxSize, math.MaxUint32)), nil
}

func getBuffer(bufferType uint32, start, maxSize int) ([]byte, error) {
	s, m, err := bufferRange(start, maxSize)
	if err != nil {
		return nil, err
	}
	var r hostResult
	r.begin()
	defer r.end()
	b, err := r.owned(hostGetBufferBytes(bufferType, s, m, r.ptr(), r.size()))
	if err != nil {
		return nil, err
	}
	if b == nil { // as in the SDK: no memory means no buffer
		return nil, types.ErrorStatusNotFound
	}
	return b, nil
}

// The three buffer edits use the SDK's start/size conventions, which Envoy reads as
// append (start past the end), prepend (start 0, size 0) and replace (start 0, size max).

func appendToBuffer(bufferType uint32, data []byte) error {
	return setBuffer(bufferType, math.MaxInt32, 0, data)
}

func prependToBuffer(bufferType uint32, data []byte) error {
	return setBuffer(bufferType, 0, 0, data)
}

func replaceBuffer(bufferType uint32, data []byte) error {
	return setBuffer(bufferType, 0, math.MaxInt32, data)
}

func setBuffer(bufferType, start, size uint32, data []byte) error {
	p, n := bytesPtr(data)
	st := hostSetBufferBytes(bufferType, start, size, p, n)
	keepBytes(data)
	return abi.StatusError(st)
}
