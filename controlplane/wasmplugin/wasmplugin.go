// Package wasmplugin translates Istio WasmPlugins into what a proxy receives: an HTTP filter
// that discovers its configuration through ECDS, placed in the connection manager by phase and
// priority, and the ECDS resource (a TypedExtensionConfig holding Envoy's Wasm filter) that
// carries the module and the plugin configuration, so a new module or configuration reaches
// proxies without rebuilding a listener.
package wasmplugin

import (
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"slices"
	"sort"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	wasmhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	extensions "istio.io/api/extensions/v1alpha1"
	typev1beta1 "istio.io/api/type/v1beta1"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// WasmTypeURL is the type of the ECDS resources and of the config_discovery type_urls.
const WasmTypeURL = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"

// Runtime is the Wasm runtime named in vm_config, Istio's default.
const Runtime = "envoy.wasm.runtime.v8"

// TelemetryModule is the file name of the mesh's telemetry filter. A WasmPlugin (or an
// EnvoyFilter's Wasm filter) loading a module of this name is the filter the Telemetry API
// configures.
const TelemetryModule = "telemetry.wasm"

// Rank orders the phases in the connection manager: AUTHN first, then AUTHZ, STATS, and
// plugins without a phase last, right before the router. These are also the ranks an
// EnvoyFilter filterClass refers to.
func Rank(p extensions.PluginPhase) int {
	switch p {
	case extensions.PluginPhase_AUTHN:
		return 1
	case extensions.PluginPhase_AUTHZ:
		return 2
	case extensions.PluginPhase_STATS:
		return 3
	}
	return 4
}

// Plugin is a WasmPlugin that applies to a proxy.
type Plugin struct {
	Key  config.Key
	Name string // "<namespace>.<name>": the filter's and its ECDS resource's name
	Spec *extensions.WasmPlugin
	// Telemetry: the module is the telemetry filter, which Telemetry resources configure.
	Telemetry bool
}

// New wraps a WasmPlugin config.
func New(c *config.Config) *Plugin {
	wp := c.Spec.(*extensions.WasmPlugin)
	return &Plugin{Key: c.Key(), Name: c.Namespace + "." + c.Name, Spec: wp, Telemetry: IsTelemetryModule(wp.GetUrl())}
}

// IsTelemetryModule reports whether a module URL or file path names the telemetry filter.
func IsTelemetryModule(u string) bool {
	if pu, err := url.Parse(u); err == nil && pu.Scheme != "" {
		u = pu.Path
	}
	return path.Base(u) == TelemetryModule
}

// ForProxy returns the WasmPlugins that apply to a proxy in namespace ns with labels, in the
// order their filters run: by phase, then by priority (highest first), then by namespace and
// name. Plugins of the root namespace apply in every namespace.
func ForProxy(ix *config.Index, rootNS, ns string, labels map[string]string) []*Plugin {
	var out []*Plugin
	for _, c := range ix.ForWorkload(config.WasmPlugin, ns, rootNS, labels) {
		out = append(out, New(c))
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if ra, rb := Rank(a.Spec.GetPhase()), Rank(b.Spec.GetPhase()); ra != rb {
			return ra < rb
		}
		if pa, pb := a.Spec.GetPriority().GetValue(), b.Spec.GetPriority().GetValue(); pa != pb {
			return pa > pb
		}
		if a.Key.Namespace != b.Key.Namespace {
			return a.Key.Namespace < b.Key.Namespace
		}
		return a.Key.Name < b.Key.Name
	})
	return out
}

// Matches reports whether the plugin applies to traffic on a listener: inbound (SERVER) on the
// workload port, or outbound (CLIENT) to the service port. A plugin without match selectors
// applies everywhere; otherwise any selector whose mode and ports accept the traffic selects it.
func (p *Plugin) Matches(inbound bool, port uint32) bool {
	if len(p.Spec.GetMatch()) == 0 {
		return true
	}
	for _, ts := range p.Spec.GetMatch() {
		switch ts.GetMode() {
		case typev1beta1.WorkloadMode_CLIENT:
			if inbound {
				continue
			}
		case typev1beta1.WorkloadMode_SERVER:
			if !inbound {
				continue
			}
		}
		if len(ts.GetPorts()) == 0 || slices.ContainsFunc(ts.GetPorts(), func(ps *typev1beta1.PortSelector) bool { return ps.GetNumber() == port }) {
			return true
		}
	}
	return false
}

// HTTPFilter is the filter in the connection manager: named name, configured through ECDS
// over the ADS stream. As in Istio, the listener waits for the filter's configuration
// however long it takes (initial_fetch_timeout 0): a plugin may be what authorizes requests,
// so a listener must not serve without it.
func HTTPFilter(name string) *hcm.HttpFilter {
	return &hcm.HttpFilter{
		Name: name,
		ConfigType: &hcm.HttpFilter_ConfigDiscovery{ConfigDiscovery: &core.ExtensionConfigSource{
			ConfigSource: &core.ConfigSource{
				ResourceApiVersion:    core.ApiVersion_V3,
				ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
				InitialFetchTimeout:   durationpb.New(0),
			},
			TypeUrls: []string{WasmTypeURL},
		}},
	}
}

// ConfigJSON is the plugin configuration as the module receives it: pluginConfig as JSON with
// sorted keys (so equal configurations produce equal resources); "" without one.
func (p *Plugin) ConfigJSON() (string, error) {
	if len(p.Spec.GetPluginConfig().GetFields()) == 0 {
		return "", nil
	}
	b, err := json.Marshal(p.Spec.GetPluginConfig().AsMap())
	if err != nil {
		return "", fmt.Errorf("WasmPlugin %s/%s pluginConfig: %w", p.Key.Namespace, p.Key.Name, err)
	}
	return string(b), nil
}

// Module is where the proxy reads the module: the path of a file:// URL, or the file
// discovery fetched an http(s):// module into (see wasmfetch).
func (p *Plugin) Module() (string, error) {
	u, err := url.Parse(p.Spec.GetUrl())
	if err != nil {
		return "", err
	}
	if u.Scheme != "file" {
		return "", fmt.Errorf("WasmPlugin %s/%s: module %s has not been fetched", p.Key.Namespace, p.Key.Name, p.Spec.GetUrl())
	}
	return u.Path, nil
}

// ExtensionConfig is the ECDS resource named name holding the plugin's Wasm filter with the
// given configuration (the plugin's, possibly with Telemetry's merged in).
func (p *Plugin) ExtensionConfig(name, configuration string) (*core.TypedExtensionConfig, error) {
	module, err := p.Module()
	if err != nil {
		return nil, err
	}
	pc := &wasmv3.PluginConfig{
		Name:   p.Name,
		RootId: p.Spec.GetPluginName(),
		Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{
			Runtime: Runtime,
			Code: &core.AsyncDataSource{Specifier: &core.AsyncDataSource_Local{Local: &core.DataSource{
				Specifier: &core.DataSource_Filename{Filename: module},
			}}},
			EnvironmentVariables: environment(p.Spec.GetVmConfig()),
		}},
	}
	if configuration != "" {
		pc.Configuration = mustAny(wrapperspb.String(configuration))
	}
	switch p.Spec.GetFailStrategy() {
	case extensions.FailStrategy_FAIL_OPEN:
		// fail_open is what proxies before failure_policy read; both say the same.
		pc.FailOpen = true //nolint:staticcheck // deprecated in Envoy, still read by older proxies
		pc.FailurePolicy = wasmv3.FailurePolicy_FAIL_OPEN
	case extensions.FailStrategy_FAIL_RELOAD:
		pc.FailurePolicy = wasmv3.FailurePolicy_FAIL_RELOAD
	default:
		pc.FailurePolicy = wasmv3.FailurePolicy_FAIL_CLOSED
	}
	return &core.TypedExtensionConfig{Name: name, TypedConfig: mustAny(&wasmhttp.Wasm{Config: pc})}, nil
}

func environment(vm *extensions.VmConfig) *wasmv3.EnvironmentVariables {
	if len(vm.GetEnv()) == 0 {
		return nil
	}
	ev := &wasmv3.EnvironmentVariables{}
	for _, e := range vm.GetEnv() {
		if e.GetValueFrom() == extensions.EnvValueSource_HOST {
			ev.HostEnvKeys = append(ev.HostEnvKeys, e.GetName())
			continue
		}
		if ev.KeyValues == nil {
			ev.KeyValues = map[string]string{}
		}
		ev.KeyValues[e.GetName()] = e.GetValue()
	}
	return ev
}

var deterministic = proto.MarshalOptions{Deterministic: true}

func mustAny(m proto.Message) *anypb.Any {
	b, err := deterministic.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", m, err)) // built from valid protos: cannot fail
	}
	return &anypb.Any{TypeUrl: "type.googleapis.com/" + string(m.ProtoReflect().Descriptor().FullName()), Value: b}
}

// Filters returns the HTTP filters of plugins that apply to a listener, in order, each with
// the rank of its phase; name gives each plugin's filter name on this listener.
func Filters(plugins []*Plugin, inbound bool, port uint32, name func(*Plugin) string) []*hcm.HttpFilter {
	var out []*hcm.HttpFilter
	for _, p := range plugins {
		if p.Matches(inbound, port) {
			out = append(out, HTTPFilter(name(p)))
		}
	}
	return out
}

// SplitName is the name of a plugin's filter when its configuration differs by direction (the
// telemetry filter under a Telemetry with CLIENT- or SERVER-only overrides): one ECDS resource
// per direction. "/" cannot appear in a Kubernetes name, so these never collide.
func SplitName(p *Plugin, inbound bool) string {
	if inbound {
		return p.Name + "/inbound"
	}
	return p.Name + "/outbound"
}

// ParseSplitName undoes SplitName: the plugin name and the direction, if name is split.
func ParseSplitName(name string) (plugin string, inbound, split bool) {
	if p, ok := strings.CutSuffix(name, "/inbound"); ok {
		return p, true, true
	}
	if p, ok := strings.CutSuffix(name, "/outbound"); ok {
		return p, false, true
	}
	return name, false, false
}
