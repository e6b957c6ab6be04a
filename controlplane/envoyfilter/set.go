// Package envoyfilter applies Istio EnvoyFilter patches to the Envoy resources the xds
// package generates for a proxy, with Istio's selection (root namespace, then the proxy's
// namespace, workload selector, proxy match), ordering (priority, then name), match and
// operation semantics. Each patch is applied as one step and the patched resource validated;
// a step that leaves the resource invalid is undone and reported, so the resource without
// that patch is what the proxy receives.
package envoyfilter

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/envoytypes"
)

// Patch is one entry of an EnvoyFilter's configPatches, decoded.
type Patch struct {
	Filter  config.Key // the EnvoyFilter
	Index   int        // position in configPatches, as users count in their YAML
	ApplyTo networking.EnvoyFilter_ApplyTo
	// Op is the operation as applied: INSERT_* on kinds whose order does not matter is ADD,
	// as Istio converts it.
	Op    networking.EnvoyFilter_Patch_Operation
	Class networking.EnvoyFilter_Patch_FilterClass
	// Match is never nil: a patch without one matches everything in every context.
	Match   *networking.EnvoyFilter_EnvoyConfigObjectMatch
	Value   proto.Message // nil for REMOVE
	version *regexp.Regexp
}

func (p *Patch) String() string {
	return fmt.Sprintf("EnvoyFilter %s/%s configPatches[%d]", p.Filter.Namespace, p.Filter.Name, p.Index)
}

func (p *Patch) context() networking.EnvoyFilter_PatchContext { return p.Match.GetContext() }

func (p *Patch) isMerge() bool {
	return p.Op == networking.EnvoyFilter_Patch_MERGE || p.Op == networking.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST
}

// Compile decodes an EnvoyFilter's patches. The config package validated them, so an error
// here means a config that bypassed validation.
func Compile(c *config.Config) ([]*Patch, error) {
	ef, ok := c.Spec.(*networking.EnvoyFilter)
	if !ok {
		return nil, fmt.Errorf("%s is not an EnvoyFilter", c.Key())
	}
	out := make([]*Patch, 0, len(ef.GetConfigPatches()))
	for i, cp := range ef.GetConfigPatches() {
		p := &Patch{Filter: c.Key(), Index: i, ApplyTo: cp.GetApplyTo(), Op: cp.GetPatch().GetOperation(),
			Class: cp.GetPatch().GetFilterClass(), Match: cp.GetMatch()}
		if p.Match == nil {
			p.Match = &networking.EnvoyFilter_EnvoyConfigObjectMatch{}
		}
		p.Match = normalizeNames(p.Match)
		if v := p.Match.GetProxy().GetProxyVersion(); v != "" {
			re, err := regexp.Compile(v)
			if err != nil {
				return nil, fmt.Errorf("%s: match.proxy.proxyVersion: %w", p, err)
			}
			p.version = re
		}
		switch p.Op {
		case networking.EnvoyFilter_Patch_INSERT_BEFORE, networking.EnvoyFilter_Patch_INSERT_AFTER, networking.EnvoyFilter_Patch_INSERT_FIRST:
			switch p.ApplyTo {
			case networking.EnvoyFilter_HTTP_FILTER, networking.EnvoyFilter_NETWORK_FILTER,
				networking.EnvoyFilter_LISTENER_FILTER, networking.EnvoyFilter_HTTP_ROUTE:
			default:
				p.Op = networking.EnvoyFilter_Patch_ADD
			}
		}
		if p.Op != networking.EnvoyFilter_Patch_REMOVE {
			v, err := envoytypes.Decode(p.ApplyTo, cp.GetPatch().GetValue())
			if err != nil {
				return nil, fmt.Errorf("%s: patch.value: %w", p, err)
			}
			p.Value = v
		}
		out = append(out, p)
	}
	return out, nil
}

// Deprecated filter names Istio still matches on, mapped to the names Envoy uses now.
var deprecatedNames = map[string]string{
	"envoy.http_connection_manager": "envoy.filters.network.http_connection_manager",
	"envoy.tcp_proxy":               "envoy.filters.network.tcp_proxy",
	"envoy.router":                  "envoy.filters.http.router",
	"envoy.cors":                    "envoy.filters.http.cors",
	"envoy.fault":                   "envoy.filters.http.fault",
	"envoy.lua":                     "envoy.filters.http.lua",
}

func normalizeNames(m *networking.EnvoyFilter_EnvoyConfigObjectMatch) *networking.EnvoyFilter_EnvoyConfigObjectMatch {
	f := m.GetListener().GetFilterChain().GetFilter()
	if f == nil {
		return m
	}
	n, okF := deprecatedNames[f.GetName()]
	s, okS := deprecatedNames[f.GetSubFilter().GetName()]
	if !okF && !okS {
		return m
	}
	m = proto.Clone(m).(*networking.EnvoyFilter_EnvoyConfigObjectMatch)
	f = m.GetListener().GetFilterChain().GetFilter()
	if okF {
		f.Name = n
	}
	if okS {
		f.SubFilter.Name = s
	}
	return m
}

// Select returns the EnvoyFilters that apply to a proxy in namespace ns with labels, in the
// order Istio applies them: by priority; at equal priority the root namespace's before the
// proxy namespace's, then by name (configs carry no creation time).
func Select(ix *config.Index, rootNS, ns string, labels map[string]string) []*config.Config {
	var out []*config.Config
	add := func(n string) {
		for _, c := range ix.Namespace(config.EnvoyFilter, n) {
			if sel, ok := config.Selector(c.Spec); !ok || config.SelectorMatches(sel, labels) {
				out = append(out, c)
			}
		}
	}
	if rootNS != "" {
		add(rootNS)
	}
	if ns != rootNS {
		add(ns)
	}
	prio := func(c *config.Config) int32 { return c.Spec.(*networking.EnvoyFilter).GetPriority() }
	// Within a namespace the index lists configs by name; a stable sort keeps that and the
	// root namespace first at equal priority.
	sort.SliceStable(out, func(i, j int) bool { return prio(out[i]) < prio(out[j]) })
	return out
}

// Proxy is what a patch's proxy match reads.
type Proxy struct {
	IstioVersion string
	Metadata     *structpb.Struct
}

func (p *Patch) proxyMatches(px Proxy) bool {
	pm := p.Match.GetProxy()
	if pm == nil {
		return true
	}
	if p.version != nil && (px.IstioVersion == "" || !p.version.MatchString(px.IstioVersion)) {
		return false
	}
	for k, v := range pm.GetMetadata() {
		f, ok := px.Metadata.GetFields()[k]
		if !ok {
			return false
		}
		s, isString := f.GetKind().(*structpb.Value_StringValue)
		if !isString || s.StringValue != v {
			return false
		}
	}
	return true
}

// ProxyInputs reports what of a proxy beyond namespace and labels the EnvoyFilters of an
// index read: whether any patch matches on the proxy version, and which metadata keys. A
// proxy's generated config depends on exactly these, so they belong in its cache key.
func ProxyInputs(ix *config.Index) (version bool, metadataKeys []string) {
	seen := map[string]bool{}
	for _, c := range ix.List(config.EnvoyFilter) {
		for _, cp := range c.Spec.(*networking.EnvoyFilter).GetConfigPatches() {
			pm := cp.GetMatch().GetProxy()
			if pm.GetProxyVersion() != "" {
				version = true
			}
			for k := range pm.GetMetadata() {
				if !seen[k] {
					seen[k] = true
					metadataKeys = append(metadataKeys, k)
				}
			}
		}
	}
	sort.Strings(metadataKeys)
	return version, metadataKeys
}

// Set is the patches that apply to one proxy, grouped by applyTo in application order.
type Set struct {
	// ID names the patches in the set: proxies with equal IDs are patched identically, so
	// patched resources can be shared between them.
	ID      string
	patches map[networking.EnvoyFilter_ApplyTo][]*Patch
	// classes ranks the HTTP filters added with a filterClass, by name, so that later
	// filters of the same class go after them.
	classes map[string]int
}

// NewSet keeps, from the selected EnvoyFilters' compiled patches (in Select's order), those
// whose proxy match accepts px.
func NewSet(compiled [][]*Patch, px Proxy) *Set {
	s := &Set{patches: map[networking.EnvoyFilter_ApplyTo][]*Patch{}}
	var id strings.Builder
	for _, ps := range compiled {
		for _, p := range ps {
			if !p.proxyMatches(px) {
				continue
			}
			s.patches[p.ApplyTo] = append(s.patches[p.ApplyTo], p)
			if p.Class != networking.EnvoyFilter_Patch_UNSPECIFIED {
				if s.classes == nil {
					s.classes = map[string]int{}
				}
				s.classes[p.Value.(interface{ GetName() string }).GetName()] = int(p.Class)
			}
			fmt.Fprintf(&id, "%s/%s#%d;", p.Filter.Namespace, p.Filter.Name, p.Index)
		}
	}
	s.ID = id.String()
	return s
}

// Empty reports whether the set patches nothing.
func (s *Set) Empty() bool { return s == nil || len(s.patches) == 0 }

// Has reports whether the set holds patches for any of the kinds.
func (s *Set) Has(kinds ...networking.EnvoyFilter_ApplyTo) bool {
	if s == nil {
		return false
	}
	for _, k := range kinds {
		if len(s.patches[k]) > 0 {
			return true
		}
	}
	return false
}

// PatchError is a patch that could not be applied to a resource: the resource was sent
// without it.
type PatchError struct {
	Patch    *Patch
	Resource string // e.g. "listener 0.0.0.0_9080"
	Err      error
}

func (e *PatchError) Error() string {
	return fmt.Sprintf("%s on %s: %v", e.Patch, e.Resource, e.Err)
}

// contextMatches is Istio's patch context rule.
func contextMatches(p *Patch, ctx networking.EnvoyFilter_PatchContext) bool {
	c := p.context()
	return c == networking.EnvoyFilter_ANY || c == ctx
}

// addsIn is Istio's rule for ADD patches of whole listeners and clusters: a patch without a
// context adds only in the outbound (and gateway) context, so the object is added once.
func addsIn(p *Patch, ctx networking.EnvoyFilter_PatchContext) bool {
	if p.context() == networking.EnvoyFilter_ANY {
		return ctx == networking.EnvoyFilter_SIDECAR_OUTBOUND
	}
	return p.context() == ctx
}
