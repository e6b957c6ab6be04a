// Package xds generates Envoy configuration (CDS, EDS, LDS, RDS, ECDS) in Istio's shapes and
// names from a push snapshot for one proxy. Resources that do not depend on the proxy are
// built and marshalled once per snapshot; per-proxy results are cached under a key made of
// exactly the proxy properties that shape them.
package xds

import (
	"hash/fnv"
	"sort"
	"sync/atomic"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Type URLs of the resource types served, in the order Envoy needs them on a new
// connection: clusters before their endpoints, listeners before their routes.
const (
	ClusterType   = resourcev3.ClusterType
	EndpointType  = resourcev3.EndpointType
	ListenerType  = resourcev3.ListenerType
	RouteType     = resourcev3.RouteType
	ExtensionType = resourcev3.ExtensionConfigType
)

// PushOrder is the order a full push sends types in.
var PushOrder = []string{ClusterType, EndpointType, ListenerType, RouteType, ExtensionType}

// ShortType names a type URL for metrics and logs ("cds", "eds", ...).
func ShortType(typeURL string) string {
	switch typeURL {
	case ClusterType:
		return "cds"
	case EndpointType:
		return "eds"
	case ListenerType:
		return "lds"
	case RouteType:
		return "rds"
	case ExtensionType:
		return "ecds"
	}
	return typeURL
}

// Resource is one generated, marshalled resource. Values are shared between connections
// and must not be modified.
type Resource struct {
	Name string
	Any  *anypb.Any
	// Hash of the marshalled bytes: the resource's version for delta xDS and for skipping
	// unchanged resources.
	Hash uint64
	// Message is the resource before marshalling, kept for debug output and tests.
	Message proto.Message
	// wire is the encoded Any; Any.Value aliases its tail, so the bytes exist once.
	wire []byte
	// delta caches deltaEntry.
	delta atomic.Pointer[[]byte]
}

// Resources is a generated set of one type, sorted by name.
type Resources struct {
	Items []*Resource
	// Hash covers every item's name and hash: equal hashes mean an identical set.
	Hash uint64
	enc  encodedSet
}

// Names lists the resource names.
func (r *Resources) Names() []string {
	out := make([]string, len(r.Items))
	for i, it := range r.Items {
		out[i] = it.Name
	}
	return out
}

var marshal = proto.MarshalOptions{Deterministic: true}

// NewResource marshals m once, as the resource name.
func NewResource(name string, m proto.Message) *Resource {
	b, err := marshal.Marshal(m)
	if err != nil {
		// Only invalid UTF-8 in a string field can fail here, which the config validation
		// rules out; keep serving with an empty resource rather than panic a server.
		b = nil
	}
	h := fnv.New64a()
	_, _ = h.Write(b)
	typeURL := "type.googleapis.com/" + string(m.ProtoReflect().Descriptor().FullName())
	wire, off := encodeAny(typeURL, b)
	return &Resource{
		Name:    name,
		Any:     &anypb.Any{TypeUrl: typeURL, Value: wire[off:]},
		Hash:    h.Sum64(),
		Message: m,
		wire:    wire,
	}
}

// NewResources sorts items by name and hashes the set.
func NewResources(items []*Resource) *Resources {
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
	h := fnv.New64a()
	var buf [8]byte
	for _, it := range items {
		_, _ = h.Write([]byte(it.Name))
		for i := 0; i < 8; i++ {
			buf[i] = byte(it.Hash >> (8 * i))
		}
		_, _ = h.Write(buf[:])
	}
	return &Resources{Items: items, Hash: h.Sum64()}
}

// Diff compares what a client has (old, may be nil) with a new set: the items that are new or
// changed, and the names that are gone. Both sets are sorted by name, so this is one merge
// walk without per-connection maps.
func Diff(old, cur *Resources) (changed []*Resource, removed []string) {
	var o []*Resource
	if old != nil {
		o = old.Items
	}
	n := cur.Items
	i, j := 0, 0
	for i < len(o) || j < len(n) {
		switch {
		case j == len(n) || (i < len(o) && o[i].Name < n[j].Name):
			removed = append(removed, o[i].Name)
			i++
		case i == len(o) || n[j].Name < o[i].Name:
			changed = append(changed, n[j])
			j++
		default:
			if o[i].Hash != n[j].Hash {
				changed = append(changed, n[j])
			}
			i++
			j++
		}
	}
	return changed, removed
}

// Merge returns old with the items of update replacing or adding to it, for clients that
// received a partial (EDS/RDS) update.
func Merge(old *Resources, update []*Resource) *Resources {
	if old == nil || len(old.Items) == 0 {
		return NewResources(append([]*Resource(nil), update...))
	}
	byName := make(map[string]*Resource, len(update))
	for _, u := range update {
		byName[u.Name] = u
	}
	items := make([]*Resource, 0, len(old.Items)+len(update))
	for _, it := range old.Items {
		if u, ok := byName[it.Name]; ok {
			items = append(items, u)
			delete(byName, it.Name)
		} else {
			items = append(items, it)
		}
	}
	for _, u := range byName {
		items = append(items, u)
	}
	return NewResources(items)
}

// Select keeps the items whose names are in names (nil keeps all).
func Select(r *Resources, names map[string]struct{}) *Resources {
	if names == nil {
		return r
	}
	items := make([]*Resource, 0, len(names))
	for _, it := range r.Items {
		if _, ok := names[it.Name]; ok {
			items = append(items, it)
		}
	}
	return NewResources(items)
}

// Find returns the item named name, or nil (binary search: items are sorted).
func (r *Resources) Find(name string) *Resource {
	if r == nil {
		return nil
	}
	i := sort.Search(len(r.Items), func(i int) bool { return r.Items[i].Name >= name })
	if i < len(r.Items) && r.Items[i].Name == name {
		return r.Items[i]
	}
	return nil
}
