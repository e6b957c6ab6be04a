package host

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// ErrMalformedPairs is returned by DecodePairs for input that is not a serialized map.
var ErrMalformedPairs = errors.New("malformed serialized pairs")

// EncodePairs serializes a map the way the ABI and Envoy do: a little-endian u32 count,
// then (u32 key length, u32 value length) per pair, then each key and value followed by a
// NUL byte. An empty map encodes as four zero bytes (the spec also accepts size 0 and a
// single zero byte, which DecodePairs understands).
func EncodePairs(pairs [][2]string) []byte {
	size := 4
	for _, p := range pairs {
		size += 8 + len(p[0]) + len(p[1]) + 2
	}
	b := make([]byte, 4+8*len(pairs), size)
	binary.LittleEndian.PutUint32(b, uint32(len(pairs)))
	for i, p := range pairs {
		binary.LittleEndian.PutUint32(b[4+8*i:], uint32(len(p[0])))
		binary.LittleEndian.PutUint32(b[8+8*i:], uint32(len(p[1])))
	}
	for _, p := range pairs {
		b = append(b, p[0]...)
		b = append(b, 0)
		b = append(b, p[1]...)
		b = append(b, 0)
	}
	return b
}

// pairsSize is len(EncodePairs(pairs)) without encoding.
func pairsSize(pairs [][2]string) int {
	size := 4
	for _, p := range pairs {
		size += 8 + len(p[0]) + len(p[1]) + 2
	}
	return size
}

// DecodePairs parses a serialized map. Like Envoy it treats anything shorter than the
// count word as empty; unlike Envoy (which reads past the end of short input) it rejects a
// map whose sizes do not fit the data. The NUL separators are not checked, as in Envoy.
func DecodePairs(b []byte) ([][2]string, error) {
	if len(b) < 4 {
		return nil, nil
	}
	n := uint64(binary.LittleEndian.Uint32(b))
	if n == 0 {
		return nil, nil
	}
	if 4+8*n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d pairs need %d bytes of sizes, have %d", ErrMalformedPairs, n, 8*n, len(b)-4)
	}
	data := 4 + 8*n
	// Validate all sizes before allocating so a hostile count cannot force a large allocation.
	need := data
	for i := uint64(0); i < n; i++ {
		need += uint64(binary.LittleEndian.Uint32(b[4+8*i:])) + uint64(binary.LittleEndian.Uint32(b[8+8*i:])) + 2
	}
	// The final NUL may be missing in what some SDKs send; accept exactly one byte short.
	if need > uint64(len(b))+1 {
		return nil, fmt.Errorf("%w: pairs need %d bytes, have %d", ErrMalformedPairs, need, len(b))
	}
	out := make([][2]string, n)
	for i := uint64(0); i < n; i++ {
		kl := uint64(binary.LittleEndian.Uint32(b[4+8*i:]))
		vl := uint64(binary.LittleEndian.Uint32(b[8+8*i:]))
		if data+kl+1+vl > uint64(len(b)) {
			return nil, fmt.Errorf("%w: pair %d overruns the data", ErrMalformedPairs, i)
		}
		out[i][0] = string(b[data : data+kl])
		data += kl + 1
		out[i][1] = string(b[data : data+vl])
		data += vl + 1
	}
	return out, nil
}

// SplitPath splits a property path into its NUL-separated segments the way Envoy reads it:
// a trailing NUL (as the Rust SDK sends) ends the path, empty segments in the middle are
// kept, and an empty path has no segments.
func SplitPath(path []byte) []string {
	var parts []string
	start := 0
	for start < len(path) {
		end := start
		for end < len(path) && path[end] != 0 {
			end++
		}
		parts = append(parts, string(path[start:end]))
		start = end + 1
	}
	return parts
}

// JoinPath is the inverse of SplitPath (without the trailing NUL).
func JoinPath(parts ...string) []byte {
	return []byte(strings.Join(parts, "\x00"))
}
