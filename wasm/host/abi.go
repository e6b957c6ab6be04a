package host

import (
	"fmt"
	"log/slog"
)

// ABIVersion is the proxy-wasm ABI a module was built against, detected from its
// proxy_abi_version_* export.
type ABIVersion string

// Supported ABI versions.
const (
	ABI010 ABIVersion = "0.1.0"
	ABI020 ABIVersion = "0.2.0"
	ABI021 ABIVersion = "0.2.1"
)

// Status is proxy_status_t / WasmResult, the value every host call returns.
type Status uint32

// Status values, as numbered by the spec and proxy-wasm-cpp-host's WasmResult.
const (
	StatusOK                   Status = 0
	StatusNotFound             Status = 1
	StatusBadArgument          Status = 2
	StatusSerializationFailure Status = 3
	StatusParseFailure         Status = 4
	StatusBadExpression        Status = 5
	StatusInvalidMemoryAccess  Status = 6
	StatusEmpty                Status = 7
	StatusCasMismatch          Status = 8
	StatusResultMismatch       Status = 9
	StatusInternalFailure      Status = 10
	StatusBrokenConnection     Status = 11
	StatusUnimplemented        Status = 12
)

var statusNames = [...]string{"Ok", "NotFound", "BadArgument", "SerializationFailure", "ParseFailure",
	"BadExpression", "InvalidMemoryAccess", "Empty", "CasMismatch", "ResultMismatch",
	"InternalFailure", "BrokenConnection", "Unimplemented"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint32(s))
}

// Action is what a stream callback asks the host to do next.
type Action int

const (
	// Continue forwards the headers/data/trailers.
	Continue Action = iota
	// Pause stops iteration until the guest resumes the stream (or a local response ends it).
	Pause
)

func (a Action) String() string {
	if a == Continue {
		return "Continue"
	}
	return "Pause"
}

// MarshalText renders the action by name (for reports).
func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// FilterStatus is what a stream callback returned, read as proxy-wasm-cpp-host reads it for
// the callback's kind: FilterHeadersStatus for the header callbacks, FilterDataStatus for
// the body callbacks, FilterTrailersStatus for the trailer callbacks and FilterStatus for
// the connection callbacks. The values of the kinds overlap; 0 continues in every kind.
type FilterStatus uint32

// StatusContinue continues, whatever the callback.
const StatusContinue FilterStatus = 0

// Header callback statuses (FilterHeadersStatus). ContinueAndEndStream (2) reads as
// Continue, as in Envoy.
const (
	// HeadersStopIteration stops the headers; the body still reaches the filter, whose
	// first body callback that continues lets the headers go on with it.
	HeadersStopIteration FilterStatus = 1
	// HeadersStopAllIterationAndBuffer stops the headers and everything after them; the
	// proxy keeps the body for the filter up to its buffer limit (413/500 beyond).
	HeadersStopAllIterationAndBuffer FilterStatus = 3
	// HeadersStopAllIterationAndWatermark is HeadersStopAllIterationAndBuffer with flow
	// control instead of the limit.
	HeadersStopAllIterationAndWatermark FilterStatus = 4
)

// Body callback statuses (FilterDataStatus).
const (
	// DataStopIterationAndBuffer holds the body; the guest sees everything held so far in
	// its next body callback. Past the buffer limit the stream gets 413 or 500.
	DataStopIterationAndBuffer FilterStatus = 1
	// DataStopIterationAndWatermark holds the body with flow control instead of a limit.
	DataStopIterationAndWatermark FilterStatus = 2
	// DataStopIterationNoBuffer stops without the proxy buffering the chunk for the filter.
	DataStopIterationNoBuffer FilterStatus = 3
)

// TrailersStopIteration stops the trailers (FilterTrailersStatus); also the one stop of the
// connection callbacks.
const TrailersStopIteration FilterStatus = 1

// callbackKind says how a stream callback's return value reads.
type callbackKind uint8

const (
	kindHeaders callbackKind = iota
	kindData
	kindTrailers
	kindConnection
)

// status converts a callback's return value as proxy-wasm-cpp-host and Envoy do: values past
// a kind's last stop read as that stop, and a header callback's StopIteration reads as
// StopAllIterationAndWatermark unless allowStopIteration.
func (k callbackKind) status(ret uint64, allowStopIteration bool) FilterStatus {
	switch k {
	case kindHeaders:
		switch {
		case ret == 0 || ret == 2:
			return StatusContinue
		case ret == uint64(HeadersStopIteration) && allowStopIteration:
			return HeadersStopIteration
		case ret == uint64(HeadersStopAllIterationAndBuffer):
			return HeadersStopAllIterationAndBuffer
		}
		return HeadersStopAllIterationAndWatermark
	case kindData:
		if ret > uint64(DataStopIterationNoBuffer) {
			return DataStopIterationNoBuffer
		}
		return FilterStatus(ret)
	}
	if ret == 0 {
		return StatusContinue
	}
	return TrailersStopIteration
}

// stop is the status Envoy gives a callback of kind k after a local reply or a fail-closed
// failure, whatever the guest returned.
func (k callbackKind) stop() FilterStatus {
	switch k {
	case kindHeaders:
		return HeadersStopAllIterationAndWatermark
	case kindData:
		return DataStopIterationNoBuffer
	}
	return TrailersStopIteration
}

// MapType is proxy_map_type_t.
type MapType uint32

// Map types.
const (
	MapRequestHeaders              MapType = 0
	MapRequestTrailers             MapType = 1
	MapResponseHeaders             MapType = 2
	MapResponseTrailers            MapType = 3
	MapGRPCReceiveInitialMetadata  MapType = 4
	MapGRPCReceiveTrailingMetadata MapType = 5
	MapHTTPCallResponseHeaders     MapType = 6
	MapHTTPCallResponseTrailers    MapType = 7
	mapTypeMax                             = MapHTTPCallResponseTrailers
)

// BufferType is proxy_buffer_type_t.
type BufferType uint32

// Buffer types.
const (
	BufferRequestBody          BufferType = 0
	BufferResponseBody         BufferType = 1
	BufferDownstreamData       BufferType = 2
	BufferUpstreamData         BufferType = 3
	BufferHTTPCallResponseBody BufferType = 4
	BufferGRPCReceive          BufferType = 5
	BufferVMConfiguration      BufferType = 6
	BufferPluginConfiguration  BufferType = 7
	BufferForeignArguments     BufferType = 8
	bufferTypeMax                         = BufferForeignArguments
)

// StreamType is proxy_stream_type_t.
type StreamType uint32

// Stream types.
const (
	StreamRequest    StreamType = 0
	StreamResponse   StreamType = 1
	StreamDownstream StreamType = 2
	StreamUpstream   StreamType = 3
)

func (s StreamType) String() string {
	switch s {
	case StreamRequest:
		return "request"
	case StreamResponse:
		return "response"
	case StreamDownstream:
		return "downstream"
	case StreamUpstream:
		return "upstream"
	}
	return fmt.Sprintf("StreamType(%d)", uint32(s))
}

// MarshalText renders the stream type by name.
func (s StreamType) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// PeerType is proxy_peer_type_t, passed to the connection-close callbacks.
type PeerType uint32

// Peer types.
const (
	PeerUnknown PeerType = 0
	PeerLocal   PeerType = 1
	PeerRemote  PeerType = 2
)

// MetricType is proxy_metric_type_t.
type MetricType uint32

// Metric types.
const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
)

func (t MetricType) String() string {
	switch t {
	case MetricCounter:
		return "counter"
	case MetricGauge:
		return "gauge"
	case MetricHistogram:
		return "histogram"
	}
	return fmt.Sprintf("MetricType(%d)", uint32(t))
}

// MarshalText renders the metric type by name.
func (t MetricType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// LogLevel is proxy_log_level_t.
type LogLevel uint32

// Log levels.
const (
	LogTrace    LogLevel = 0
	LogDebug    LogLevel = 1
	LogInfo     LogLevel = 2
	LogWarn     LogLevel = 3
	LogError    LogLevel = 4
	LogCritical LogLevel = 5
)

// Slog levels for the two proxy levels slog has no name for.
const (
	SlogTrace    = slog.Level(-8)
	SlogCritical = slog.Level(12)
)

// Slog maps a proxy log level onto slog.
func (l LogLevel) Slog() slog.Level {
	switch l {
	case LogTrace:
		return SlogTrace
	case LogDebug:
		return slog.LevelDebug
	case LogInfo:
		return slog.LevelInfo
	case LogWarn:
		return slog.LevelWarn
	case LogError:
		return slog.LevelError
	default:
		return SlogCritical
	}
}

func (l LogLevel) String() string {
	switch l {
	case LogTrace:
		return "trace"
	case LogDebug:
		return "debug"
	case LogInfo:
		return "info"
	case LogWarn:
		return "warn"
	case LogError:
		return "error"
	case LogCritical:
		return "critical"
	}
	return fmt.Sprintf("LogLevel(%d)", uint32(l))
}

// MarshalText renders the level by name.
func (l LogLevel) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// LogLevelFromSlog maps an slog level back onto the proxy levels.
func LogLevelFromSlog(l slog.Level) LogLevel {
	switch {
	case l < slog.LevelDebug:
		return LogTrace
	case l < slog.LevelInfo:
		return LogDebug
	case l < slog.LevelWarn:
		return LogInfo
	case l < slog.LevelError:
		return LogWarn
	case l < SlogCritical:
		return LogError
	default:
		return LogCritical
	}
}

// Names of the guest exports the host calls.
const (
	fnInitialize            = "_initialize"
	fnStart                 = "_start"
	fnMain                  = "main"
	fnMemoryAllocate        = "proxy_on_memory_allocate"
	fnMalloc                = "malloc"
	fnOnContextCreate       = "proxy_on_context_create"
	fnOnVMStart             = "proxy_on_vm_start"
	fnOnConfigure           = "proxy_on_configure"
	fnOnTick                = "proxy_on_tick"
	fnOnRequestHeaders      = "proxy_on_request_headers"
	fnOnRequestBody         = "proxy_on_request_body"
	fnOnRequestTrailers     = "proxy_on_request_trailers"
	fnOnResponseHeaders     = "proxy_on_response_headers"
	fnOnResponseBody        = "proxy_on_response_body"
	fnOnResponseTrailers    = "proxy_on_response_trailers"
	fnOnLog                 = "proxy_on_log"
	fnOnDone                = "proxy_on_done"
	fnOnDelete              = "proxy_on_delete"
	fnOnHTTPCallResponse    = "proxy_on_http_call_response"
	fnOnQueueReady          = "proxy_on_queue_ready"
	fnOnForeignFunction     = "proxy_on_foreign_function"
	fnOnNewConnection       = "proxy_on_new_connection"
	fnOnDownstreamData      = "proxy_on_downstream_data"
	fnOnUpstreamData        = "proxy_on_upstream_data"
	fnOnDownstreamClose     = "proxy_on_downstream_connection_close"
	fnOnUpstreamClose       = "proxy_on_upstream_connection_close"
	fnValidateConfiguration = "proxy_validate_configuration"
)

// callbackArity lists, for every callback the host may call, the parameter counts it accepts
// (all i32) and whether it returns an i32. Two counts mean two ABI generations: the 0.1.0
// header callbacks have no end_of_stream argument.
var callbackArity = map[string]struct {
	params  []int
	returns bool
}{
	fnMemoryAllocate:                {[]int{1}, true},
	fnMalloc:                        {[]int{1}, true},
	fnOnContextCreate:               {[]int{2}, false},
	fnOnVMStart:                     {[]int{2}, true},
	fnOnConfigure:                   {[]int{2}, true},
	fnOnTick:                        {[]int{1}, false},
	fnOnRequestHeaders:              {[]int{3, 2}, true},
	fnOnRequestBody:                 {[]int{3}, true},
	fnOnRequestTrailers:             {[]int{2}, true},
	fnOnResponseHeaders:             {[]int{3, 2}, true},
	fnOnResponseBody:                {[]int{3}, true},
	fnOnResponseTrailers:            {[]int{2}, true},
	fnOnLog:                         {[]int{1}, false},
	fnOnDone:                        {[]int{1}, true},
	fnOnDelete:                      {[]int{1}, false},
	fnOnHTTPCallResponse:            {[]int{5}, false},
	fnOnGRPCReceiveInitialMetadata:  {[]int{3}, false},
	fnOnGRPCReceive:                 {[]int{3}, false},
	fnOnGRPCReceiveTrailingMetadata: {[]int{3}, false},
	fnOnGRPCClose:                   {[]int{3}, false},
	fnOnQueueReady:                  {[]int{2}, false},
	fnOnForeignFunction:             {[]int{3}, false},
	fnOnNewConnection:               {[]int{1}, true},
	fnOnDownstreamData:              {[]int{3}, true},
	fnOnUpstreamData:                {[]int{3}, true},
	fnOnDownstreamClose:             {[]int{2}, false},
	fnOnUpstreamClose:               {[]int{2}, false},
}
