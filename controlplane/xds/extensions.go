package xds

import (
	"fmt"
	"sort"
	"strings"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/envoyfilter"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/wasmplugin"
)

// Extensions: what a proxy's WasmPlugins and EnvoyFilters add to its configuration. They
// depend on the proxy's namespace and labels (selectors), and on its version and metadata
// when an EnvoyFilter's proxy match reads them; proxyMatchKey puts the latter into the view's
// cache key.

// proxyExtensions is computed once per snapshot for every distinct (namespace, labels, proxy
// match inputs) and shared by the proxies that have them.
type proxyExtensions struct {
	plugins []*wasmplugin.Plugin
	byName  map[string]*wasmplugin.Plugin
	// split holds plugins whose configuration differs by direction: their filters are
	// named per direction (wasmplugin.SplitName).
	split   map[string]bool
	patches *envoyfilter.Set
	// wasmKey identifies the Wasm filters the plugins put into connection managers: listeners
	// built for proxies with equal keys are identical before patching.
	wasmKey string
	// telemetry holds the Telemetry-derived configuration for the telemetry filter.
	telemetry *telemetryOverlay
}

type extKey struct{ ns, labels, match, generator string }

type compiledKey struct{ key config.Key }

// extensionsOf returns the proxy's extensions in the view's snapshot.
func extensionsOf(v *View) *proxyExtensions {
	if v.ext != nil {
		return v.ext
	}
	p := v.Proxy
	k := extKey{p.Namespace, model.SortedLabels(p.Labels), proxyMatchKey(v.Snapshot, p), p.Generator}
	return v.Snapshot.full.extensions.Get(k, func() *proxyExtensions { return newProxyExtensions(v.Snapshot, p) })
}

func rootNamespace(snap *Snapshot) string {
	if ns := snap.Mesh.GetRootNamespace(); ns != "" {
		return ns
	}
	return "istio-system"
}

func newProxyExtensions(snap *Snapshot, p *model.Proxy) *proxyExtensions {
	root := rootNamespace(snap)
	e := &proxyExtensions{byName: map[string]*wasmplugin.Plugin{}, split: map[string]bool{}}
	if p.Generator == "grpc" {
		// Proxyless gRPC clients run no Wasm and, as with Istio's gRPC generator, take no
		// EnvoyFilter patches.
		e.patches = envoyfilter.NewSet(nil, envoyfilter.Proxy{})
		return e
	}
	for _, pl := range wasmplugin.ForProxy(snap.Configs, root, p.Namespace, p.Labels) {
		// A module discovery has not fetched (configs that did not come through the
		// wasmfetch store) would leave the filter waiting for its config forever.
		if _, err := pl.Module(); err != nil {
			reportOf(snap).add(&Problem{Source: pl.Key, Patch: -1, Resource: "listeners of namespace " + p.Namespace, Err: err})
			continue
		}
		e.plugins = append(e.plugins, pl)
	}
	e.telemetry = telemetryFor(snap, p)
	var key strings.Builder
	for _, pl := range e.plugins {
		e.byName[pl.Name] = pl
		if pl.Telemetry && e.telemetry.splits() {
			e.split[pl.Name] = true
		}
		fmt.Fprintf(&key, "%s/%d/%t/%v;", pl.Name, wasmplugin.Rank(pl.Spec.GetPhase()), e.split[pl.Name], pl.Spec.GetMatch())
	}
	e.wasmKey = key.String()

	var compiled [][]*envoyfilter.Patch
	for _, c := range envoyfilter.Select(snap.Configs, root, p.Namespace, p.Labels) {
		compiled = append(compiled, compiledPatches(snap, c))
	}
	e.patches = envoyfilter.NewSet(compiled, envoyfilter.Proxy{IstioVersion: p.IstioVersion, Metadata: p.Metadata})
	return e
}

// compiledPatches decodes an EnvoyFilter once per snapshot.
func compiledPatches(snap *Snapshot, c *config.Config) []*envoyfilter.Patch {
	return snap.full.compiled.Get(compiledKey{c.Key()}, func() []*envoyfilter.Patch {
		ps, err := envoyfilter.Compile(c)
		if err != nil {
			// Validation decoded the same values; only a config that bypassed it gets here.
			return []*envoyfilter.Patch(nil)
		}
		return ps
	})
}

type matchInputs struct {
	version bool
	keys    []string
}

// proxyMatchKey renders the proxy properties EnvoyFilter proxy matches read (none, usually).
func proxyMatchKey(snap *Snapshot, p *model.Proxy) string {
	in := snap.full.matchInputs.Get(func() *matchInputs {
		v, keys := envoyfilter.ProxyInputs(snap.Configs)
		return &matchInputs{version: v, keys: keys}
	})
	if !in.version && len(in.keys) == 0 {
		return ""
	}
	var b strings.Builder
	if in.version {
		b.WriteString("|v=" + p.IstioVersion)
	}
	for _, k := range in.keys {
		f, ok := p.Metadata.GetFields()[k]
		fmt.Fprintf(&b, "|%s=%t:%s", k, ok, f.GetStringValue())
	}
	return b.String()
}

// filterName is the name of a plugin's filter on listeners of one direction.
func (e *proxyExtensions) filterName(inbound bool) func(*wasmplugin.Plugin) string {
	return func(p *wasmplugin.Plugin) string {
		if e.split[p.Name] {
			return wasmplugin.SplitName(p, inbound)
		}
		return p.Name
	}
}

// ranks tells EnvoyFilter filterClass patches where the plugins' phases are.
func (e *proxyExtensions) ranks(name string) int {
	switch name {
	case wellknown.Router:
		return 5
	case FaultFilter, CorsFilter:
		// Right after the plugins without a phase, as in Istio's chain.
		return 4
	}
	plugin, _, _ := wasmplugin.ParseSplitName(name)
	if p := e.byName[plugin]; p != nil {
		return wasmplugin.Rank(p.Spec.GetPhase())
	}
	return 0
}

// ExtensionConfigs generates the ECDS resources (TypedExtensionConfig) the proxy asked for:
// the Wasm filters of its WasmPlugins, named "<namespace>.<name>", and the extension configs
// its EnvoyFilters add. Names it does not know are left out.
func ExtensionConfigs(v *View, names []string) []*Resource {
	out := make([]*Resource, 0, len(names))
	for _, n := range names {
		if r := extensionResource(v, n); r != nil {
			out = append(out, r)
		}
	}
	return out
}

type ecdsKey struct {
	name        string
	plugin      config.Key
	overlay     string
	envoyFilter string
}

func extensionResource(v *View, name string) *Resource {
	e := extensionsOf(v)
	pluginName, inbound, split := wasmplugin.ParseSplitName(name)
	if p := e.byName[pluginName]; p != nil && split == e.split[pluginName] {
		overlay := ""
		if p.Telemetry {
			overlay = e.telemetry.key(inbound)
		}
		return v.Snapshot.full.ecds.Get(ecdsKey{name: name, plugin: p.Key, overlay: overlay}, func() *Resource {
			return pluginResource(v.Snapshot, e, p, name, inbound)
		})
	}
	if a := e.patches.ExtensionConfigs()[name]; a != nil {
		key := ecdsKey{name: name, envoyFilter: fmt.Sprintf("%s#%d", a.Patch.Filter, a.Patch.Index)}
		return v.Snapshot.full.ecds.Get(key, func() *Resource { return NewResource(name, a.Value) })
	}
	return nil
}

// pluginResource builds a plugin's ECDS resource; nil (left out) when it cannot be built,
// which the module fetcher has already reported.
func pluginResource(snap *Snapshot, e *proxyExtensions, p *wasmplugin.Plugin, name string, inbound bool) *Resource {
	cfg, err := p.ConfigJSON()
	if err == nil && p.Telemetry {
		cfg, err = e.telemetry.apply(cfg, inbound, "extension config "+name)
	}
	if err != nil {
		reportOf(snap).add(&Problem{Source: p.Key, Patch: -1, Resource: "extension config " + name, Err: err})
		return (*Resource)(nil)
	}
	tec, err := p.ExtensionConfig(name, cfg)
	if err != nil {
		reportOf(snap).add(&Problem{Source: p.Key, Patch: -1, Resource: "extension config " + name, Err: err})
		return (*Resource)(nil)
	}
	return NewResource(name, tec)
}

// ExtensionNames lists the ECDS resources the proxy's listeners discover, sorted.
func ExtensionNames(v *View) []string {
	seen := map[string]bool{}
	for _, r := range Listeners(v).Items {
		l, ok := r.Message.(*listener.Listener)
		if !ok {
			continue
		}
		for _, fc := range allChains(l) {
			for _, f := range fc.GetFilters() {
				if f.GetName() != wellknown.HTTPConnectionManager {
					continue
				}
				h := &hcm.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(h) != nil {
					continue
				}
				for _, hf := range h.GetHttpFilters() {
					if hf.GetConfigDiscovery() != nil {
						seen[hf.GetName()] = true
					}
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// allChains lists a listener's filter chains and its default chain in a new slice: appending
// to the message's own slice could write into a backing array other goroutines read.
func allChains(l *listener.Listener) []*listener.FilterChain {
	out := make([]*listener.FilterChain, 0, len(l.GetFilterChains())+1)
	out = append(out, l.GetFilterChains()...)
	if fc := l.GetDefaultFilterChain(); fc != nil {
		out = append(out, fc)
	}
	return out
}
