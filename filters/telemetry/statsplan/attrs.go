package statsplan

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/wasmesh/wasmesh/filters/telemetry/expr"
)

// Attributes are what expressions read: Envoy's attribute names
// (https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/advanced/attributes)
// plus Istio's upstream_peer and downstream_peer. Each is known at configure time with
// its type and where it comes from, so an expression that names an attribute the filter
// cannot read is refused instead of evaluating to "unknown" forever.
//
// Where a value comes from ([Source]):
//   - request and response header attributes (request.host, request.headers['x'],
//     response.headers['x'], ...) are captured in the header callbacks, because not
//     every host can read headers once the stream is over;
//   - node.* is read once at configure time (the proxy's node does not change);
//   - upstream_peer / downstream_peer come from the exchanged peer metadata (upstream_peer
//     on the client side, downstream_peer on the server side; the other is absent);
//   - everything else is a host property read (once per request, when first used) when
//     the stream is done, decoded as Envoy serializes it ([DecodeProperty]): strings raw,
//     ints and enums as 8-byte little-endian, bools as one byte.
//
// Time-valued attributes (request.time, request.duration, response.backend_latency) are
// refused: CEL gives them duration and timestamp types this subset does not have.

// Source says where a filter reads an attribute's value from.
type Source uint8

const (
	// SourceProperty: the host property at [Attribute.Path], decoded by [DecodeProperty].
	SourceProperty Source = iota + 1
	// SourceRequestHeader: the request header [Attribute.Header], cut by [Attribute.Part].
	SourceRequestHeader
	// SourceResponseHeader: the response header [Attribute.Header].
	SourceResponseHeader
	// SourceResponseTrailer: the response trailer [Attribute.Header].
	SourceResponseTrailer
	// SourcePeer: the other side's workload, from its peer metadata.
	SourcePeer
	// SourceConstant: [Attribute.Const], read from the node at configure time.
	SourceConstant
)

// PathPart selects what a :path-derived attribute keeps.
type PathPart uint8

const (
	PartAll     PathPart = iota // request.path: all of it
	PartURLPath                 // request.url_path: without the query
	PartQuery                   // request.query: the query, without '?'
)

// Fallback names a captured value a property attribute falls back to when the host does
// not provide the property.
type Fallback uint8

const (
	NoFallback         Fallback = iota
	FallbackStatus              // the response's :status header
	FallbackGRPCStatus          // the response's grpc-status header or trailer
)

// Attribute is an attribute an expression reads: its canonical name, its type and where
// its value comes from.
type Attribute struct {
	Name      string // canonical form, e.g. request.headers['x-user']
	Type      expr.Type
	Source    Source
	Path      []string // SourceProperty: the property path
	Header    string   // header and trailer sources: the name, lower case
	Part      PathPart // SourceRequestHeader
	Fallback  Fallback // SourceProperty
	Upstream  bool     // SourcePeer: upstream_peer (else downstream_peer)
	PeerField string   // SourcePeer: one of PeerFields; "" for a label
	PeerLabel string   // SourcePeer: labels[PeerLabel]
	Const     expr.Value
	ConstOK   bool // SourceConstant: the node has the value
}

// NodeReader reads a property of the proxy's node (node.id, node.metadata['KEY'], ...) at
// configure time; false when the node does not have it.
type NodeReader func(path []string) ([]byte, bool)

// LookupAttribute describes the attribute at path, or says why there is none: an
// unknown attribute, or one this filter cannot read (a time value).
func LookupAttribute(path []string, node NodeReader) (*Attribute, error) {
	name := attributeName(path)
	a := &Attribute{Name: name}
	prop := func(t expr.Type) (*Attribute, error) {
		a.Type, a.Source, a.Path = t, SourceProperty, path
		return a, nil
	}
	header := func(src Source, h string) (*Attribute, error) {
		a.Type, a.Source, a.Header = expr.String, src, strings.ToLower(h)
		return a, nil
	}
	leaf := len(path) == 2
	switch path[0] {
	case "request":
		switch {
		case len(path) == 3 && path[1] == "headers":
			return header(SourceRequestHeader, path[2])
		case !leaf:
		case path[1] == "path":
			return header(SourceRequestHeader, ":path")
		case path[1] == "url_path" || path[1] == "query":
			a.Part = PartURLPath
			if path[1] == "query" {
				a.Part = PartQuery
			}
			return header(SourceRequestHeader, ":path")
		case path[1] == "host":
			return header(SourceRequestHeader, ":authority")
		case path[1] == "scheme":
			return header(SourceRequestHeader, ":scheme")
		case path[1] == "method":
			return header(SourceRequestHeader, ":method")
		case path[1] == "referer":
			return header(SourceRequestHeader, "referer")
		case path[1] == "useragent":
			return header(SourceRequestHeader, "user-agent")
		case path[1] == "id":
			return header(SourceRequestHeader, "x-request-id")
		case path[1] == "protocol":
			return prop(expr.String)
		case path[1] == "size" || path[1] == "total_size":
			return prop(expr.Int)
		case path[1] == "time" || path[1] == "duration":
			return nil, fmt.Errorf("attribute %s is a time value, which is not supported", name)
		}
	case "response":
		switch {
		case len(path) == 3 && path[1] == "headers":
			return header(SourceResponseHeader, path[2])
		case len(path) == 3 && path[1] == "trailers":
			return header(SourceResponseTrailer, path[2])
		case !leaf:
		case path[1] == "code":
			a.Fallback = FallbackStatus
			return prop(expr.Int)
		case path[1] == "grpc_status":
			a.Fallback = FallbackGRPCStatus
			return prop(expr.Int)
		case path[1] == "code_details":
			return prop(expr.String)
		case path[1] == "flags" || path[1] == "size" || path[1] == "total_size":
			return prop(expr.Int)
		case path[1] == "backend_latency":
			return nil, fmt.Errorf("attribute %s is a time value, which is not supported", name)
		}
	case "source", "destination":
		if leaf {
			switch path[1] {
			case "address":
				return prop(expr.String)
			case "port":
				return prop(expr.Int)
			}
		}
	case "connection":
		if leaf {
			switch path[1] {
			case "id":
				return prop(expr.Int)
			case "mtls":
				return prop(expr.Bool)
			case "requested_server_name", "tls_version", "subject_local_certificate",
				"subject_peer_certificate", "dns_san_local_certificate", "dns_san_peer_certificate",
				"uri_san_local_certificate", "uri_san_peer_certificate",
				"sha256_peer_certificate_digest", "termination_details":
				return prop(expr.String)
			}
		}
	case "upstream":
		if leaf {
			switch path[1] {
			case "port", "request_attempt_count":
				return prop(expr.Int)
			case "address", "local_address", "tls_version", "subject_local_certificate",
				"subject_peer_certificate", "dns_san_local_certificate", "dns_san_peer_certificate",
				"uri_san_local_certificate", "uri_san_peer_certificate",
				"sha256_peer_certificate_digest", "transport_failure_reason":
				return prop(expr.String)
			}
		}
	case "xds":
		if leaf {
			switch path[1] {
			case "cluster_name", "route_name", "filter_chain_name":
				return prop(expr.String)
			}
		}
	case "cluster_name", "route_name", "plugin_name", "plugin_root_id", "plugin_vm_id":
		if len(path) == 1 {
			return prop(expr.String)
		}
	case "listener_direction":
		if len(path) == 1 {
			return prop(expr.Int)
		}
	case "filter_state":
		// Envoy's Wasm host serves filter state objects as top-level properties named by
		// their key, as their serialized bytes.
		if leaf {
			a.Type, a.Source, a.Path = expr.String, SourceProperty, path[1:]
			return a, nil
		}
	case "node":
		if (leaf && (path[1] == "id" || path[1] == "cluster")) || (len(path) >= 3 && path[1] == "metadata") {
			a.Type, a.Source = expr.String, SourceConstant
			if b, ok := node(path); ok {
				a.Const, a.ConstOK = expr.Value{Str: string(b)}, true
			}
			return a, nil
		}
	case "upstream_peer", "downstream_peer":
		a.Type, a.Source, a.Upstream = expr.String, SourcePeer, path[0] == "upstream_peer"
		if len(path) == 3 && path[1] == "labels" {
			a.PeerLabel = path[2]
			return a, nil
		}
		if leaf {
			for _, f := range PeerFields {
				if f == path[1] {
					a.PeerField = f
					return a, nil
				}
			}
		}
		return nil, fmt.Errorf("unknown attribute %s (a peer has labels['NAME'] and %s)", name, strings.Join(PeerFields[:], ", "))
	}
	return nil, fmt.Errorf("unknown attribute %s", name)
}

// attributeName writes path back in expression syntax: dotted identifiers, ['...'] for
// map keys and anything that is not an identifier.
func attributeName(path []string) string {
	var b strings.Builder
	inMap := false
	for i, seg := range path {
		if !inMap && expr.IsIdentifier(seg) {
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

// DecodeProperty decodes a property value of type t as Envoy serializes it; false for a
// value of the wrong shape.
func DecodeProperty(t expr.Type, b []byte) (expr.Value, bool) {
	switch t {
	case expr.Int:
		if len(b) != 8 {
			return expr.Value{}, false
		}
		return expr.Value{Int: int64(binary.LittleEndian.Uint64(b))}, true
	case expr.Bool:
		if len(b) != 1 {
			return expr.Value{}, false
		}
		return expr.Value{Bool: b[0] != 0}, true
	}
	return expr.Value{Str: string(b)}, true
}

// Cut cuts a :path down to what the attribute wants.
func (p PathPart) Cut(path string) string {
	switch p {
	case PartURLPath:
		if i := strings.IndexByte(path, '?'); i >= 0 {
			return path[:i]
		}
	case PartQuery:
		_, q, _ := strings.Cut(path, "?")
		return q
	}
	return path
}

// PeerFields are the fields of the other side's workload that upstream_peer.NAME and
// downstream_peer.NAME read (Istio's node metadata field names, plus short aliases); a
// peer's labels are upstream_peer.labels['NAME'].
var PeerFields = [...]string{
	"name", "namespace", "workload", "workload_name", "owner", "cluster", "cluster_id", "mesh_id",
	"service_account", "app", "version", "canonical_service", "canonical_revision",
}

// Resolver resolves the attribute paths of expressions ([expr.Resolver]) to the
// attributes [LookupAttribute] knows, giving each distinct attribute one slot however many
// expressions name it and however they spell it (request.host, request['host']), so a
// request reads it once.
type Resolver struct {
	node  NodeReader
	attrs []*Attribute
	slots map[string]int
}

// NewResolver returns a Resolver that reads node attributes with node.
func NewResolver(node NodeReader) *Resolver {
	return &Resolver{node: node, slots: map[string]int{}}
}

// Resolve is an [expr.Resolver]: pass r.Resolve to [expr.Compile].
func (r *Resolver) Resolve(path []string) (int, expr.Type, error) {
	a, err := LookupAttribute(path, r.node)
	if err != nil {
		return 0, 0, err
	}
	if s, ok := r.slots[a.Name]; ok {
		return s, a.Type, nil
	}
	s := len(r.attrs)
	r.slots[a.Name] = s
	r.attrs = append(r.attrs, a)
	return s, a.Type, nil
}

// Attributes returns the attributes resolved so far, indexed by slot.
func (r *Resolver) Attributes() []*Attribute { return r.attrs }
