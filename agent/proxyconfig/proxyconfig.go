// Package proxyconfig builds the effective Istio ProxyConfig of a sidecar from Istio's
// layers: built-in defaults, the PROXY_CONFIG environment value, and the pod's
// proxy.istio.io/config annotation, each written in YAML or JSON as users write it.
package proxyconfig

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshconfig "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"
)

// AnnotationKey is the pod annotation whose ProxyConfig overrides PROXY_CONFIG.
const AnnotationKey = "proxy.istio.io/config"

// DefaultDiscoveryAddress is where a sidecar finds discovery unless told: discovery's
// Service in the cluster, on its authenticated TLS port (15012), Istio's default; the
// agent's XDS proxy connects there for the proxy.
const DefaultDiscoveryAddress = "istiod.istio-system.svc:15012"

// LocalDiscoveryAddress is the default outside Kubernetes, where no cluster DNS resolves
// DefaultDiscoveryAddress: discovery's default listener on the same machine.
const LocalDiscoveryAddress = "localhost:15012"

// Default returns Istio's default ProxyConfig for a sidecar.
func Default() *meshconfig.ProxyConfig {
	return &meshconfig.ProxyConfig{
		ConfigPath:               "/etc/istio/proxy",
		BinaryPath:               "/usr/local/bin/envoy",
		DrainDuration:            durationpb.New(45 * time.Second),
		DiscoveryAddress:         DefaultDiscoveryAddress,
		ProxyAdminPort:           15000,
		StatusPort:               15020,
		StatNameLength:           189,
		Concurrency:              wrapperspb.Int32(2),
		TerminationDrainDuration: durationpb.New(5 * time.Second),
	}
}

// Parse parses one ProxyConfig document (YAML or JSON). source names where the text came
// from, so the error tells the operator which input to fix.
func Parse(source, text string) (*meshconfig.ProxyConfig, error) {
	js, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		return nil, fmt.Errorf("%s: not YAML or JSON: %w", source, err)
	}
	pc := &meshconfig.ProxyConfig{}
	if s := strings.TrimSpace(string(js)); s == "null" || s == "" {
		return pc, nil
	}
	if err := protojson.Unmarshal(js, pc); err != nil {
		return nil, fmt.Errorf("%s: invalid ProxyConfig: %w", source, err)
	}
	return pc, nil
}

// Overlay sets every field that is present in over onto base, replacing rather than
// merging: a duration of 500ms over 45s must read 500ms, which proto.Merge would not give.
func Overlay(base, over *meshconfig.ProxyConfig) {
	dst := base.ProtoReflect()
	over.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dst.Set(fd, v)
		return true
	})
}

// Layers is the input of Effective: the PROXY_CONFIG value and the pod annotations, and
// whether the agent runs in a Kubernetes pod.
type Layers struct {
	Env         string
	Annotations map[string]string
	// OutsideKubernetes makes the default discovery address LocalDiscoveryAddress.
	OutsideKubernetes bool
}

// Effective returns defaults, then PROXY_CONFIG, then the proxy.istio.io/config
// annotation, each overriding the fields it sets.
func Effective(l Layers) (*meshconfig.ProxyConfig, error) {
	pc := Default()
	if l.OutsideKubernetes {
		pc.DiscoveryAddress = LocalDiscoveryAddress
	}
	if strings.TrimSpace(l.Env) != "" {
		env, err := Parse("PROXY_CONFIG", l.Env)
		if err != nil {
			return nil, err
		}
		Overlay(pc, env)
	}
	if a, ok := l.Annotations[AnnotationKey]; ok && strings.TrimSpace(a) != "" {
		ann, err := Parse("annotation "+AnnotationKey, a)
		if err != nil {
			return nil, err
		}
		Overlay(pc, ann)
	}
	return pc, nil
}

// Duration reads a duration field, falling back when it is unset.
func Duration(d *durationpb.Duration, fallback time.Duration) time.Duration {
	if d == nil {
		return fallback
	}
	return d.AsDuration()
}
