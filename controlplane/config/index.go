package config

import (
	"slices"

	"google.golang.org/protobuf/proto"
	extensions "istio.io/api/extensions/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	networkingbeta "istio.io/api/networking/v1beta1"
	security "istio.io/api/security/v1beta1"
	telemetry "istio.io/api/telemetry/v1alpha1"
)

// Index is an immutable view of a set of configs, indexed for the generators: by kind, by
// kind and namespace, and by the workload selector of the kinds that select proxies.
type Index struct {
	byKind map[Kind][]*Config
	// byNS lists are subslices of byKind's (configs are sorted by kind, namespace, name).
	byNS map[Kind]map[string][]*Config
	n    int
}

// NewIndex indexes configs; the slice is not retained.
func NewIndex(configs []*Config) *Index {
	if !slices.IsSortedFunc(configs, byKey) {
		configs = slices.Clone(configs)
		SortConfigs(configs)
	}
	return Reindex(nil, configs)
}

// Reindex indexes configs sorted by key (CompareKeys), as a ConfigStore lists them, sharing
// with prev (nil: none) the lists of every kind whose configs are the very ones prev lists
// (configs are immutable: the same pointer is the same config): a change of one config
// costs the lists of its kind, not the whole index. Kinds are found by binary search and
// unchanged kinds compared by pointer, so the configs of unchanged kinds are not read.
func Reindex(prev *Index, sorted []*Config) *Index {
	ix := &Index{byKind: map[Kind][]*Config{}, byNS: map[Kind]map[string][]*Config{}, n: len(sorted)}
	for len(sorted) > 0 {
		kind := sorted[0].Kind
		n, _ := slices.BinarySearchFunc(sorted, kind, func(c *Config, k Kind) int {
			if c.Kind <= k {
				return -1
			}
			return 1
		})
		run := sorted[:n]
		sorted = sorted[n:]
		if prev != nil && slices.Equal(prev.byKind[kind], run) {
			ix.byKind[kind], ix.byNS[kind] = prev.byKind[kind], prev.byNS[kind]
			continue
		}
		list := slices.Clone(run)
		byNS := map[string][]*Config{}
		for i := 0; i < len(list); {
			j := i + 1
			for j < len(list) && list[j].Namespace == list[i].Namespace {
				j++
			}
			byNS[list[i].Namespace] = list[i:j:j] // capped: an append copies
			i = j
		}
		ix.byKind[kind], ix.byNS[kind] = list[:len(list):len(list)], byNS
	}
	return ix
}

// List returns the configs of a kind, sorted by namespace and name.
func (ix *Index) List(kind Kind) []*Config { return ix.byKind[kind] }

// Namespace returns the configs of a kind in one namespace.
func (ix *Index) Namespace(kind Kind, ns string) []*Config { return ix.byNS[kind][ns] }

// Len is the number of configs.
func (ix *Index) Len() int { return ix.n }

// ForWorkload returns the configs of kind in namespace ns whose workload selector matches
// labels (a config without a selector applies to every workload of its namespace). The root
// namespace's configs are included when rootNS is set, Istio's mesh-wide scope.
func (ix *Index) ForWorkload(kind Kind, ns, rootNS string, labels map[string]string) []*Config {
	var out []*Config
	add := func(cs []*Config) {
		for _, c := range cs {
			if sel, ok := Selector(c.Spec); !ok || SelectorMatches(sel, labels) {
				out = append(out, c)
			}
		}
	}
	add(ix.byNS[kind][ns])
	if rootNS != "" && rootNS != ns {
		add(ix.byNS[kind][rootNS])
	}
	return out
}

// Selector returns the labels a config uses to select the proxies it applies to, and whether
// the kind selects proxies at all. A ServiceEntry's workloadSelector picks endpoints, not
// proxies, so it is not reported here.
func Selector(spec proto.Message) (map[string]string, bool) {
	switch s := spec.(type) {
	case *networking.Sidecar:
		return s.GetWorkloadSelector().GetLabels(), s.GetWorkloadSelector() != nil
	case *networking.EnvoyFilter:
		return s.GetWorkloadSelector().GetLabels(), s.GetWorkloadSelector() != nil
	case *networking.DestinationRule:
		return s.GetWorkloadSelector().GetMatchLabels(), s.GetWorkloadSelector() != nil
	case *networking.Gateway:
		return s.GetSelector(), len(s.GetSelector()) > 0
	case *networkingbeta.ProxyConfig:
		return s.GetSelector().GetMatchLabels(), s.GetSelector() != nil
	case *extensions.WasmPlugin:
		return s.GetSelector().GetMatchLabels(), s.GetSelector() != nil
	case *telemetry.Telemetry:
		return s.GetSelector().GetMatchLabels(), s.GetSelector() != nil
	case *security.AuthorizationPolicy:
		return s.GetSelector().GetMatchLabels(), s.GetSelector() != nil
	case *security.PeerAuthentication:
		return s.GetSelector().GetMatchLabels(), s.GetSelector() != nil
	case *security.RequestAuthentication:
		return s.GetSelector().GetMatchLabels(), s.GetSelector() != nil
	}
	return nil, false
}

// SelectorMatches reports whether every selector label is present in labels with the same
// value; an empty selector matches everything.
func SelectorMatches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if lv, ok := labels[k]; !ok || lv != v {
			return false
		}
	}
	return true
}

// UpdateSorted brings sorted, the configs in force before, up to date with next: a few
// changed keys are replaced, inserted or removed in place, many rebuild the list.
func UpdateSorted(sorted []*Config, next map[Key]*Config, changed map[Key]struct{}) []*Config {
	if sorted == nil || len(changed) > len(next)/16 {
		sorted = make([]*Config, 0, len(next))
		for _, c := range next {
			sorted = append(sorted, c)
		}
		SortConfigs(sorted)
		return sorted
	}
	for k := range changed {
		i, found := slices.BinarySearchFunc(sorted, k, func(c *Config, k Key) int { return CompareKeys(c.Key(), k) })
		switch c, ok := next[k]; {
		case ok && found:
			sorted[i] = c
		case ok:
			sorted = slices.Insert(sorted, i, c)
		case found:
			sorted = slices.Delete(sorted, i, i+1)
		}
	}
	return sorted
}
