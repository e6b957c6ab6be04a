// Package protowire is the protobuf wire format written and read by hand: varints, tags,
// length-delimited fields, and a field iterator that skips what a caller does not read. A
// filter imports only the guest SDK, and the few messages the filters exchange (a
// google.protobuf.Struct of peer metadata, the rate-limit service's request and response) do
// not justify a protobuf runtime in a Wasm module; the host reads the GrpcService a guest
// passes to proxy_grpc_call with it too.
package protowire

import (
	"errors"
	"fmt"
)

// Wire types.
const (
	Varint  = 0
	Fixed64 = 1
	Bytes   = 2
	Fixed32 = 5
)

// maxFieldNumber is protobuf's largest field number.
const maxFieldNumber = 1<<29 - 1

// ErrTruncated is what decoding a message cut short returns.
var ErrTruncated = errors.New("truncated message")

// AppendVarint appends v as a varint.
func AppendVarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// VarintSize is the length of v as a varint.
func VarintSize(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// AppendTag appends a field's key: its number and wire type.
func AppendTag(b []byte, field, wire int) []byte {
	return AppendVarint(b, uint64(field)<<3|uint64(wire))
}

// AppendBytes appends a length-delimited field.
func AppendBytes(b []byte, field int, data []byte) []byte {
	b = AppendTag(b, field, Bytes)
	b = AppendVarint(b, uint64(len(data)))
	return append(b, data...)
}

// AppendString appends a length-delimited field holding s.
func AppendString(b []byte, field int, s string) []byte {
	b = AppendTag(b, field, Bytes)
	b = AppendVarint(b, uint64(len(s)))
	return append(b, s...)
}

// Field is one decoded field: its number, wire type, and varint value (Varint) or payload
// (Bytes); fixed-size fields are skipped, their value not kept.
type Field struct {
	Num   int
	Wire  int
	Value uint64
	Bytes []byte
}

// ReadVarint decodes the varint at the start of b and returns the rest.
func ReadVarint(b []byte) (uint64, []byte, error) {
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
	return 0, nil, ErrTruncated
}

// Next decodes the field at the start of b and returns the rest.
func Next(b []byte) (Field, []byte, error) {
	key, b, err := ReadVarint(b)
	if err != nil {
		return Field{}, nil, err
	}
	f := Field{Num: int(key >> 3), Wire: int(key & 7)}
	if f.Num <= 0 || key>>3 > maxFieldNumber {
		return Field{}, nil, fmt.Errorf("bad field number %d", key>>3)
	}
	switch f.Wire {
	case Varint:
		f.Value, b, err = ReadVarint(b)
	case Fixed64:
		if len(b) < 8 {
			return Field{}, nil, ErrTruncated
		}
		b = b[8:]
	case Fixed32:
		if len(b) < 4 {
			return Field{}, nil, ErrTruncated
		}
		b = b[4:]
	case Bytes:
		var n uint64
		if n, b, err = ReadVarint(b); err == nil {
			if n > uint64(len(b)) {
				return Field{}, nil, ErrTruncated
			}
			f.Bytes, b = b[:n], b[n:]
		}
	default:
		return Field{}, nil, fmt.Errorf("field %d: unsupported wire type %d", f.Num, f.Wire)
	}
	return f, b, err
}

// Each calls fn for every field of the message b, in order; it stops at the first error.
func Each(b []byte, fn func(f Field) error) error {
	for len(b) > 0 {
		f, rest, err := Next(b)
		if err != nil {
			return err
		}
		if err := fn(f); err != nil {
			return err
		}
		b = rest
	}
	return nil
}
