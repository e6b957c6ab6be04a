package main

import (
	"encoding/base64"
	"fmt"
	"sort"

	"github.com/wasmesh/wasmesh/filters/internal/intern"
	"github.com/wasmesh/wasmesh/wasm/protowire"
)

// Peer metadata exchange, Istio style. The client side puts its identity on the request in
// two headers and the server side answers with its own on the response; each side strips
// the other's headers so the application never sees them:
//
//	x-envoy-peer-metadata-id: the proxy's node id (Istio: sidecar~IP~POD.NS~NS.svc.cluster.local)
//	x-envoy-peer-metadata:    base64 (standard alphabet, padded) of a serialized
//	                          google.protobuf.Struct holding the node metadata keys below
//
// The Struct encoding is hand-rolled (a few dozen lines of protobuf wire format) rather
// than replaced by something simpler, because it is what Istio's proxies send and expect:
// a wasmesh sidecar and an Istio sidecar on either end of a request see each other's
// workload, namespace and labels. Decoding accepts any Struct, skipping fields and value
// kinds it does not use, and is bounded by maxPeerHeaderLen.
const (
	headerPeerID       = "x-envoy-peer-metadata-id"
	headerPeerMetadata = "x-envoy-peer-metadata"

	// maxPeerHeaderLen bounds what the filter decodes from a peer; Istio's header for a
	// pod with a dozen labels is under 1 KiB.
	maxPeerHeaderLen = 8 << 10
)

// Node metadata keys (Istio's names, set by the agent from ISTIO_META_* and pod info).
const (
	metaName           = "NAME"
	metaNamespace      = "NAMESPACE"
	metaWorkloadName   = "WORKLOAD_NAME"
	metaOwner          = "OWNER"
	metaClusterID      = "CLUSTER_ID"
	metaMeshID         = "MESH_ID"
	metaServiceAccount = "SERVICE_ACCOUNT"
	metaLabels         = "LABELS"
)

// scalarMetadataKeys are the string-valued keys read from the local node and exchanged,
// in the (sorted) order they are encoded.
var scalarMetadataKeys = [...]string{
	metaClusterID, metaMeshID, metaName, metaNamespace, metaOwner, metaServiceAccount, metaWorkloadName,
}

// Label names Istio derives app, version and the canonical service from.
const (
	labelApp               = "app"
	labelVersion           = "version"
	labelK8sName           = "app.kubernetes.io/name"
	labelK8sVersion        = "app.kubernetes.io/version"
	labelCanonicalName     = "service.istio.io/canonical-name"
	labelCanonicalRevision = "service.istio.io/canonical-revision"
)

// nodeIdentity is a workload's identity as Istio node metadata carries it.
type nodeIdentity struct {
	Name           string
	Namespace      string
	WorkloadName   string
	Owner          string
	ClusterID      string
	MeshID         string
	ServiceAccount string
	Labels         map[string]string
}

func (n *nodeIdentity) scalar(key string) *string {
	switch key {
	case metaName:
		return &n.Name
	case metaNamespace:
		return &n.Namespace
	case metaWorkloadName:
		return &n.WorkloadName
	case metaOwner:
		return &n.Owner
	case metaClusterID:
		return &n.ClusterID
	case metaMeshID:
		return &n.MeshID
	case metaServiceAccount:
		return &n.ServiceAccount
	}
	return nil
}

// workload is a node identity with the label values the metrics use worked out once.
type workload struct {
	id nodeIdentity
	// app and version are the app and version labels, falling back to the
	// app.kubernetes.io ones (Istio reads only app and version; the fallback reports
	// workloads labelled the Kubernetes-recommended way instead of "unknown").
	app, version string
	// canonicalService and canonicalRevision follow Istio's injector: the
	// service.istio.io labels, then app.kubernetes.io, then app/version, then the
	// workload name and "latest".
	canonicalService, canonicalRevision string
}

func newWorkload(id nodeIdentity) *workload {
	l := id.Labels
	return &workload{
		id:                id,
		app:               firstNonEmpty(l[labelApp], l[labelK8sName]),
		version:           firstNonEmpty(l[labelVersion], l[labelK8sVersion]),
		canonicalService:  firstNonEmpty(l[labelCanonicalName], l[labelK8sName], l[labelApp], id.WorkloadName),
		canonicalRevision: firstNonEmpty(l[labelCanonicalRevision], l[labelK8sVersion], l[labelVersion], "latest"),
	}
}

// field returns the workload attribute exposed to expressions as upstream_peer.NAME and
// downstream_peer.NAME, one of statsplan.PeerFields (Istio's node metadata field names,
// plus short aliases).
func (w *workload) field(name string) (string, bool) {
	var v string
	switch name {
	case "name":
		v = w.id.Name
	case "namespace":
		v = w.id.Namespace
	case "workload", "workload_name":
		v = w.id.WorkloadName
	case "owner":
		v = w.id.Owner
	case "cluster", "cluster_id":
		v = w.id.ClusterID
	case "mesh_id":
		v = w.id.MeshID
	case "service_account":
		v = w.id.ServiceAccount
	case "app":
		v = w.app
	case "version":
		v = w.version
	case "canonical_service":
		v = w.canonicalService
	case "canonical_revision":
		v = w.canonicalRevision
	}
	return v, v != ""
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// encodePeerMetadata returns the x-envoy-peer-metadata value for id: the non-empty
// scalar keys and LABELS, in sorted key order so the header is the same on every proxy
// of a workload.
func encodePeerMetadata(id nodeIdentity) string {
	var b []byte
	for _, key := range scalarMetadataKeys {
		if key == metaName { // LABELS sorts between CLUSTER_ID/MESH_ID and NAME
			b = appendLabelsEntry(b, id.Labels)
		}
		if v := *id.scalar(key); v != "" {
			b = appendStructEntry(b, key, appendStringValue(nil, v))
		}
	}
	return base64.StdEncoding.EncodeToString(b)
}

func appendLabelsEntry(b []byte, labels map[string]string) []byte {
	if len(labels) == 0 {
		return b
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var inner []byte
	for _, k := range keys {
		inner = appendStructEntry(inner, k, appendStringValue(nil, labels[k]))
	}
	// Value.struct_value = 5
	value := protowire.AppendBytes(nil, 5, inner)
	return appendStructEntry(b, metaLabels, value)
}

// appendStructEntry appends one Struct.fields map entry (field 1) with key (field 1)
// and the already-encoded google.protobuf.Value (field 2).
func appendStructEntry(b []byte, key string, value []byte) []byte {
	entry := protowire.AppendString(nil, 1, key)
	entry = protowire.AppendBytes(entry, 2, value)
	return protowire.AppendBytes(b, 1, entry)
}

// appendStringValue appends a google.protobuf.Value with string_value (field 3).
func appendStringValue(b []byte, s string) []byte {
	return protowire.AppendString(b, 3, s)
}

// decodePeerMetadata parses an x-envoy-peer-metadata value.
func decodePeerMetadata(header string) (nodeIdentity, error) {
	var id nodeIdentity
	if len(header) > maxPeerHeaderLen {
		return id, fmt.Errorf("peer metadata is %d bytes, more than %d", len(header), maxPeerHeaderLen)
	}
	raw, err := base64.StdEncoding.DecodeString(header)
	if err != nil {
		// Accept unpadded base64 too: it costs nothing and some encoders omit padding.
		var err2 error
		if raw, err2 = base64.RawStdEncoding.DecodeString(header); err2 != nil {
			return id, fmt.Errorf("peer metadata is not base64: %w", err)
		}
	}
	err = forEachStructEntry(raw, func(key string, value []byte) error {
		if key == metaLabels {
			inner, ok, err := structValue(value)
			if err != nil || !ok {
				return err
			}
			return forEachStructEntry(inner, func(k string, v []byte) error {
				s, ok, err := stringValue(v)
				if ok {
					if id.Labels == nil {
						id.Labels = map[string]string{}
					}
					id.Labels[k] = s
				}
				return err
			})
		}
		dst := id.scalar(key)
		if dst == nil {
			return nil
		}
		s, ok, err := stringValue(value)
		if ok {
			*dst = s
		}
		return err
	})
	if err != nil {
		return nodeIdentity{}, fmt.Errorf("peer metadata: %w", err)
	}
	return id, nil
}

// forEachStructEntry calls fn with the key and encoded Value of every entry of an encoded
// google.protobuf.Struct.
func forEachStructEntry(b []byte, fn func(key string, value []byte) error) error {
	return protowire.Each(b, func(f protowire.Field) error {
		if f.Num != 1 || f.Wire != protowire.Bytes {
			return nil
		}
		var key string
		var value []byte
		err := protowire.Each(f.Bytes, func(e protowire.Field) error {
			switch {
			case e.Num == 1 && e.Wire == protowire.Bytes:
				key = string(e.Bytes)
			case e.Num == 2 && e.Wire == protowire.Bytes:
				value = e.Bytes
			}
			return nil
		})
		if err != nil {
			return err
		}
		return fn(key, value)
	})
}

// stringValue returns a google.protobuf.Value's string_value (field 3).
func stringValue(b []byte) (s string, ok bool, err error) {
	err = protowire.Each(b, func(f protowire.Field) error {
		if f.Num == 3 && f.Wire == protowire.Bytes {
			s, ok = string(f.Bytes), true
		}
		return nil
	})
	return s, ok, err
}

// structValue returns a google.protobuf.Value's struct_value (field 5).
func structValue(b []byte) (inner []byte, ok bool, err error) {
	err = protowire.Each(b, func(f protowire.Field) error {
		if f.Num == 5 && f.Wire == protowire.Bytes {
			inner, ok = f.Bytes, true
		}
		return nil
	})
	return inner, ok, err
}

// peerCache maps raw x-envoy-peer-metadata values to decoded workloads, so a peer is
// decoded once rather than on every request. It is keyed by the metadata itself, not by
// the peer id header, so a peer cannot make another peer's id report its labels. When
// full it starts over, which bounds memory however many distinct values peers send.
type peerCache struct {
	max int // < 0: no caching
	m   *intern.Cache[*workload]
}

func newPeerCache(max int) *peerCache {
	return &peerCache{max: max, m: intern.NewCache[*workload]()}
}

// get returns the workload for header, nil if it does not decode (a peer that sends
// garbage is reported like one that sends nothing). err says why, for logging.
func (c *peerCache) get(header string) (w *workload, err error) {
	if w, ok := c.m.Get(header); ok {
		return w, nil
	}
	id, err := decodePeerMetadata(header)
	if err == nil {
		w = newWorkload(id)
	}
	if c.max >= 0 {
		if c.m.Len() >= c.max {
			c.m.Clear()
		}
		c.m.Put(header, w)
	}
	return w, err
}
