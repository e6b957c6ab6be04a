package xds

import (
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// Wire encoding of responses. A shared resource set is encoded into DiscoveryResponse (and
// DeltaDiscoveryResponse) field bytes once; each connection's response is then a few header
// bytes plus references to the shared bytes, handed to gRPC through Codec without another
// marshal. The bytes are exactly what proto.Marshal of the response message would produce
// (fields in a different order, which protobuf parsers accept).

// Field numbers of envoy.service.discovery.v3 messages.
const (
	respVersionInfo = 1 // DiscoveryResponse.version_info, DeltaDiscoveryResponse.system_version_info
	respResources   = 2
	respTypeURL     = 4
	respNonce       = 5
	respRemoved     = 6 // DeltaDiscoveryResponse.removed_resources

	resourceVersion = 1 // Resource.version
	resourceAny     = 2 // Resource.resource
	resourceName    = 3 // Resource.name
)

// encodeAny returns the encoding of an Any message and the offset of its value.
func encodeAny(typeURL string, value []byte) ([]byte, int) {
	b := make([]byte, 0, len(typeURL)+len(value)+12)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, typeURL)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(value)))
	off := len(b)
	return append(b, value...), off
}

// appendSotw appends the item as a DiscoveryResponse.resources entry.
func (r *Resource) appendSotw(b []byte) []byte {
	b = protowire.AppendTag(b, respResources, protowire.BytesType)
	return protowire.AppendBytes(b, r.wire)
}

// appendDelta appends the item as a DeltaDiscoveryResponse.resources entry.
func (r *Resource) appendDelta(b []byte, version string) []byte {
	n := protowire.SizeTag(resourceVersion) + protowire.SizeBytes(len(version)) +
		protowire.SizeTag(resourceAny) + protowire.SizeBytes(len(r.wire)) +
		protowire.SizeTag(resourceName) + protowire.SizeBytes(len(r.Name))
	b = protowire.AppendTag(b, respResources, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b = protowire.AppendTag(b, resourceVersion, protowire.BytesType)
	b = protowire.AppendString(b, version)
	b = protowire.AppendTag(b, resourceAny, protowire.BytesType)
	b = protowire.AppendBytes(b, r.wire)
	b = protowire.AppendTag(b, resourceName, protowire.BytesType)
	return protowire.AppendString(b, r.Name)
}

// deltaEntry is the item's whole DeltaDiscoveryResponse.resources entry, encoded on first
// use and then referenced by every response that carries the item: a resource sent to
// thousands of proxies (an endpoints-only push) is encoded once, not once per connection.
func (r *Resource) deltaEntry() []byte {
	if b := r.delta.Load(); b != nil {
		return *b
	}
	b := r.appendDelta(nil, VersionOf(r.Hash))
	r.delta.Store(&b) // a racing encoder stores the same bytes
	return b
}

// VersionOf is the delta version string of a resource: its content hash.
func VersionOf(h uint64) string { return formatHash(h) }

func formatHash(h uint64) string {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	if h == 0 {
		return "0"
	}
	var buf [13]byte
	i := len(buf)
	for h > 0 {
		i--
		buf[i] = digits[h%36]
		h /= 36
	}
	return string(buf[i:])
}

// encodedSet caches the encodings of a whole Resources.
type encodedSet struct {
	sotwOnce, deltaOnce sync.Once
	sotw, delta         []byte
}

// Encoded is a response ready for the wire: gRPC sends the parts as they are.
type Encoded struct {
	parts [][]byte
	size  int
}

// Size is the encoded length.
func (e *Encoded) Size() int { return e.size }

func (e *Encoded) add(b []byte) {
	if len(b) > 0 {
		e.parts = append(e.parts, b)
		e.size += len(b)
	}
}

func header(version, typeURL, nonce string) []byte {
	b := make([]byte, 0, len(version)+len(typeURL)+len(nonce)+12)
	b = protowire.AppendTag(b, respVersionInfo, protowire.BytesType)
	b = protowire.AppendString(b, version)
	b = protowire.AppendTag(b, respTypeURL, protowire.BytesType)
	b = protowire.AppendString(b, typeURL)
	b = protowire.AppendTag(b, respNonce, protowire.BytesType)
	return protowire.AppendString(b, nonce)
}

// EncodeSotw builds a DiscoveryResponse. When items is the whole of set, the set's cached
// encoding is used; otherwise the items are encoded now.
func EncodeSotw(version, typeURL, nonce string, set *Resources, items []*Resource) *Encoded {
	e := &Encoded{}
	e.add(header(version, typeURL, nonce))
	if set != nil && len(items) == len(set.Items) {
		set.enc.sotwOnce.Do(func() {
			var b []byte
			for _, it := range set.Items {
				b = it.appendSotw(b)
			}
			set.enc.sotw = b
		})
		e.add(set.enc.sotw)
		return e
	}
	var b []byte
	for _, it := range items {
		b = it.appendSotw(b)
	}
	e.add(b)
	return e
}

// EncodeDelta builds a DeltaDiscoveryResponse.
func EncodeDelta(version, typeURL, nonce string, set *Resources, items []*Resource, removed []string) *Encoded {
	e := &Encoded{}
	e.add(header(version, typeURL, nonce))
	if set != nil && len(items) == len(set.Items) && len(items) > 0 {
		set.enc.deltaOnce.Do(func() {
			var b []byte
			for _, it := range set.Items {
				b = it.appendDelta(b, VersionOf(it.Hash))
			}
			set.enc.delta = b
		})
		e.add(set.enc.delta)
	} else {
		for _, it := range items {
			e.add(it.deltaEntry())
		}
	}
	var b []byte
	for _, n := range removed {
		b = protowire.AppendTag(b, respRemoved, protowire.BytesType)
		b = protowire.AppendString(b, n)
	}
	e.add(b)
	return e
}

// Codec is gRPC's proto codec that also sends Encoded responses as they are. Register it on
// the xDS server with grpc.ForceServerCodecV2.
type Codec struct{ Proto encoding.CodecV2 }

// NewCodec wraps gRPC's registered proto codec.
func NewCodec() Codec { return Codec{Proto: encoding.GetCodecV2("proto")} }

// Name implements encoding.CodecV2; the content subtype stays "proto".
func (Codec) Name() string { return "proto" }

// Marshal implements encoding.CodecV2.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*Encoded); ok {
		out := make(mem.BufferSlice, len(e.parts))
		for i, p := range e.parts {
			out[i] = mem.SliceBuffer(p)
		}
		return out, nil
	}
	return c.Proto.Marshal(v)
}

// Unmarshal implements encoding.CodecV2.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error { return c.Proto.Unmarshal(data, v) }
