// Package config turns Istio YAML documents (apiVersion/kind/metadata/spec, as users write
// them for Kubernetes) into typed configs backed by the istio.io/api protos, validates them,
// and indexes them by kind, namespace and workload selector for the push snapshot.
package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
)

// Kind is an Istio resource kind such as "ServiceEntry".
type Kind string

// The Istio kinds the control plane understands. Only ServiceEntry and WorkloadEntry are
// translated by the engine; the others are parsed, validated and indexed so their translators
// plug into the generators.
const (
	ServiceEntry          Kind = "ServiceEntry"
	WorkloadEntry         Kind = "WorkloadEntry"
	WorkloadGroup         Kind = "WorkloadGroup"
	VirtualService        Kind = "VirtualService"
	DestinationRule       Kind = "DestinationRule"
	Gateway               Kind = "Gateway"
	Sidecar               Kind = "Sidecar"
	EnvoyFilter           Kind = "EnvoyFilter"
	ProxyConfig           Kind = "ProxyConfig"
	WasmPlugin            Kind = "WasmPlugin"
	Telemetry             Kind = "Telemetry"
	AuthorizationPolicy   Kind = "AuthorizationPolicy"
	PeerAuthentication    Kind = "PeerAuthentication"
	RequestAuthentication Kind = "RequestAuthentication"
)

// Key names one config.
type Key struct {
	Kind      Kind
	Namespace string
	Name      string
}

func (k Key) String() string { return fmt.Sprintf("%s %s/%s", k.Kind, k.Namespace, k.Name) }

// Meta is the Kubernetes-style metadata of a config.
type Meta struct {
	Kind        Kind
	Group       string
	Version     string
	Name        string
	Namespace   string
	Labels      map[string]string
	Annotations map[string]string
	// Source says where the config came from, e.g. "services.yaml#2" (file and document).
	Source string
	// Created is metadata.creationTimestamp, zero when the config has none (a document
	// without one). Istio ranks configs that conflict oldest first (then by name); Equal
	// does not compare it, as it says nothing about what the config asks for.
	Created time.Time
}

// Config is one parsed and validated Istio resource. Spec is the istio.io/api message for
// the kind (for example *networkingv1alpha3.ServiceEntry). Configs are treated as immutable
// once they leave the parser.
type Config struct {
	Meta
	Spec proto.Message
}

// Key returns the config's key.
func (c *Config) Key() Key { return Key{Kind: c.Kind, Namespace: c.Namespace, Name: c.Name} }

// Equal reports whether two configs have the same metadata and spec.
func (c *Config) Equal(o *Config) bool {
	if c == o {
		return true // one config, as sources keep the pointers of unchanged configs
	}
	if c == nil || o == nil {
		return false
	}
	return c.Key() == o.Key() && maps.Equal(c.Labels, o.Labels) &&
		maps.Equal(c.Annotations, o.Annotations) && proto.Equal(c.Spec, o.Spec)
}

// SortConfigs orders configs by kind, namespace and name so output is deterministic.
func SortConfigs(cs []*Config) {
	// Lists arrive mostly sorted (a source's list plus what changed): checking is linear.
	if !slices.IsSortedFunc(cs, byKey) {
		slices.SortFunc(cs, byKey)
	}
}

func byKey(a, b *Config) int { return CompareKeys(a.Key(), b.Key()) }

// CompareKeys orders keys by kind, namespace, name.
func CompareKeys(a, b Key) int {
	if c := strings.Compare(string(a.Kind), string(b.Kind)); c != 0 {
		return c
	}
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// KeyLess orders keys by kind, namespace, name.
func KeyLess(a, b Key) bool { return CompareKeys(a, b) < 0 }

// Error is a rejected document: it names the file, the document (1-based) and, when known,
// the config and the field at fault. An object from an API server (FromObject) has no
// document (Doc 0): File names the object.
type Error struct {
	File  string
	Doc   int
	Key   *Key // nil when the document was too broken to name
	Field string
	Err   error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Doc > 0 {
		fmt.Fprintf(&b, ": document %d", e.Doc)
	}
	if e.Key != nil && e.Doc > 0 { // without a document, File names the object (FromObject)
		fmt.Fprintf(&b, " (%s)", e.Key)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }
