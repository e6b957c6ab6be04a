package host

import (
	"math"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Property values are Go values that the host serializes as Envoy serializes CEL values
// (source/extensions/common/wasm/context.cc, serializeValue):
//
//   - string, []byte: the raw bytes
//   - int, int32, int64, uint32, uint64: 8 bytes little-endian (Envoy's int64/uint64)
//   - float64: 8 bytes little-endian IEEE 754 (protobuf Struct numbers, e.g. node.metadata)
//   - bool: one byte, 0 or 1
//   - time.Time: int64 nanoseconds since the epoch (timestamps)
//   - time.Duration: int64 nanoseconds
//   - map[string]any, map[string]string: serialized pairs of key and serialized value,
//     sorted by key; nested segments of a path index into the map
//   - []any, []string: serialized pairs of serialized element and "" (Envoy's lists);
//     a path segment may index a list by decimal position
//   - Lazy: a map whose keys are computed on demand; it cannot be serialized whole, like
//     Envoy's request/response/connection wrappers (SerializationFailure)
//
// Anything else (or nil) reads as NotFound.

// Lazy is a property map computed per key.
type Lazy func(key string) (any, bool)

// Node describes the proxy's xDS node, served as the "node" property (and xds.node).
type Node struct {
	ID       string
	Cluster  string
	Metadata map[string]any
	Locality struct{ Region, Zone, SubZone string }
	// UserAgentName and UserAgentVersion identify the proxy build.
	UserAgentName, UserAgentVersion string
}

// Property returns the node as a property value.
func (n Node) Property() map[string]any {
	m := map[string]any{"id": n.ID, "cluster": n.Cluster, "user_agent_name": n.UserAgentName}
	if n.UserAgentVersion != "" {
		m["user_agent_version"] = n.UserAgentVersion
	}
	md := n.Metadata
	if md == nil {
		md = map[string]any{}
	}
	m["metadata"] = md
	m["locality"] = map[string]any{"region": n.Locality.Region, "zone": n.Locality.Zone, "sub_zone": n.Locality.SubZone}
	return m
}

// SerializeProperty encodes a property value as the guest receives it.
func SerializeProperty(v any) ([]byte, Status) {
	switch x := v.(type) {
	case nil:
		return nil, StatusNotFound
	case string:
		return []byte(x), StatusOK
	case []byte:
		return append([]byte(nil), x...), StatusOK
	case int:
		return le64(uint64(int64(x))), StatusOK
	case int32:
		return le64(uint64(int64(x))), StatusOK
	case int64:
		return le64(uint64(x)), StatusOK
	case uint32:
		return le64(uint64(x)), StatusOK
	case uint64:
		return le64(x), StatusOK
	case float64:
		return le64(math.Float64bits(x)), StatusOK
	case bool:
		if x {
			return []byte{1}, StatusOK
		}
		return []byte{0}, StatusOK
	case time.Time:
		return le64(uint64(x.UnixNano())), StatusOK
	case time.Duration:
		return le64(uint64(int64(x))), StatusOK
	case map[string]string:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		pairs := make([][2]string, len(keys))
		for i, k := range keys {
			pairs[i] = [2]string{k, x[k]}
		}
		return EncodePairs(pairs), StatusOK
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		pairs := make([][2]string, 0, len(keys))
		for _, k := range keys {
			b, st := SerializeProperty(x[k])
			if st == StatusNotFound {
				continue
			}
			if st != StatusOK {
				return nil, StatusSerializationFailure
			}
			pairs = append(pairs, [2]string{k, string(b)})
		}
		return EncodePairs(pairs), StatusOK
	case []string:
		pairs := make([][2]string, len(x))
		for i, s := range x {
			pairs[i] = [2]string{s, ""}
		}
		return EncodePairs(pairs), StatusOK
	case []any:
		pairs := make([][2]string, 0, len(x))
		for _, e := range x {
			b, st := SerializeProperty(e)
			if st != StatusOK {
				return nil, StatusSerializationFailure
			}
			pairs = append(pairs, [2]string{string(b), ""})
		}
		return EncodePairs(pairs), StatusOK
	case Lazy:
		return nil, StatusSerializationFailure
	}
	return nil, StatusNotFound
}

// descend follows one path segment into a value.
func descend(v any, seg string) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		e, ok := x[seg]
		return e, ok && e != nil
	case map[string]string:
		e, ok := x[seg]
		return e, ok
	case Lazy:
		return x(seg)
	case []any:
		i, err := strconv.Atoi(seg)
		if err != nil || i < 0 || i >= len(x) {
			return nil, false
		}
		return x[i], true
	case []string:
		i, err := strconv.Atoi(seg)
		if err != nil || i < 0 || i >= len(x) {
			return nil, false
		}
		return x[i], true
	}
	return nil, false
}

// getProperty resolves a path for the effective context of vc and serializes the value.
func (vc *vmCall) getProperty(path []string) ([]byte, Status) {
	v, state, st := vc.resolveProperty(path)
	if st != StatusOK {
		return nil, st
	}
	if state != nil {
		return append([]byte(nil), state...), StatusOK
	}
	return SerializeProperty(v)
}

// resolveProperty finds the value at path: raw bytes the guest set (state), or a value to
// serialize.
func (vc *vmCall) resolveProperty(path []string) (v any, state []byte, st Status) {
	if len(path) == 0 {
		return nil, nil, StatusNotFound
	}
	s := vc.streamCore()
	var http *HTTPStream
	if gc := vc.vm.contexts[vc.effective]; gc != nil {
		http = gc.http
	}
	// Values set by the guest are raw bytes; an exact match on the full path wins so that
	// multi-segment keys round-trip (Envoy only matches the first segment).
	if s != nil && s.filterState != nil {
		if b, ok := s.filterState[strings.Join(path, "\x00")]; ok {
			return nil, b, StatusOK
		}
	}
	var ok bool
	rest := path[1:]
	if v, ok = s.attribute(path[0], rest, http); ok {
		// A stream attribute looked up by its key directly, without a Lazy map.
		rest = rest[1:]
	} else if v, ok = vc.topLevel(path[0], s, http); !ok {
		return nil, nil, StatusNotFound
	}
	for _, seg := range rest {
		if v, ok = descend(v, seg); !ok {
			return nil, nil, StatusNotFound
		}
	}
	if v == nil {
		return nil, nil, StatusNotFound
	}
	return v, nil, StatusOK
}

// attribute serves name.key for the stream attribute maps (request.path,
// connection.mtls, ...) without building them; ok is false for anything else, including
// a key that is not there, which the general path then reports.
func (s *streamCore) attribute(name string, rest []string, http *HTTPStream) (any, bool) {
	if s == nil || len(rest) == 0 {
		return nil, false
	}
	k := rest[0]
	switch name {
	case "request":
		if http != nil {
			return http.requestAttr(k)
		}
	case "response":
		if http != nil {
			return http.responseAttr(k)
		}
	case "connection":
		return s.connectionAttr(k)
	case "upstream":
		return s.upstreamAttr(k)
	case "source":
		return endpointAttr(s.info.Source, k)
	case "destination":
		return endpointAttr(s.info.Destination, k)
	}
	return nil, false
}

func (vc *vmCall) topLevel(name string, s *streamCore, http *HTTPStream) (any, bool) {
	p := vc.vm.p
	if s != nil {
		if v, ok := s.builtin(name, http); ok {
			return v, true
		}
	}
	switch name {
	case "plugin_name":
		return p.cfg.Name, true
	case "plugin_root_id":
		return p.cfg.RootID, true
	case "plugin_vm_id":
		return p.cfg.VMID, true
	case "xds":
		return vc.xds(s), true
	}
	if s != nil {
		if v, ok := s.info.Properties[name]; ok && v != nil {
			return v, true
		}
	}
	if v, ok := p.env.Properties[name]; ok && v != nil {
		return v, true
	}
	return nil, false
}

// xds is the xds.* attribute map: the stream's routing decision over the embedder's
// process-level "xds" properties, with xds.node taken from "node".
func (vc *vmCall) xds(s *streamCore) any {
	p := vc.vm.p
	base, _ := p.env.Properties["xds"].(map[string]any)
	return Lazy(func(k string) (any, bool) {
		if s != nil {
			if extra, ok := s.info.Properties["xds"].(map[string]any); ok {
				if v, ok := extra[k]; ok {
					return v, true
				}
			}
			switch k {
			case "cluster_name":
				return nonEmpty(s.info.ClusterName)
			case "route_name":
				return nonEmpty(s.info.RouteName)
			}
		}
		if v, ok := base[k]; ok {
			return v, true
		}
		if k == "node" {
			v, ok := p.env.Properties["node"]
			return v, ok
		}
		return nil, false
	})
}

func nonEmpty(s string) (any, bool) { return s, s != "" }

func nonEmptyAddr(a Address) (any, bool) { return string(a), a != "" }

func addrPort(a Address) (any, bool) {
	_, port, err := net.SplitHostPort(string(a))
	if err != nil {
		return nil, false
	}
	n, err := strconv.ParseInt(port, 10, 64)
	if err != nil {
		return nil, false
	}
	return n, true
}

// builtin serves the stream attributes Envoy computes itself.
func (s *streamCore) builtin(name string, http *HTTPStream) (any, bool) {
	switch name {
	case "request":
		if http == nil {
			return nil, false
		}
		return Lazy(http.requestAttr), true
	case "response":
		if http == nil {
			return nil, false
		}
		return Lazy(http.responseAttr), true
	case "source":
		return Lazy(func(k string) (any, bool) { return endpointAttr(s.info.Source, k) }), true
	case "destination":
		return Lazy(func(k string) (any, bool) { return endpointAttr(s.info.Destination, k) }), true
	case "connection":
		return Lazy(s.connectionAttr), true
	case "upstream":
		return Lazy(s.upstreamAttr), true
	case "connection_id":
		return s.info.Connection.ID, true
	case "cluster_name":
		return nonEmpty(s.info.ClusterName)
	case "route_name":
		return nonEmpty(s.info.RouteName)
	}
	return nil, false
}

func endpointAttr(a Address, k string) (any, bool) {
	switch k {
	case "address":
		return nonEmptyAddr(a)
	case "port":
		return addrPort(a)
	}
	return nil, false
}

func (s *streamCore) connectionAttr(k string) (any, bool) {
	c := s.info.Connection
	switch k {
	case "id":
		return c.ID, true
	case "mtls":
		return c.MTLS, true
	case "requested_server_name":
		return nonEmpty(c.RequestedServerName)
	case "tls_version":
		return nonEmpty(c.TLSVersion)
	case "subject_local_certificate":
		return nonEmpty(c.SubjectLocalCertificate)
	case "subject_peer_certificate":
		return nonEmpty(c.SubjectPeerCertificate)
	case "dns_san_local_certificate":
		return nonEmpty(c.DNSSanLocalCertificate)
	case "dns_san_peer_certificate":
		return nonEmpty(c.DNSSanPeerCertificate)
	case "uri_san_local_certificate":
		return nonEmpty(c.URISanLocalCertificate)
	case "uri_san_peer_certificate":
		return nonEmpty(c.URISanPeerCertificate)
	case "sha256_peer_certificate_digest":
		return nonEmpty(c.SHA256PeerCertificateDigest)
	case "termination_details":
		return nonEmpty(c.TerminationDetails)
	}
	return nil, false
}

func (s *streamCore) upstreamAttr(k string) (any, bool) {
	u := s.info.Upstream
	switch k {
	case "address":
		return nonEmptyAddr(u.Address)
	case "port":
		return addrPort(u.Address)
	case "local_address":
		return nonEmptyAddr(u.LocalAddress)
	case "tls_version":
		return nonEmpty(u.TLSVersion)
	case "subject_local_certificate":
		return nonEmpty(u.SubjectLocalCertificate)
	case "subject_peer_certificate":
		return nonEmpty(u.SubjectPeerCertificate)
	case "dns_san_local_certificate":
		return nonEmpty(u.DNSSanLocalCertificate)
	case "dns_san_peer_certificate":
		return nonEmpty(u.DNSSanPeerCertificate)
	case "uri_san_local_certificate":
		return nonEmpty(u.URISanLocalCertificate)
	case "uri_san_peer_certificate":
		return nonEmpty(u.URISanPeerCertificate)
	case "sha256_peer_certificate_digest":
		return nonEmpty(u.SHA256PeerCertificateDigest)
	case "transport_failure_reason":
		return nonEmpty(u.TransportFailureReason)
	}
	return nil, false
}

// headersAttr is the map form of a header map: repeated headers joined by ",".
func headersAttr(h *Headers) (any, bool) {
	if h == nil {
		return nil, false
	}
	m := map[string]string{}
	for _, p := range h.Pairs() {
		if v, ok := m[p[0]]; ok {
			m[p[0]] = v + "," + p[1]
		} else {
			m[p[0]] = p[1]
		}
	}
	return m, true
}

func headerAttr(h *Headers, key string) (any, bool) {
	v, ok := h.joined(key)
	return v, ok
}

func (s *HTTPStream) requestAttr(k string) (any, bool) {
	h := s.reqH
	switch k {
	case "path":
		return headerAttr(h, ":path")
	case "url_path":
		p, ok := h.Get(":path")
		if !ok {
			return nil, false
		}
		if i := strings.IndexByte(p, '?'); i >= 0 {
			p = p[:i]
		}
		return p, true
	case "query":
		p, ok := h.Get(":path")
		if !ok {
			return nil, false
		}
		_, q, _ := strings.Cut(p, "?")
		return q, true
	case "host":
		return headerAttr(h, ":authority")
	case "scheme":
		return headerAttr(h, ":scheme")
	case "method":
		return headerAttr(h, ":method")
	case "headers":
		return headersAttr(h)
	case "referer":
		return headerAttr(h, "referer")
	case "useragent":
		return headerAttr(h, "user-agent")
	case "id":
		return headerAttr(h, "x-request-id")
	case "time":
		if s.info.StartTime.IsZero() {
			return nil, false
		}
		return s.info.StartTime, true
	case "protocol":
		return nonEmpty(s.info.Protocol)
	case "duration":
		if s.info.Duration <= 0 {
			return nil, false
		}
		return s.info.Duration, true
	case "size":
		// Envoy prefers content-length when the request has one.
		if v, ok := h.Get("content-length"); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return n, true
			}
		}
		return s.reqBytes, true
	case "total_size":
		return s.reqBytes + int64(h.ByteSize()) + int64(s.reqT.ByteSize()), true
	}
	return nil, false
}

func (s *HTTPStream) responseAttr(k string) (any, bool) {
	h := s.respH
	switch k {
	case "code":
		if s.info.ResponseCode != 0 {
			return int64(s.info.ResponseCode), true
		}
		v, ok := h.Get(":status")
		if !ok {
			return nil, false
		}
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	case "code_details":
		return nonEmpty(s.info.ResponseCodeDetails)
	case "flags":
		return int64(s.info.ResponseFlags), true
	case "grpc_status":
		for _, m := range []*Headers{s.respT, h} {
			if v, ok := m.Get("grpc-status"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				return n, err == nil
			}
		}
		return nil, false
	case "headers":
		return headersAttr(h)
	case "trailers":
		return headersAttr(s.respT)
	case "size":
		return s.respBytes, true
	case "total_size":
		return s.respBytes + int64(h.ByteSize()) + int64(s.respT.ByteSize()), true
	}
	return nil, false
}

// streamCore returns the stream of the effective context, if it is one.
func (vc *vmCall) streamCore() *streamCore {
	if gc := vc.vm.contexts[vc.effective]; gc != nil {
		return gc.core()
	}
	return nil
}
