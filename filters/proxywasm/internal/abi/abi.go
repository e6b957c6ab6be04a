// Package abi holds the values and encodings of proxy-wasm ABI v0.2.1 that cross the
// guest/host boundary: enum codes, status codes, serialized header maps and property
// paths. It is plain Go so it can be tested natively; only the wasip1 build uses it.
package abi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// Buffer types (proxy_buffer_type_t).
const (
	BufferHTTPRequestBody      uint32 = 0
	BufferHTTPResponseBody     uint32 = 1
	BufferDownstreamData       uint32 = 2
	BufferUpstreamData         uint32 = 3
	BufferHTTPCallResponseBody uint32 = 4
	BufferGRPCCallMessage      uint32 = 5
	BufferVMConfiguration      uint32 = 6
	BufferPluginConfiguration  uint32 = 7
	BufferForeignFunctionArgs  uint32 = 8
)

// Map types (proxy_map_type_t).
const (
	MapHTTPRequestHeaders       uint32 = 0
	MapHTTPRequestTrailers      uint32 = 1
	MapHTTPResponseHeaders      uint32 = 2
	MapHTTPResponseTrailers     uint32 = 3
	MapGRPCInitialMetadata      uint32 = 4
	MapGRPCTrailingMetadata     uint32 = 5
	MapHTTPCallResponseHeaders  uint32 = 6
	MapHTTPCallResponseTrailers uint32 = 7
)

// Stream types (proxy_stream_type_t).
const (
	StreamHTTPRequest  uint32 = 0
	StreamHTTPResponse uint32 = 1
	StreamDownstream   uint32 = 2
	StreamUpstream     uint32 = 3
)

// Log levels (proxy_log_level_t).
const (
	LogTrace    uint32 = 0
	LogDebug    uint32 = 1
	LogInfo     uint32 = 2
	LogWarn     uint32 = 3
	LogError    uint32 = 4
	LogCritical uint32 = 5
)

// Metric types (proxy_metric_type_t).
const (
	MetricCounter   uint32 = 0
	MetricGauge     uint32 = 1
	MetricHistogram uint32 = 2
)

// Status codes (proxy_status_t).
const (
	StatusOK                   uint32 = 0
	StatusNotFound             uint32 = 1
	StatusBadArgument          uint32 = 2
	StatusSerializationFailure uint32 = 3
	StatusParseFailure         uint32 = 4
	StatusInvalidMemoryAccess  uint32 = 6
	StatusEmpty                uint32 = 7
	StatusCasMismatch          uint32 = 8
	StatusInternalFailure      uint32 = 10
	StatusUnimplemented        uint32 = 12
)

// StatusError maps a host status to the SDK's error values, so filters can compare with
// errors.Is(err, types.ErrorStatusNotFound) exactly as they would with the SDK. Codes the
// SDK has no sentinel for still name the code.
func StatusError(status uint32) error {
	switch status {
	case StatusOK:
		return nil
	case StatusNotFound:
		return types.ErrorStatusNotFound
	case StatusBadArgument:
		return types.ErrorStatusBadArgument
	case StatusEmpty:
		return types.ErrorStatusEmpty
	case StatusCasMismatch:
		return types.ErrorStatusCasMismatch
	case StatusInternalFailure:
		return types.ErrorInternalFailure
	case StatusUnimplemented:
		return types.ErrorUnimplemented
	case StatusSerializationFailure:
		return errors.New("error status returned by host: serialization failure")
	case StatusParseFailure:
		return errors.New("error status returned by host: parse failure")
	case StatusInvalidMemoryAccess:
		return errors.New("error status returned by host: invalid memory access")
	}
	return fmt.Errorf("unknown status code returned by host: %d", status)
}

// ErrMalformedPairs reports a serialized map whose lengths run past its end. A host that
// sends one is broken; the guest reports it instead of panicking on an index.
var ErrMalformedPairs = errors.New("malformed serialized header map")

// EncodePairs serializes pairs the way Envoy and the spec expect: a u32 count, then a
// (u32 key length, u32 value length) per pair, then each key and value followed by NUL.
// An empty map is still sent as a 4-byte zero count so the pointer handed to the host is
// never nil.
func EncodePairs(pairs [][2]string) []byte {
	size := 4
	for _, p := range pairs {
		size += 8 + len(p[0]) + 1 + len(p[1]) + 1
	}
	out := make([]byte, size)
	binary.LittleEndian.PutUint32(out, uint32(len(pairs)))
	lens := 4
	data := 4 + 8*len(pairs)
	for _, p := range pairs {
		binary.LittleEndian.PutUint32(out[lens:], uint32(len(p[0])))
		binary.LittleEndian.PutUint32(out[lens+4:], uint32(len(p[1])))
		lens += 8
		data += copy(out[data:], p[0]) + 1 // the NUL is already there: make zeroes
		data += copy(out[data:], p[1]) + 1
	}
	return out
}

// DecodePairs parses a serialized map. The returned strings share b's memory instead of
// copying every header: b must not be modified afterwards. That holds for the buffers the
// guest takes over from the host (see hostmem), which nothing else references.
//
// An empty input or a lone NUL byte is an empty map (both are allowed by the spec).
func DecodePairs(b []byte) ([][2]string, error) {
	if len(b) < 4 {
		return nil, nil
	}
	n := binary.LittleEndian.Uint32(b)
	// Every pair needs at least 8 bytes of lengths and 2 NULs; checking this first keeps
	// a corrupt count from making us allocate a huge slice.
	if uint64(n)*10 > uint64(len(b)-4) {
		return nil, fmt.Errorf("%w: %d pairs do not fit in %d bytes", ErrMalformedPairs, n, len(b))
	}
	out := make([][2]string, n)
	lens := 4
	data := 4 + 8*int(n)
	for i := range out {
		kl := int(binary.LittleEndian.Uint32(b[lens:]))
		vl := int(binary.LittleEndian.Uint32(b[lens+4:]))
		lens += 8
		// Lengths are u32 and int is 64-bit here, so the sum cannot overflow.
		if data+kl+1+vl+1 > len(b) {
			return nil, fmt.Errorf("%w: pair %d runs past the end", ErrMalformedPairs, i)
		}
		out[i][0] = bytesString(b[data : data+kl])
		data += kl + 1
		out[i][1] = bytesString(b[data : data+vl])
		data += vl + 1
	}
	return out, nil
}

// EncodePath joins property path segments with NUL, the encoding of proxy_get_property
// and proxy_set_property.
func EncodePath(path []string) []byte {
	size := 0
	for _, p := range path {
		size += len(p) + 1
	}
	if size == 0 {
		return nil
	}
	return AppendPath(make([]byte, 0, size), path)
}

// AppendPath appends the encoding of path (see EncodePath) to out.
func AppendPath(out []byte, path []string) []byte {
	for i, p := range path {
		if i > 0 {
			out = append(out, 0)
		}
		out = append(out, p...)
	}
	return out
}

// BytesString views b as a string without copying; see DecodePairs for when that is safe.
func BytesString(b []byte) string { return bytesString(b) }

func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}
