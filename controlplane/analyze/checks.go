package analyze

import (
	"slices"
	"sort"
	"strings"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
)

// Codes of the findings istioctl has no message for (wasmesh's own).
const (
	codeSidecarImportsNothing   = "WSM0001"
	codeEnvoyFilterPatchNothing = "WSM0002"
	codeConflictingDestRules    = "WSM0003"
	codeWasmModuleUnavailable   = "WSM0004"
)

// check runs the cross-object checks over the valid configs.
func check(in *input, opts Options) []Message {
	m := newMesh(in)
	var out []Message
	out = append(out, m.virtualServices()...)
	out = append(out, m.destinationRules()...)
	out = append(out, m.sidecars()...)
	out = append(out, m.envoyFilters()...)
	if !opts.SkipModules {
		out = append(out, wasmPlugins(in)...)
	}
	return out
}

// instance is a workload that can be an endpoint: a WorkloadEntry or a ServiceEntry's own
// endpoint, or (partial) the workloads a ServiceEntry's workloadSelector expects, pods or
// proxies that register at run time, of which only the selector's labels are known.
type instance struct {
	namespace string
	labels    map[string]string
	partial   bool
}

// matches reports whether the instance has the labels of sel: surely, or, partial, maybe
// (no label of sel contradicts the selector's).
func (w instance) matches(sel map[string]string) bool {
	if !w.partial {
		return selects(sel, w.labels)
	}
	for k, v := range sel {
		if have, ok := w.labels[k]; ok && have != v {
			return false
		}
	}
	return true
}

// service is a host a ServiceEntry defines, with its instances.
type service struct {
	host      string
	namespace string
	instances []instance
}

type mesh struct {
	in        *input
	services  []*service
	workloads []instance // every WorkloadEntry and inline endpoint
}

func newMesh(in *input) *mesh {
	m := &mesh{in: in}
	var entries []instance
	for _, d := range in.kind(config.WorkloadEntry) {
		we := d.cfg.Spec.(*networking.WorkloadEntry)
		entries = append(entries, instance{namespace: d.cfg.Namespace, labels: we.GetLabels()})
	}
	m.workloads = append(m.workloads, entries...)
	for _, d := range in.kind(config.ServiceEntry) {
		se := d.cfg.Spec.(*networking.ServiceEntry)
		var inst []instance
		for _, ep := range se.GetEndpoints() {
			inst = append(inst, instance{namespace: d.cfg.Namespace, labels: ep.GetLabels()})
		}
		m.workloads = append(m.workloads, inst...)
		if sel := se.GetWorkloadSelector().GetLabels(); sel != nil {
			for _, w := range entries {
				if w.namespace == d.cfg.Namespace && selects(sel, w.labels) {
					inst = append(inst, w)
				}
			}
			expected := instance{namespace: d.cfg.Namespace, labels: sel, partial: true}
			inst = append(inst, expected)
			m.workloads = append(m.workloads, expected)
		}
		for _, h := range se.GetHosts() {
			m.services = append(m.services, &service{host: resolve(h, d.cfg.Namespace), namespace: d.cfg.Namespace, instances: inst})
		}
	}
	for _, p := range in.pods {
		m.workloads = append(m.workloads, instance{namespace: p.Namespace, labels: p.Labels})
	}
	for _, svc := range in.kubeServices {
		// Offline its pods are not in the input: only its selector's labels are known.
		var inst []instance
		if in.cluster {
			inst = podInstances(in.pods, svc)
		} else if len(svc.Spec.Selector) > 0 {
			inst = append(inst, instance{namespace: svc.Namespace, labels: svc.Spec.Selector, partial: true})
			m.workloads = append(m.workloads, inst...)
		}
		m.services = append(m.services, &service{host: svc.Name + "." + svc.Namespace + ".svc.cluster.local", namespace: svc.Namespace, instances: inst})
	}
	return m
}

// resolve makes a short name a namespace's FQDN, as Istio resolves hosts in configs.
func resolve(host, ns string) string {
	if host == "*" || strings.Contains(host, ".") {
		return host
	}
	return host + "." + ns + ".svc.cluster.local"
}

// hostMatches reports whether a concrete or wildcard host matches a pattern (a host, "*",
// "*.suffix").
func hostMatches(host, pattern string) bool {
	if pattern == "*" || host == pattern {
		return true
	}
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return strings.HasSuffix(strings.TrimPrefix(host, "*"), suffix)
	}
	if suffix, ok := strings.CutPrefix(host, "*"); ok {
		return strings.HasSuffix(pattern, suffix)
	}
	return false
}

func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// servicesOf lists the services a host (maybe a wildcard) names.
func (m *mesh) servicesOf(host string) []*service {
	var out []*service
	for _, s := range m.services {
		if hostMatches(s.host, host) {
			out = append(out, s)
		}
	}
	return out
}

// virtualServices: every route destination is a known host, and its subset one a
// DestinationRule for that host defines (istioctl's IST0101).
func (m *mesh) virtualServices() []Message {
	var out []Message
	for _, d := range m.in.kind(config.VirtualService) {
		vs := d.cfg.Spec.(*networking.VirtualService)
		for _, dest := range destinations(vs) {
			host := resolve(dest.GetHost(), d.cfg.Namespace)
			if len(m.servicesOf(host)) == 0 {
				out = append(out, at(d, "host", dest.GetHost(), newMessage(Error, "IST0101", "Referenced host not found: %q", dest.GetHost())))
				continue
			}
			if sub := dest.GetSubset(); sub != "" && !m.subsetDefined(host, sub) {
				out = append(out, at(d, "subset", sub, newMessage(Error, "IST0101", "Referenced host+subset in destinationrule not found: %q",
					dest.GetHost()+"+"+sub)))
			}
		}
	}
	return out
}

func at(d *doc, key, value string, m Message) Message {
	m.Origin, m.Reference, m.namespace = d.origin(), d.ref(key, value), d.cfg.Namespace
	return m
}

func destinations(vs *networking.VirtualService) []*networking.Destination {
	var out []*networking.Destination
	for _, r := range vs.GetHttp() {
		for _, rd := range r.GetRoute() {
			out = append(out, rd.GetDestination())
		}
		if r.GetMirror() != nil {
			out = append(out, r.GetMirror())
		}
	}
	for _, r := range vs.GetTcp() {
		for _, rd := range r.GetRoute() {
			out = append(out, rd.GetDestination())
		}
	}
	for _, r := range vs.GetTls() {
		for _, rd := range r.GetRoute() {
			out = append(out, rd.GetDestination())
		}
	}
	return out
}

func (m *mesh) subsetDefined(host, subset string) bool {
	for _, d := range m.in.kind(config.DestinationRule) {
		dr := d.cfg.Spec.(*networking.DestinationRule)
		if !hostMatches(host, resolve(dr.GetHost(), d.cfg.Namespace)) {
			continue
		}
		for _, s := range dr.GetSubsets() {
			if s.GetName() == subset {
				return true
			}
		}
	}
	return false
}

// destinationRules: the host is known (IST0174), every subset selects an instance of it
// (IST0173), and rules that discovery merges do not both set one thing.
func (m *mesh) destinationRules() []Message {
	var out []Message
	for _, d := range m.in.kind(config.DestinationRule) {
		dr := d.cfg.Spec.(*networking.DestinationRule)
		svcs := m.servicesOf(resolve(dr.GetHost(), d.cfg.Namespace))
		if len(svcs) == 0 {
			out = append(out, at(d, "host", dr.GetHost(), newMessage(Warning, "IST0174",
				"The host %s defined in the DestinationRule does not match any services in the mesh.", dr.GetHost())))
			continue
		}
		for _, s := range dr.GetSubsets() {
			if len(s.GetLabels()) == 0 || m.anySelected(svcs, s.GetLabels()) {
				continue
			}
			out = append(out, at(d, "name", s.GetName(), newMessage(Error, "IST0173",
				"The Subset %s defined in the DestinationRule does not select any pods. Which may lead to 503 UH (NoHealthyUpstream).", s.GetName())))
		}
	}
	return append(out, m.conflictingDestinationRules()...)
}

func (m *mesh) anySelected(svcs []*service, labels map[string]string) bool {
	for _, s := range svcs {
		for _, w := range s.instances {
			if w.matches(labels) {
				return true
			}
		}
	}
	return false
}

// conflictingDestinationRules finds the rules discovery merges (one namespace, host,
// selector and exportTo: Istio's merge) that both set the traffic policy or define one
// subset: the first by namespace and name holds, the later one's part is dropped.
func (m *mesh) conflictingDestinationRules() []Message {
	type held struct {
		policy  *doc
		subsets map[string]*doc
	}
	groups := map[string]*held{}
	var out []Message
	drs := slices.Clone(m.in.kind(config.DestinationRule))
	sort.SliceStable(drs, func(i, j int) bool { return config.CompareKeys(drs[i].cfg.Key(), drs[j].cfg.Key()) < 0 })
	for _, d := range drs {
		dr := d.cfg.Spec.(*networking.DestinationRule)
		host := resolve(dr.GetHost(), d.cfg.Namespace)
		key := strings.Join([]string{d.cfg.Namespace, host, model.SortedLabels(dr.GetWorkloadSelector().GetMatchLabels()),
			strings.Join(dr.GetExportTo(), ",")}, "|")
		g := groups[key]
		if g == nil {
			g = &held{subsets: map[string]*doc{}}
			groups[key] = g
		}
		if dr.GetTrafficPolicy() != nil {
			if g.policy != nil {
				out = append(out, at(d, "trafficPolicy", "", newMessage(Warning, codeConflictingDestRules,
					"DestinationRules %s and %s both set the traffic policy of host %q: only the first's applies.",
					g.policy.name(), d.name(), host)))
			} else {
				g.policy = d
			}
		}
		for _, s := range dr.GetSubsets() {
			if first := g.subsets[s.GetName()]; first != nil {
				out = append(out, at(d, "name", s.GetName(), newMessage(Warning, codeConflictingDestRules,
					"DestinationRules %s and %s both define subset %q of host %q: only the first's applies.",
					first.name(), d.name(), s.GetName(), host)))
				continue
			}
			g.subsets[s.GetName()] = d
		}
	}
	return out
}

// sidecars: an egress listener that imports no host of the input imports nothing.
func (m *mesh) sidecars() []Message {
	var out []Message
	for _, d := range m.in.kind(config.Sidecar) {
		sc := d.cfg.Spec.(*networking.Sidecar)
		for i, eg := range sc.GetEgress() {
			if m.importsSomething(d.cfg.Namespace, eg.GetHosts()) {
				continue
			}
			out = append(out, at(d, "hosts", "", newMessage(Warning, codeSidecarImportsNothing,
				"egress[%d] imports no service: no ServiceEntry or VirtualService of the input matches %s.", i, strings.Join(eg.GetHosts(), ", "))))
		}
	}
	return out
}

// importsSomething reports whether an egress hosts list ("ns/host") names a ServiceEntry or
// VirtualService host of the input.
func (m *mesh) importsSomething(sidecarNS string, hosts []string) bool {
	type named struct{ ns, host string }
	var all []named
	for _, s := range m.services {
		all = append(all, named{s.namespace, s.host})
	}
	for _, d := range m.in.kind(config.VirtualService) {
		for _, h := range d.cfg.Spec.(*networking.VirtualService).GetHosts() {
			all = append(all, named{d.cfg.Namespace, resolve(h, d.cfg.Namespace)})
		}
	}
	for _, h := range hosts {
		ns, host, ok := strings.Cut(h, "/")
		if !ok {
			continue
		}
		switch ns {
		case "~":
			continue
		case ".":
			ns = sidecarNS
		}
		for _, n := range all {
			if (ns == "*" || ns == n.ns) && hostMatches(n.host, host) {
				return true
			}
		}
	}
	return false
}

// envoyFilters: a filter whose selector selects no workload, or a patch matching the
// cluster or virtual host of a service the input does not define, patches nothing.
func (m *mesh) envoyFilters() []Message {
	var out []Message
	for _, d := range m.in.kind(config.EnvoyFilter) {
		ef := d.cfg.Spec.(*networking.EnvoyFilter)
		if sel := ef.GetWorkloadSelector().GetLabels(); len(sel) > 0 && !m.workloadSelected(d.cfg.Namespace, sel) {
			out = append(out, at(d, "workloadSelector", "", newMessage(Warning, codeEnvoyFilterPatchNothing,
				"The EnvoyFilter selects no workload of the input (labels %s): it patches nothing.", model.SortedLabels(sel))))
			continue
		}
		for i, p := range ef.GetConfigPatches() {
			host := p.GetMatch().GetCluster().GetService()
			if vh := p.GetMatch().GetRouteConfiguration().GetVhost().GetName(); vh != "" {
				host, _, _ = strings.Cut(vh, ":")
			}
			if host == "" || host == "*" || len(m.servicesOf(host)) > 0 {
				continue
			}
			out = append(out, at(d, "match", "", newMessage(Warning, codeEnvoyFilterPatchNothing,
				"configPatches[%d] matches service %q, which no ServiceEntry of the input defines: it patches nothing.", i, host)))
		}
	}
	return out
}

// workloadSelected reports whether a namespace's selector (in the root namespace, any)
// selects a workload of the input.
func (m *mesh) workloadSelected(ns string, sel map[string]string) bool {
	for _, w := range m.workloads {
		if (ns == rootNamespace || w.namespace == ns) && w.matches(sel) {
			return true
		}
	}
	return false
}

// rootNamespace is the mesh config's default rootNamespace, whose EnvoyFilters apply to
// every namespace.
const rootNamespace = "istio-system"
