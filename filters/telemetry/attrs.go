package main

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// Attributes are what expressions read: Envoy's attribute names
// (https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/advanced/attributes)
// plus Istio's upstream_peer and downstream_peer. Each is known at configure time with
// its type and where it comes from, so an expression that names an attribute this filter
// cannot read is refused instead of evaluating to "unknown" forever.
//
// Where a value comes from:
//   - request and response header attributes (request.host, request.headers['x'],
//     response.headers['x'], ...) are captured in the header callbacks, because not
//     every host can read headers once the stream is over;
//   - node.* is read once at configure time (the proxy's node does not change);
//   - upstream_peer / downstream_peer come from the exchanged peer metadata (upstream_peer
//     on the client side, downstream_peer on the server side; the other is absent);
//   - everything else is a host property read (once per request, when first used) when
//     the stream is done, decoded as Envoy serializes it: strings raw, ints and enums as
//     8-byte little-endian, bools as one byte.
//
// Time-valued attributes (request.time, request.duration, response.backend_latency) are
// refused: CEL gives them duration and timestamp types this subset does not have.

type attrSource uint8

const (
	srcProperty attrSource = iota + 1
	srcRequestHeader
	srcResponseHeader
	srcResponseTrailer
	srcPeer
	srcConst
)

// pathPart selects what a :path-derived attribute keeps.
type pathPart uint8

const (
	partAll pathPart = iota
	partURLPath
	partQuery
)

// fallback names a captured value a property attribute falls back to when the host does
// not provide the property.
type fallback uint8

const (
	noFallback fallback = iota
	fallbackStatus
	fallbackGRPCStatus
)

type attribute struct {
	name     string // canonical form, e.g. request.headers['x-user']
	typ      valType
	src      attrSource
	path     []string // srcProperty
	header   string   // header sources, lower case
	part     pathPart
	fallback fallback
	upstream bool   // srcPeer: upstream_peer (else downstream_peer)
	field    string // srcPeer: workload field; "" with label set
	label    string // srcPeer: labels[label]
	constVal value  // srcConst
	constOK  bool
}

// nodeReader reads a node property at configure time.
type nodeReader func(path []string) ([]byte, bool)

// lookupAttribute describes the attribute at path, or says why there is none.
func lookupAttribute(path []string, node nodeReader) (*attribute, error) {
	name := attributeName(path)
	a := &attribute{name: name}
	prop := func(t valType) (*attribute, error) {
		a.typ, a.src, a.path = t, srcProperty, path
		return a, nil
	}
	header := func(src attrSource, h string) (*attribute, error) {
		a.typ, a.src, a.header = typeString, src, strings.ToLower(h)
		return a, nil
	}
	leaf := len(path) == 2
	switch path[0] {
	case "request":
		switch {
		case len(path) == 3 && path[1] == "headers":
			return header(srcRequestHeader, path[2])
		case !leaf:
		case path[1] == "path":
			return header(srcRequestHeader, ":path")
		case path[1] == "url_path" || path[1] == "query":
			a.part = partURLPath
			if path[1] == "query" {
				a.part = partQuery
			}
			return header(srcRequestHeader, ":path")
		case path[1] == "host":
			return header(srcRequestHeader, ":authority")
		case path[1] == "scheme":
			return header(srcRequestHeader, ":scheme")
		case path[1] == "method":
			return header(srcRequestHeader, ":method")
		case path[1] == "referer":
			return header(srcRequestHeader, "referer")
		case path[1] == "useragent":
			return header(srcRequestHeader, "user-agent")
		case path[1] == "id":
			return header(srcRequestHeader, "x-request-id")
		case path[1] == "protocol":
			return prop(typeString)
		case path[1] == "size" || path[1] == "total_size":
			return prop(typeInt)
		case path[1] == "time" || path[1] == "duration":
			return nil, fmt.Errorf("attribute %s is a time value, which is not supported", name)
		}
	case "response":
		switch {
		case len(path) == 3 && path[1] == "headers":
			return header(srcResponseHeader, path[2])
		case len(path) == 3 && path[1] == "trailers":
			return header(srcResponseTrailer, path[2])
		case !leaf:
		case path[1] == "code":
			a.fallback = fallbackStatus
			return prop(typeInt)
		case path[1] == "grpc_status":
			a.fallback = fallbackGRPCStatus
			return prop(typeInt)
		case path[1] == "code_details":
			return prop(typeString)
		case path[1] == "flags" || path[1] == "size" || path[1] == "total_size":
			return prop(typeInt)
		case path[1] == "backend_latency":
			return nil, fmt.Errorf("attribute %s is a time value, which is not supported", name)
		}
	case "source", "destination":
		if leaf {
			switch path[1] {
			case "address":
				return prop(typeString)
			case "port":
				return prop(typeInt)
			}
		}
	case "connection":
		if leaf {
			switch path[1] {
			case "id":
				return prop(typeInt)
			case "mtls":
				return prop(typeBool)
			case "requested_server_name", "tls_version", "subject_local_certificate",
				"subject_peer_certificate", "dns_san_local_certificate", "dns_san_peer_certificate",
				"uri_san_local_certificate", "uri_san_peer_certificate",
				"sha256_peer_certificate_digest", "termination_details":
				return prop(typeString)
			}
		}
	case "upstream":
		if leaf {
			switch path[1] {
			case "port", "request_attempt_count":
				return prop(typeInt)
			case "address", "local_address", "tls_version", "subject_local_certificate",
				"subject_peer_certificate", "dns_san_local_certificate", "dns_san_peer_certificate",
				"uri_san_local_certificate", "uri_san_peer_certificate",
				"sha256_peer_certificate_digest", "transport_failure_reason":
				return prop(typeString)
			}
		}
	case "xds":
		if leaf {
			switch path[1] {
			case "cluster_name", "route_name", "filter_chain_name":
				return prop(typeString)
			}
		}
	case "cluster_name", "route_name", "plugin_name", "plugin_root_id", "plugin_vm_id":
		if len(path) == 1 {
			return prop(typeString)
		}
	case "listener_direction":
		if len(path) == 1 {
			return prop(typeInt)
		}
	case "filter_state":
		// Envoy's Wasm host serves filter state objects as top-level properties named by
		// their key, as their serialized bytes.
		if leaf {
			a.typ, a.src, a.path = typeString, srcProperty, path[1:]
			return a, nil
		}
	case "node":
		if (leaf && (path[1] == "id" || path[1] == "cluster")) || (len(path) >= 3 && path[1] == "metadata") {
			a.typ, a.src = typeString, srcConst
			if b, ok := node(path); ok {
				a.constVal, a.constOK = value{s: string(b)}, true
			}
			return a, nil
		}
	case "upstream_peer", "downstream_peer":
		a.typ, a.src, a.upstream = typeString, srcPeer, path[0] == "upstream_peer"
		if len(path) == 3 && path[1] == "labels" {
			a.label = path[2]
			return a, nil
		}
		if leaf {
			for _, f := range peerFields {
				if f == path[1] {
					a.field = f
					return a, nil
				}
			}
		}
		return nil, fmt.Errorf("unknown attribute %s (a peer has labels['NAME'] and %s)", name, strings.Join(peerFields[:], ", "))
	}
	return nil, fmt.Errorf("unknown attribute %s", name)
}

// attributeName writes path back in expression syntax: dotted identifiers, ['...'] for
// map keys and anything that is not an identifier.
func attributeName(path []string) string {
	var b strings.Builder
	inMap := false
	for i, seg := range path {
		if !inMap && isIdentifier(seg) {
			switch seg {
			case "headers", "trailers", "labels", "metadata", "filter_state":
				inMap = i > 0 || seg == "filter_state"
			}
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(seg)
			continue
		}
		b.WriteString("['")
		b.WriteString(strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(seg))
		b.WriteString("']")
	}
	return b.String()
}

func isIdentifier(s string) bool {
	if s == "" || !isIdentStart(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !isIdentStart(s[i]) && !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// decodeProperty decodes a property value as Envoy serializes it; false for a value of
// the wrong shape.
func decodeProperty(t valType, b []byte) (value, bool) {
	switch t {
	case typeInt:
		if len(b) != 8 {
			return value{}, false
		}
		return value{i: int64(binary.LittleEndian.Uint64(b))}, true
	case typeBool:
		if len(b) != 1 {
			return value{}, false
		}
		return value{b: b[0] != 0}, true
	}
	return value{s: string(b)}, true
}

// applyPathPart cuts a :path down to what the attribute wants.
func applyPathPart(p pathPart, path string) string {
	switch p {
	case partURLPath:
		if i := strings.IndexByte(path, '?'); i >= 0 {
			return path[:i]
		}
	case partQuery:
		_, q, _ := strings.Cut(path, "?")
		return q
	}
	return path
}
