package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/wasmesh/wasmesh/filters/internal/ratelimit"
	"github.com/wasmesh/wasmesh/wasm/protowire"
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

// RateLimitResponse.Code.
const (
	rlsUnknown   = 0
	rlsOK        = 1
	rlsOverLimit = 2
)

// appendGrpcService appends an envoy.config.core.v3.GrpcService naming the cluster:
// envoy_grpc (1) {cluster_name (1), authority (2)}.
func appendGrpcService(b []byte, cluster, authority string) []byte {
	b = protowire.AppendTag(b, 1, protowire.Bytes)
	b = protowire.AppendVarint(b, uint64(stringSize(cluster)+stringSize(authority)))
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
		size += 1 + protowire.VarintSize(uint64(n)) + n
	}
	r.buf = protowire.AppendTag(r.buf, 2, protowire.Bytes)
	r.buf = protowire.AppendVarint(r.buf, uint64(size))
	for _, e := range entries {
		r.buf = protowire.AppendTag(r.buf, 1, protowire.Bytes)
		r.buf = protowire.AppendVarint(r.buf, uint64(entrySize(e)))
		r.buf = appendString(r.buf, 1, e.Key)
		r.buf = appendString(r.buf, 2, e.Value)
	}
}

// finish appends hits_addend and returns the message.
func (r *rlsRequest) finish(hits uint32) []byte {
	if hits != 0 {
		r.buf = protowire.AppendTag(r.buf, 3, protowire.Varint)
		r.buf = protowire.AppendVarint(r.buf, uint64(hits))
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
	return 1 + protowire.VarintSize(uint64(len(s))) + len(s)
}

func appendString(b []byte, field int, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(b, field, s)
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

// each calls fn for every field of the message b, naming the field in fn's error; fn
// reads the fields of the wire type it expects for their number (others are skipped as
// unknown, as protobuf does).
func each(b []byte, fn func(f protowire.Field) error) error {
	return protowire.Each(b, func(f protowire.Field) error {
		if err := fn(f); err != nil {
			return fmt.Errorf("field %d: %w", f.Num, err)
		}
		return nil
	})
}

// parseRateLimitResponse decodes a RateLimitResponse; unknown fields are skipped.
func parseRateLimitResponse(b []byte) (*rlsResponse, error) {
	r := &rlsResponse{}
	err := each(b, func(f protowire.Field) error {
		switch {
		case f.Num == 1 && f.Wire == protowire.Varint:
			r.overall = uint32(f.Value)
		case f.Num == 2 && f.Wire == protowire.Bytes:
			s, err := parseDescriptorStatus(f.Bytes)
			if err != nil {
				return err
			}
			r.statuses = append(r.statuses, s)
		case (f.Num == 3 || f.Num == 4) && f.Wire == protowire.Bytes:
			h, err := parseHeaderValue(f.Bytes)
			if err != nil {
				return err
			}
			if f.Num == 3 {
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
	err := each(b, func(f protowire.Field) error {
		switch {
		case f.Num == 1 && f.Wire == protowire.Varint:
			s.code = uint32(f.Value)
		case f.Num == 2 && f.Wire == protowire.Bytes:
			s.hasLimit = true
			return each(f.Bytes, func(f protowire.Field) error {
				switch {
				case f.Num == 1 && f.Wire == protowire.Varint:
					s.limit = uint32(f.Value)
				case f.Num == 2 && f.Wire == protowire.Varint:
					s.unit = uint32(f.Value)
				}
				return nil
			})
		case f.Num == 3 && f.Wire == protowire.Varint:
			s.remaining = uint32(f.Value)
		case f.Num == 4 && f.Wire == protowire.Bytes:
			d, err := parseProtoDuration(f.Bytes)
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
	err := each(b, func(f protowire.Field) error {
		switch {
		case f.Num == 1 && f.Wire == protowire.Varint:
			secs = int64(f.Value)
		case f.Num == 2 && f.Wire == protowire.Varint:
			nanos = int64(int32(f.Value))
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
	err := each(b, func(f protowire.Field) error {
		if f.Wire != protowire.Bytes {
			return nil
		}
		switch f.Num {
		case 1:
			h[0] = string(f.Bytes)
		case 2:
			h[1] = string(f.Bytes)
		case 3:
			raw = f.Bytes
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
