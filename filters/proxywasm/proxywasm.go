//go:build !wasip1 || tinygo

package proxywasm

// Everywhere but the standard toolchain's wasip1 build the real SDK works, so this file
// forwards to it: natively that is the SDK's mock host driven by proxytest, under TinyGo
// the SDK's own ABI layer. Each function is a wrapper with the SDK's exact signature
// (rather than a variable) so the API test can compare this file with the wasip1 one.

import (
	sdk "github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

type (
	// MetricCounter is the SDK's counter.
	MetricCounter = sdk.MetricCounter
	// MetricGauge is the SDK's gauge.
	MetricGauge = sdk.MetricGauge
	// MetricHistogram is the SDK's histogram.
	MetricHistogram = sdk.MetricHistogram
)

// SetVMContext installs the filter's VM context; call it from func init().
func SetVMContext(ctx types.VMContext) { sdk.SetVMContext(ctx) }

// GetVMConfiguration forwards to the SDK.
func GetVMConfiguration() ([]byte, error) { return sdk.GetVMConfiguration() }

// GetPluginConfiguration forwards to the SDK.
func GetPluginConfiguration() ([]byte, error) { return sdk.GetPluginConfiguration() }

// SetTickPeriodMilliSeconds forwards to the SDK.
func SetTickPeriodMilliSeconds(millSec uint32) error { return sdk.SetTickPeriodMilliSeconds(millSec) }

// SetEffectiveContext forwards to the SDK.
func SetEffectiveContext(contextID uint32) error { return sdk.SetEffectiveContext(contextID) }

// RegisterSharedQueue forwards to the SDK.
func RegisterSharedQueue(name string) (queueID uint32, err error) {
	return sdk.RegisterSharedQueue(name)
}

// ResolveSharedQueue forwards to the SDK.
func ResolveSharedQueue(vmID, queueName string) (queueID uint32, err error) {
	return sdk.ResolveSharedQueue(vmID, queueName)
}

// EnqueueSharedQueue forwards to the SDK.
func EnqueueSharedQueue(queueID uint32, data []byte) error {
	return sdk.EnqueueSharedQueue(queueID, data)
}

// DequeueSharedQueue forwards to the SDK.
func DequeueSharedQueue(queueID uint32) ([]byte, error) { return sdk.DequeueSharedQueue(queueID) }

// PluginDone forwards to the SDK.
func PluginDone() { sdk.PluginDone() }

// DispatchHttpCall forwards to the SDK.
func DispatchHttpCall(
	cluster string,
	headers [][2]string,
	body []byte,
	trailers [][2]string,
	timeoutMillisecond uint32,
	callBack func(numHeaders, bodySize, numTrailers int),
) (calloutID uint32, err error) {
	return sdk.DispatchHttpCall(cluster, headers, body, trailers, timeoutMillisecond, callBack)
}

// GetHttpCallResponseHeaders forwards to the SDK.
func GetHttpCallResponseHeaders() ([][2]string, error) { return sdk.GetHttpCallResponseHeaders() }

// GetHttpCallResponseBody forwards to the SDK.
func GetHttpCallResponseBody(start, maxSize int) ([]byte, error) {
	return sdk.GetHttpCallResponseBody(start, maxSize)
}

// GetHttpCallResponseTrailers forwards to the SDK.
func GetHttpCallResponseTrailers() ([][2]string, error) { return sdk.GetHttpCallResponseTrailers() }

// GetDownstreamData forwards to the SDK.
func GetDownstreamData(start, maxSize int) ([]byte, error) {
	return sdk.GetDownstreamData(start, maxSize)
}

// AppendDownstreamData forwards to the SDK.
func AppendDownstreamData(data []byte) error { return sdk.AppendDownstreamData(data) }

// PrependDownstreamData forwards to the SDK.
func PrependDownstreamData(data []byte) error { return sdk.PrependDownstreamData(data) }

// ReplaceDownstreamData forwards to the SDK.
func ReplaceDownstreamData(data []byte) error { return sdk.ReplaceDownstreamData(data) }

// GetUpstreamData forwards to the SDK.
func GetUpstreamData(start, maxSize int) ([]byte, error) { return sdk.GetUpstreamData(start, maxSize) }

// AppendUpstreamData forwards to the SDK.
func AppendUpstreamData(data []byte) error { return sdk.AppendUpstreamData(data) }

// PrependUpstreamData forwards to the SDK.
func PrependUpstreamData(data []byte) error { return sdk.PrependUpstreamData(data) }

// ReplaceUpstreamData forwards to the SDK.
func ReplaceUpstreamData(data []byte) error { return sdk.ReplaceUpstreamData(data) }

// ContinueTcpStream forwards to the SDK.
func ContinueTcpStream() error { return sdk.ContinueTcpStream() }

// CloseDownstream forwards to the SDK.
func CloseDownstream() error { return sdk.CloseDownstream() }

// CloseUpstream forwards to the SDK.
func CloseUpstream() error { return sdk.CloseUpstream() }

// GetHttpRequestHeaders forwards to the SDK.
func GetHttpRequestHeaders() ([][2]string, error) { return sdk.GetHttpRequestHeaders() }

// ReplaceHttpRequestHeaders forwards to the SDK.
func ReplaceHttpRequestHeaders(headers [][2]string) error {
	return sdk.ReplaceHttpRequestHeaders(headers)
}

// GetHttpRequestHeader forwards to the SDK.
func GetHttpRequestHeader(key string) (string, error) { return sdk.GetHttpRequestHeader(key) }

// RemoveHttpRequestHeader forwards to the SDK.
func RemoveHttpRequestHeader(key string) error { return sdk.RemoveHttpRequestHeader(key) }

// ReplaceHttpRequestHeader forwards to the SDK.
func ReplaceHttpRequestHeader(key, value string) error {
	return sdk.ReplaceHttpRequestHeader(key, value)
}

// AddHttpRequestHeader forwards to the SDK.
func AddHttpRequestHeader(key, value string) error { return sdk.AddHttpRequestHeader(key, value) }

// GetHttpRequestBody forwards to the SDK.
func GetHttpRequestBody(start, maxSize int) ([]byte, error) {
	return sdk.GetHttpRequestBody(start, maxSize)
}

// AppendHttpRequestBody forwards to the SDK.
func AppendHttpRequestBody(data []byte) error { return sdk.AppendHttpRequestBody(data) }

// PrependHttpRequestBody forwards to the SDK.
func PrependHttpRequestBody(data []byte) error { return sdk.PrependHttpRequestBody(data) }

// ReplaceHttpRequestBody forwards to the SDK.
func ReplaceHttpRequestBody(data []byte) error { return sdk.ReplaceHttpRequestBody(data) }

// GetHttpRequestTrailers forwards to the SDK.
func GetHttpRequestTrailers() ([][2]string, error) { return sdk.GetHttpRequestTrailers() }

// ReplaceHttpRequestTrailers forwards to the SDK.
func ReplaceHttpRequestTrailers(trailers [][2]string) error {
	return sdk.ReplaceHttpRequestTrailers(trailers)
}

// GetHttpRequestTrailer forwards to the SDK.
func GetHttpRequestTrailer(key string) (string, error) { return sdk.GetHttpRequestTrailer(key) }

// RemoveHttpRequestTrailer forwards to the SDK.
func RemoveHttpRequestTrailer(key string) error { return sdk.RemoveHttpRequestTrailer(key) }

// ReplaceHttpRequestTrailer forwards to the SDK.
func ReplaceHttpRequestTrailer(key, value string) error {
	return sdk.ReplaceHttpRequestTrailer(key, value)
}

// AddHttpRequestTrailer forwards to the SDK.
func AddHttpRequestTrailer(key, value string) error { return sdk.AddHttpRequestTrailer(key, value) }

// ResumeHttpRequest forwards to the SDK.
func ResumeHttpRequest() error { return sdk.ResumeHttpRequest() }

// GetHttpResponseHeaders forwards to the SDK.
func GetHttpResponseHeaders() ([][2]string, error) { return sdk.GetHttpResponseHeaders() }

// ReplaceHttpResponseHeaders forwards to the SDK.
func ReplaceHttpResponseHeaders(headers [][2]string) error {
	return sdk.ReplaceHttpResponseHeaders(headers)
}

// GetHttpResponseHeader forwards to the SDK.
func GetHttpResponseHeader(key string) (string, error) { return sdk.GetHttpResponseHeader(key) }

// RemoveHttpResponseHeader forwards to the SDK.
func RemoveHttpResponseHeader(key string) error { return sdk.RemoveHttpResponseHeader(key) }

// ReplaceHttpResponseHeader forwards to the SDK.
func ReplaceHttpResponseHeader(key, value string) error {
	return sdk.ReplaceHttpResponseHeader(key, value)
}

// AddHttpResponseHeader forwards to the SDK.
func AddHttpResponseHeader(key, value string) error { return sdk.AddHttpResponseHeader(key, value) }

// GetHttpResponseBody forwards to the SDK.
func GetHttpResponseBody(start, maxSize int) ([]byte, error) {
	return sdk.GetHttpResponseBody(start, maxSize)
}

// AppendHttpResponseBody forwards to the SDK.
func AppendHttpResponseBody(data []byte) error { return sdk.AppendHttpResponseBody(data) }

// PrependHttpResponseBody forwards to the SDK.
func PrependHttpResponseBody(data []byte) error { return sdk.PrependHttpResponseBody(data) }

// ReplaceHttpResponseBody forwards to the SDK.
func ReplaceHttpResponseBody(data []byte) error { return sdk.ReplaceHttpResponseBody(data) }

// GetHttpResponseTrailers forwards to the SDK.
func GetHttpResponseTrailers() ([][2]string, error) { return sdk.GetHttpResponseTrailers() }

// ReplaceHttpResponseTrailers forwards to the SDK.
func ReplaceHttpResponseTrailers(trailers [][2]string) error {
	return sdk.ReplaceHttpResponseTrailers(trailers)
}

// GetHttpResponseTrailer forwards to the SDK.
func GetHttpResponseTrailer(key string) (string, error) { return sdk.GetHttpResponseTrailer(key) }

// RemoveHttpResponseTrailer forwards to the SDK.
func RemoveHttpResponseTrailer(key string) error { return sdk.RemoveHttpResponseTrailer(key) }

// ReplaceHttpResponseTrailer forwards to the SDK.
func ReplaceHttpResponseTrailer(key, value string) error {
	return sdk.ReplaceHttpResponseTrailer(key, value)
}

// AddHttpResponseTrailer forwards to the SDK.
func AddHttpResponseTrailer(key, value string) error { return sdk.AddHttpResponseTrailer(key, value) }

// ResumeHttpResponse forwards to the SDK.
func ResumeHttpResponse() error { return sdk.ResumeHttpResponse() }

// SendHttpResponse forwards to the SDK.
func SendHttpResponse(statusCode uint32, headers [][2]string, body []byte, gRPCStatus int32) error {
	return sdk.SendHttpResponse(statusCode, headers, body, gRPCStatus)
}

// GetSharedData forwards to the SDK.
func GetSharedData(key string) (value []byte, cas uint32, err error) { return sdk.GetSharedData(key) }

// AppendSharedData appends the value of a shared data key to dst, with its CAS (dst
// unchanged on error). Not in the SDK.
func AppendSharedData(dst []byte, key string) ([]byte, uint32, error) {
	v, cas, err := sdk.GetSharedData(key)
	if err != nil {
		return dst, 0, err
	}
	return append(dst, v...), cas, nil
}

// SetSharedData forwards to the SDK.
func SetSharedData(key string, data []byte, cas uint32) error {
	return sdk.SetSharedData(key, data, cas)
}

// GetProperty forwards to the SDK.
func GetProperty(path []string) ([]byte, error) { return sdk.GetProperty(path) }

// AppendProperty appends the value of the host property at path to dst (dst unchanged on
// error): GetProperty without a result allocation in the wasip1 build. Not in the SDK.
func AppendProperty(dst []byte, path []string) ([]byte, error) {
	v, err := sdk.GetProperty(path)
	if err != nil {
		return dst, err
	}
	return append(dst, v...), nil
}

// AppendHttpRequestHeader appends the first value of a request header to dst. Not in the
// SDK.
func AppendHttpRequestHeader(dst []byte, key string) ([]byte, error) {
	v, err := sdk.GetHttpRequestHeader(key)
	if err != nil {
		return dst, err
	}
	return append(dst, v...), nil
}

// AppendHttpResponseHeader appends the first value of a response header to dst. Not in
// the SDK.
func AppendHttpResponseHeader(dst []byte, key string) ([]byte, error) {
	v, err := sdk.GetHttpResponseHeader(key)
	if err != nil {
		return dst, err
	}
	return append(dst, v...), nil
}

// GetPropertyMap forwards to the SDK.
func GetPropertyMap(path []string) ([][2]string, error) { return sdk.GetPropertyMap(path) }

// SetProperty forwards to the SDK.
func SetProperty(path []string, data []byte) error { return sdk.SetProperty(path, data) }

// CallForeignFunction forwards to the SDK.
func CallForeignFunction(funcName string, param []byte) (ret []byte, err error) {
	return sdk.CallForeignFunction(funcName, param)
}

// LogTrace forwards to the SDK.
func LogTrace(msg string) { sdk.LogTrace(msg) }

// LogTracef forwards to the SDK.
func LogTracef(format string, args ...any) { sdk.LogTracef(format, args...) }

// LogDebug forwards to the SDK.
func LogDebug(msg string) { sdk.LogDebug(msg) }

// LogDebugf forwards to the SDK.
func LogDebugf(format string, args ...any) { sdk.LogDebugf(format, args...) }

// LogInfo forwards to the SDK.
func LogInfo(msg string) { sdk.LogInfo(msg) }

// LogInfof forwards to the SDK.
func LogInfof(format string, args ...any) { sdk.LogInfof(format, args...) }

// LogWarn forwards to the SDK.
func LogWarn(msg string) { sdk.LogWarn(msg) }

// LogWarnf forwards to the SDK.
func LogWarnf(format string, args ...any) { sdk.LogWarnf(format, args...) }

// LogError forwards to the SDK.
func LogError(msg string) { sdk.LogError(msg) }

// LogErrorf forwards to the SDK.
func LogErrorf(format string, args ...any) { sdk.LogErrorf(format, args...) }

// LogCritical forwards to the SDK.
func LogCritical(msg string) { sdk.LogCritical(msg) }

// LogCriticalf forwards to the SDK.
func LogCriticalf(format string, args ...any) { sdk.LogCriticalf(format, args...) }

// DefineCounterMetric forwards to the SDK.
func DefineCounterMetric(name string) MetricCounter { return sdk.DefineCounterMetric(name) }

// DefineGaugeMetric forwards to the SDK.
func DefineGaugeMetric(name string) MetricGauge { return sdk.DefineGaugeMetric(name) }

// DefineHistogramMetric forwards to the SDK.
func DefineHistogramMetric(name string) MetricHistogram { return sdk.DefineHistogramMetric(name) }
