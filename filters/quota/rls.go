package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/wasmesh/wasmesh/filters/internal/ratelimit"
)

// The messages of envoy.service.ratelimit.v3.RateLimitService in protobuf wire format,
// written by hand: a filter imports only the guest SDK, and the few fields the filter
// uses do not justify a protobuf runtime in the module. Field numbers are those of
// envoy/service/ratelimit/v3/rls.proto and envoy/extensions/common/ratelimit/v3/
// ratelimit.proto; rls_test.go checks both directions against go-control-plane's types.

// rlsMethod is the full gRPC method; proxy_grpc_call takes the service and method apart.
const (
	rlsService = "envoy.service.ratelimit.v3.RateLimitService"
	rlsMethod  = "ShouldRateLimit"
)

// Protobuf wire types.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

// RateLimitResponse.Code.
const (
	rlsUnknown   = 0
	rlsOK        = 1
	rlsOverLimit = 2
)

// appendGrpcService appends an envoy.config.core.v3.GrpcService naming the cluster:
// envoy_grpc (1) {cluster_name (1), authority (2)}.
func appendGrpcService(b []byte, cluster, authority string) []byte {
	b = appendTag(b, 1, wireBytes)
	b = appendVarint(b, uint64(stringSize(cluster)+stringSize(authority)))
	b = appendString(b, 1, cluster)
	return appendString(b, 2, authority)
}

// rlsRequest builds a RateLimitRequest in a reused buffer: domain (1), then one
// descriptor (2) per addDescriptor, then hits_addend (3) by finish.
type rlsRequest struct {
	buf []byte
}

func (r *rlsRequest) start(domain string) {
	r.buf = appendString(r.buf[:0], 1, domain)
}

// addDescriptor appends a RateLimitDescriptor {entries (1): Entry {key (1), value (2)}}.
func (r *rlsRequest) addDescriptor(entries []ratelimit.Entry) {
	size := 0
	for _, e := range entries {
		n := entrySize(e)
		size += 1 + varintSize(uint64(n)) + n
	}
	r.buf = appendTag(r.buf, 2, wireBytes)
	r.buf = appendVarint(r.buf, uint64(size))
	for _, e := range entries {
		r.buf = appendTag(r.buf, 1, wireBytes)
		r.buf = appendVarint(r.buf, uint64(entrySize(e)))
		r.buf = appendString(r.buf, 1, e.Key)
		r.buf = appendString(r.buf, 2, e.Value)
	}
}

// finish appends hits_addend and returns the message.
func (r *rlsRequest) finish(hits uint32) []byte {
	if hits != 0 {
		r.buf = appendTag(r.buf, 3, wireVarint)
		r.buf = appendVarint(r.buf, uint64(hits))
	}
	return r.buf
}

func entrySize(e ratelimit.Entry) int { return stringSize(e.Key) + stringSize(e.Value) }

// stringSize is the encoded size of a string field with a one-byte tag; proto3 omits
// empty strings.
func stringSize(s string) int {
	if s == "" {
		return 0
	}
	return 1 + varintSize(uint64(len(s))) + len(s)
}

func appendString(b []byte, field int, s string) []byte {
	if s == "" {
		return b
	}
	b = appendTag(b, field, wireBytes)
	b = appendVarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendTag(b []byte, field, wire int) []byte {
	return appendVarint(b, uint64(field)<<3|uint64(wire))
}

func appendVarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func varintSize(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// rlsResponse is the part of a RateLimitResponse the filter uses.
type rlsResponse struct {
	overall  uint32      // overall_code (1)
	statuses []rlsStatus // statuses (2), in the order of the request's descriptors
	// response_headers_to_add (3) and request_headers_to_add (4), HeaderValue {key (1),
	// value (2), raw_value (3)}.
	responseHeaders, requestHeaders [][2]string
}

// rlsStatus is a DescriptorStatus.
type rlsStatus struct {
	code      uint32        // code (1)
	hasLimit  bool          // current_limit (2) is set (a descriptor the service knows)
	limit     uint32        // current_limit (2).requests_per_unit (1)
	unit      uint32        // current_limit (2).unit (2)
	remaining uint32        // limit_remaining (3)
	reset     time.Duration // duration_until_reset (4): Duration {seconds (1), nanos (2)}
}

var errTruncated = errors.New("truncated message")

// field is one decoded field: its number, wire type, and varint value or bytes.
type field struct {
	num   int
	wire  int
	value uint64
	bytes []byte
}

// nextField decodes the field at the start of b and returns the rest.
func nextField(b []byte) (field, []byte, error) {
	key, b, err := readVarint(b)
	if err != nil {
		return field{}, nil, err
	}
	f := field{num: int(key >> 3), wire: int(key & 7)}
	if f.num <= 0 || key>>3 > 1<<29-1 {
		return field{}, nil, fmt.Errorf("bad field number %d", key>>3)
	}
	switch f.wire {
	case wireVarint:
		f.value, b, err = readVarint(b)
	case wireFixed64:
		if len(b) < 8 {
			return field{}, nil, errTruncated
		}
		b = b[8:]
	case wireFixed32:
		if len(b) < 4 {
			return field{}, nil, errTruncated
		}
		b = b[4:]
	case wireBytes:
		var n uint64
		if n, b, err = readVarint(b); err == nil {
			if n > uint64(len(b)) {
				return field{}, nil, errTruncated
			}
			f.bytes, b = b[:n], b[n:]
		}
	default:
		return field{}, nil, fmt.Errorf("field %d: unsupported wire type %d", f.num, f.wire)
	}
	return f, b, err
}

func readVarint(b []byte) (uint64, []byte, error) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			return v, b[i+1:], nil
		}
	}
	if len(b) >= 10 {
		return 0, nil, errors.New("varint overflows 64 bits")
	}
	return 0, nil, errTruncated
}

// each calls fn for every field of the message b; fn gets fields of the wire type it
// expects for their number (others are skipped as unknown, as protobuf does).
func each(b []byte, fn func(f field) error) error {
	for len(b) > 0 {
		f, rest, err := nextField(b)
		if err != nil {
			return err
		}
		if err := fn(f); err != nil {
			return fmt.Errorf("field %d: %w", f.num, err)
		}
		b = rest
	}
	return nil
}

// parseRateLimitResponse decodes a RateLimitResponse; unknown fields are skipped.
func parseRateLimitResponse(b []byte) (*rlsResponse, error) {
	r := &rlsResponse{}
	err := each(b, func(f field) error {
		switch {
		case f.num == 1 && f.wire == wireVarint:
			r.overall = uint32(f.value)
		case f.num == 2 && f.wire == wireBytes:
			s, err := parseDescriptorStatus(f.bytes)
			if err != nil {
				return err
			}
			r.statuses = append(r.statuses, s)
		case (f.num == 3 || f.num == 4) && f.wire == wireBytes:
			h, err := parseHeaderValue(f.bytes)
			if err != nil {
				return err
			}
			if f.num == 3 {
				r.responseHeaders = append(r.responseHeaders, h)
			} else {
				r.requestHeaders = append(r.requestHeaders, h)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("RateLimitResponse: %w", err)
	}
	return r, nil
}

func parseDescriptorStatus(b []byte) (rlsStatus, error) {
	var s rlsStatus
	err := each(b, func(f field) error {
		switch {
		case f.num == 1 && f.wire == wireVarint:
			s.code = uint32(f.value)
		case f.num == 2 && f.wire == wireBytes:
			s.hasLimit = true
			return each(f.bytes, func(f field) error {
				switch {
				case f.num == 1 && f.wire == wireVarint:
					s.limit = uint32(f.value)
				case f.num == 2 && f.wire == wireVarint:
					s.unit = uint32(f.value)
				}
				return nil
			})
		case f.num == 3 && f.wire == wireVarint:
			s.remaining = uint32(f.value)
		case f.num == 4 && f.wire == wireBytes:
			d, err := parseProtoDuration(f.bytes)
			s.reset = d
			return err
		}
		return nil
	})
	return s, err
}

// parseProtoDuration decodes a google.protobuf.Duration; a negative one is zero (nothing to
// wait for), a huge one saturates.
func parseProtoDuration(b []byte) (time.Duration, error) {
	var secs, nanos int64
	err := each(b, func(f field) error {
		switch {
		case f.num == 1 && f.wire == wireVarint:
			secs = int64(f.value)
		case f.num == 2 && f.wire == wireVarint:
			nanos = int64(int32(f.value))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	const maxSecs = int64(1<<63-1) / int64(time.Second)
	switch {
	case secs < 0 || secs == 0 && nanos < 0:
		return 0, nil
	case secs >= maxSecs:
		return time.Duration(1<<63 - 1), nil
	}
	return time.Duration(secs)*time.Second + time.Duration(nanos), nil
}

// parseHeaderValue decodes an envoy.config.core.v3.HeaderValue; raw_value, when set,
// is the value (as Envoy reads it).
func parseHeaderValue(b []byte) ([2]string, error) {
	var h [2]string
	var raw []byte
	err := each(b, func(f field) error {
		if f.wire != wireBytes {
			return nil
		}
		switch f.num {
		case 1:
			h[0] = string(f.bytes)
		case 2:
			h[1] = string(f.bytes)
		case 3:
			raw = f.bytes
		}
		return nil
	})
	if raw != nil {
		h[1] = string(raw)
	}
	if err == nil && h[0] == "" {
		err = errors.New("header without a key")
	}
	return h, err
}
