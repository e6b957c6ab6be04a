// Package proxyconfig reads a proxy's admin /config_dump and /clusters (Envoy's, or
// meshproxy's, which has the same shape) and prints them as istioctl proxy-config does:
// clusters, listeners, routes, endpoints, secrets and the bootstrap, as tables or as the raw
// sections.
package proxyconfig

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3" // listeners' destinations
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Dump is a parsed /config_dump: each section as the proxy wrote it (for -o json), by the
// short names istioctl's subcommands use; the typed views are read from it.
type Dump struct {
	Raw map[string]json.RawMessage
}

// sections maps a config dump's @type to the section it fills.
var sections = map[string]string{
	"type.googleapis.com/envoy.admin.v3.BootstrapConfigDump": "bootstrap",
	"type.googleapis.com/envoy.admin.v3.ClustersConfigDump":  "clusters",
	"type.googleapis.com/envoy.admin.v3.ListenersConfigDump": "listeners",
	"type.googleapis.com/envoy.admin.v3.RoutesConfigDump":    "routes",
	"type.googleapis.com/envoy.admin.v3.SecretsConfigDump":   "secrets",
	"type.googleapis.com/envoy.admin.v3.EndpointsConfigDump": "endpoints",
	"type.googleapis.com/envoy.admin.v3.EcdsConfigDump":      "ecds",
}

// unmarshal reads Envoy JSON leniently: fields this build does not know are dropped, and
// an Any of a type it does not know (an extension Envoy has and wasmesh does not) becomes an
// empty message of that name, so a real Envoy's dump parses.
var unmarshal = protojson.UnmarshalOptions{DiscardUnknown: true, Resolver: &lenientResolver{}}

// ParseDump reads a /config_dump body.
func ParseDump(body []byte) (*Dump, error) {
	var top struct {
		Configs []json.RawMessage `json:"configs"`
	}
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("config_dump is not JSON: %w", err)
	}
	if top.Configs == nil {
		return nil, fmt.Errorf("config_dump has no \"configs\" list")
	}
	d := &Dump{Raw: map[string]json.RawMessage{}}
	for i, raw := range top.Configs {
		var head struct {
			Type string `json:"@type"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			return nil, fmt.Errorf("config_dump configs[%d]: %w", i, err)
		}
		name, ok := sections[head.Type]
		if !ok {
			continue // a section istioctl does not print either (scoped routes, ...)
		}
		d.Raw[name] = raw
	}
	return d, nil
}

// sectionOf reads a section as its admin type; a section the dump lacks is an error.
func sectionOf[T any, PT interface {
	*T
	proto.Message
}](d *Dump, name string) (PT, error) {
	raw, ok := d.Raw[name]
	if !ok {
		return nil, fmt.Errorf("the config dump has no %s section", name)
	}
	m := PT(new(T))
	if err := unmarshal.Unmarshal(stripType(raw), m); err != nil {
		return nil, fmt.Errorf("config_dump %s section: %w", name, err)
	}
	return m, nil
}

func stripType(raw json.RawMessage) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return raw
	}
	delete(m, "@type")
	b, _ := json.Marshal(m)
	return b
}

// lenientResolver finds registered types, and makes an empty message type for any other.
type lenientResolver struct {
	mu      sync.Mutex
	unknown map[protoreflect.FullName]protoreflect.MessageType
}

func (r *lenientResolver) FindMessageByName(name protoreflect.FullName) (protoreflect.MessageType, error) {
	if t, err := protoregistry.GlobalTypes.FindMessageByName(name); err == nil {
		return t, nil
	}
	return r.empty(name)
}

func (r *lenientResolver) FindMessageByURL(url string) (protoreflect.MessageType, error) {
	name := url
	if i := strings.LastIndexByte(url, '/'); i >= 0 {
		name = url[i+1:]
	}
	return r.FindMessageByName(protoreflect.FullName(name))
}

func (r *lenientResolver) FindExtensionByName(n protoreflect.FullName) (protoreflect.ExtensionType, error) {
	return protoregistry.GlobalTypes.FindExtensionByName(n)
}

func (r *lenientResolver) FindExtensionByNumber(m protoreflect.FullName, f protoreflect.FieldNumber) (protoreflect.ExtensionType, error) {
	return protoregistry.GlobalTypes.FindExtensionByNumber(m, f)
}

func (r *lenientResolver) empty(name protoreflect.FullName) (protoreflect.MessageType, error) {
	if !name.IsValid() {
		return nil, protoregistry.NotFound
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.unknown[name]; ok {
		return t, nil
	}
	fdp := &descriptorpb.FileDescriptorProto{
		Name:        proto.String("meshctl/unknown/" + string(name) + ".proto"),
		Package:     proto.String(string(name.Parent())),
		Syntax:      proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String(string(name.Name()))}},
	}
	fd, err := protodesc.NewFile(fdp, nil)
	if err != nil {
		return nil, err
	}
	t := dynamicpb.NewMessageType(fd.Messages().Get(0))
	if r.unknown == nil {
		r.unknown = map[protoreflect.FullName]protoreflect.MessageType{}
	}
	r.unknown[name] = t
	return t, nil
}
