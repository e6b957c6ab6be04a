package xds

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
)

// ClusterDomain completes short host names in configs ("reviews" in namespace "shop" is
// "reviews.shop.svc.cluster.local"), Istio's rule for Kubernetes-style names.
const ClusterDomain = "cluster.local"

// resolveHost turns a host as written in a config of namespace ns into the FQDN it names.
func resolveHost(h, ns string) string {
	if h == "" || h == "*" || strings.Contains(h, ".") {
		return h
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return h
	}
	return h + "." + ns + ".svc." + ClusterDomain
}

// hostMatches reports whether a concrete host is matched by pattern: equal, "*", or a
// "*.suffix" wildcard.
func hostMatches(host, pattern string) bool {
	if pattern == "*" || host == pattern {
		return true
	}
	if strings.HasPrefix(pattern, "*") {
		suffix := pattern[1:]
		if strings.HasPrefix(host, "*") {
			// Two wildcards: the pattern covers host when host is at least as specific.
			return strings.HasSuffix(host[1:], suffix)
		}
		return strings.HasSuffix(host, suffix)
	}
	return false
}

// hostsOverlap reports whether two host patterns can name the same host.
func hostsOverlap(a, b string) bool { return hostMatches(a, b) || hostMatches(b, a) }

// exportSet is where a service or config is visible: its exportTo (or the mesh default)
// read against its own namespace.
type exportSet struct {
	list []string
	own  string
}

func newExportSet(list []string, own string, fallback []string) exportSet {
	if len(list) == 0 {
		list = fallback
	}
	return exportSet{list: list, own: own}
}

func (s exportSet) visibleTo(ns string) bool {
	if len(s.list) == 0 {
		return true
	}
	for _, v := range s.list {
		if v == "~" {
			return false
		}
	}
	for _, v := range s.list {
		switch v {
		case "*":
			return true
		case ".":
			if ns == s.own {
				return true
			}
		default:
			if v == ns {
				return true
			}
		}
	}
	return false
}

// virtualService is a VirtualService that applies to sidecars, with its hosts resolved and
// its delegates merged in.
type virtualService struct {
	cfg      *config.Config
	spec     *networking.VirtualService
	hosts    []string
	exportTo exportSet
	// routeNS resolves the destination hosts of each http route (a delegate's routes
	// resolve in the delegate's namespace).
	routeNS []string
	// meta is the config's path as Istio names it in route metadata.
	meta string
}

// destRule is a DestinationRule with its host resolved.
type destRule struct {
	cfg      *config.Config
	spec     *networking.DestinationRule
	host     string
	exportTo exportSet
	selector map[string]string
	meta     string
	// merged names, by subset (and "" for the traffic policy), the rules merged into this one
	// that supplied them.
	merged map[string]config.Key
}

// subset returns the named subset, or nil.
func (d *destRule) subset(name string) *networking.Subset {
	if d == nil {
		return nil
	}
	for _, s := range d.spec.GetSubsets() {
		if s.GetName() == name {
			return s
		}
	}
	return nil
}

// subsets lists the rule's subsets (none for a nil rule).
func (d *destRule) subsets() []*networking.Subset {
	if d == nil {
		return nil
	}
	return d.spec.GetSubsets()
}

// traffic is the snapshot's traffic configuration (VirtualService, DestinationRule,
// Sidecar), indexed once per full snapshot and read by every proxy's scope.
type traffic struct {
	vs       []*virtualService // in namespace/name order, the order of precedence
	drs      []*destRule
	drByNS   map[string][]*destRule
	drByHost map[string][]*destRule // exact (non-wildcard) hosts
	sidecars map[string][]*config.Config
	rootNS   string
	// labelsMatter: some config chooses by proxy labels beyond the Sidecar lookup (VirtualService
	// sourceLabels, DestinationRule workloadSelector), so labels shape routes and clusters.
	labelsMatter bool
	// localityMatters: endpoints may be prioritised or weighted by the proxy's locality.
	localityMatters bool
}

func trafficOf(snap *Snapshot) *traffic {
	return snap.full.traffic.Get(func() *traffic { return buildTraffic(snap) })
}

func buildTraffic(snap *Snapshot) *traffic {
	t := &traffic{drByNS: map[string][]*destRule{}, drByHost: map[string][]*destRule{}, sidecars: map[string][]*config.Config{},
		rootNS: snap.Mesh.GetRootNamespace()}
	ix := snap.Configs
	mesh := snap.Mesh
	report := reportOf(snap)
	delegates := map[config.Key]*config.Config{}
	for _, c := range ix.List(config.VirtualService) {
		if len(c.Spec.(*networking.VirtualService).GetHosts()) == 0 {
			delegates[c.Key()] = c
		}
	}
	for _, c := range ix.List(config.VirtualService) {
		spec := c.Spec.(*networking.VirtualService)
		if len(spec.GetHosts()) == 0 || !appliesToMesh(spec.GetGateways()) {
			continue
		}
		vs := &virtualService{cfg: c, exportTo: newExportSet(spec.GetExportTo(), c.Namespace, mesh.GetDefaultVirtualServiceExportTo()),
			meta: configPath(c, "virtual-service")}
		for _, h := range spec.GetHosts() {
			vs.hosts = append(vs.hosts, resolveHost(h, c.Namespace))
		}
		vs.spec, vs.routeNS = mergeDelegates(c, spec, delegates, report)
		if len(vs.spec.GetHttp()) == 0 {
			continue
		}
		for _, r := range vs.spec.GetHttp() {
			for _, m := range r.GetMatch() {
				if len(m.GetSourceLabels()) > 0 {
					t.labelsMatter = true
				}
			}
		}
		t.vs = append(t.vs, vs)
	}
	// Two VirtualServices naming the same host: the first (by namespace and name) routes it
	// wherever both are visible, Istio's rule; the other is reported for that host.
	owner := map[string]*virtualService{}
	for _, vs := range t.vs {
		for _, h := range vs.hosts {
			if first := owner[h]; first != nil && first != vs {
				report.add(&Problem{Source: vs.cfg.Key(), Patch: -1, Resource: "host " + h,
					Err: fmt.Errorf("%s routes this host (the first by namespace and name wins)", first.cfg.Key())})
			} else if first == nil {
				owner[h] = vs
			}
		}
	}
	merged := map[string]*destRule{}
	for _, c := range ix.List(config.DestinationRule) {
		spec := c.Spec.(*networking.DestinationRule)
		dr := &destRule{cfg: c, spec: spec, host: resolveHost(spec.GetHost(), c.Namespace),
			exportTo: newExportSet(spec.GetExportTo(), c.Namespace, mesh.GetDefaultDestinationRuleExportTo()), meta: configPath(c, "destination-rule")}
		// Rules for the same host in one namespace, with the same selector and exportTo,
		// are one rule (Istio's merge): subsets add up, the first traffic policy holds.
		key := c.Namespace + "|" + dr.host + "|" + model.SortedLabels(spec.GetWorkloadSelector().GetMatchLabels()) + "|" + strings.Join(dr.exportTo.list, ",")
		if first := merged[key]; first != nil {
			mergeDestinationRule(first, dr, report)
			continue
		}
		merged[key] = dr
		if ws := spec.GetWorkloadSelector(); ws != nil {
			dr.selector = ws.GetMatchLabels()
			t.labelsMatter = true
		}
		if usesLocality(spec.GetTrafficPolicy()) {
			t.localityMatters = true
		}
		for _, s := range spec.GetSubsets() {
			if usesLocality(s.GetTrafficPolicy()) {
				t.localityMatters = true
			}
		}
		t.drs = append(t.drs, dr)
		t.drByNS[c.Namespace] = append(t.drByNS[c.Namespace], dr)
		if !strings.HasPrefix(dr.host, "*") {
			t.drByHost[dr.host] = append(t.drByHost[dr.host], dr)
		}
	}
	t.reportUnknownDestinations(snap, report)
	if ll := mesh.GetLocalityLbSetting(); len(ll.GetDistribute()) > 0 || len(ll.GetFailover()) > 0 || len(ll.GetFailoverPriority()) > 0 {
		t.localityMatters = t.localityMatters || len(t.drs) > 0
	}
	for _, c := range ix.List(config.Sidecar) {
		t.sidecars[c.Namespace] = append(t.sidecars[c.Namespace], c)
	}
	return t
}

// reportUnknownDestinations names the VirtualService destinations that cannot work: a host
// the registry does not have, or a subset no DestinationRule for the host defines. Envoy
// answers such requests with 503 (no cluster), as with Istio; the report says why.
func (t *traffic) reportUnknownDestinations(snap *Snapshot, report *Report) {
	for _, vs := range t.vs {
		for i, r := range vs.spec.GetHttp() {
			for _, d := range destinationsOf(r) {
				host := resolveHost(d.GetHost(), vs.routeNS[i])
				resource := fmt.Sprintf("http[%d] destination %s", i, host)
				if snap.Service(host) == nil {
					report.add(&Problem{Source: vs.cfg.Key(), Patch: -1, Resource: resource,
						Err: fmt.Errorf("no service has this host; requests routed to it fail with 503")})
					continue
				}
				if d.GetSubset() == "" {
					continue
				}
				defined := false
				for _, dr := range t.drs {
					if hostMatches(host, dr.host) && dr.subset(d.GetSubset()) != nil {
						defined = true
						break
					}
				}
				if !defined {
					report.add(&Problem{Source: vs.cfg.Key(), Patch: -1, Resource: resource + " subset " + d.GetSubset(),
						Err: fmt.Errorf("no DestinationRule for the host defines this subset; requests routed to it fail with 503")})
				}
			}
		}
	}
}

// mergeDestinationRule folds a later rule for the same host into the first; what cannot be
// merged is reported.
func mergeDestinationRule(first, later *destRule, report *Report) {
	if first.merged == nil {
		first.spec = proto.Clone(first.spec).(*networking.DestinationRule)
		first.merged = map[string]config.Key{}
		if first.spec.GetTrafficPolicy() != nil {
			first.merged[""] = first.cfg.Key()
		}
		for _, sub := range first.spec.GetSubsets() {
			first.merged["subset "+sub.GetName()] = first.cfg.Key()
		}
	}
	if later.spec.GetTrafficPolicy() != nil {
		if from, ok := first.merged[""]; ok {
			report.add(&Problem{Source: later.cfg.Key(), Patch: -1, Resource: "trafficPolicy of host " + first.host,
				Err: fmt.Errorf("%s already sets the traffic policy of this host", from)})
		} else {
			first.spec.TrafficPolicy = later.spec.GetTrafficPolicy()
			first.merged[""] = later.cfg.Key()
		}
	}
	for _, sub := range later.spec.GetSubsets() {
		if from, ok := first.merged["subset "+sub.GetName()]; ok {
			report.add(&Problem{Source: later.cfg.Key(), Patch: -1, Resource: "subset " + sub.GetName() + " of host " + first.host,
				Err: fmt.Errorf("%s already defines this subset", from)})
			continue
		}
		first.spec.Subsets = append(first.spec.Subsets, sub)
		first.merged["subset "+sub.GetName()] = later.cfg.Key()
	}
}

// usesLocality reports whether a traffic policy makes endpoints depend on the client's
// locality: outlier detection turns on locality failover; distribute weighs localities.
func usesLocality(tp *networking.TrafficPolicy) bool {
	if tp == nil {
		return false
	}
	if tp.GetOutlierDetection() != nil || tp.GetLoadBalancer().GetLocalityLbSetting() != nil {
		return true
	}
	for _, pl := range tp.GetPortLevelSettings() {
		if pl.GetOutlierDetection() != nil || pl.GetLoadBalancer().GetLocalityLbSetting() != nil {
			return true
		}
	}
	return false
}

func appliesToMesh(gateways []string) bool {
	if len(gateways) == 0 {
		return true
	}
	for _, g := range gateways {
		if g == config.MeshGateway {
			return true
		}
	}
	return false
}

// configPath is Istio's name of a config in route and cluster metadata.
func configPath(c *config.Config, kind string) string {
	return "/apis/networking.istio.io/v1alpha3/namespaces/" + c.Namespace + "/" + kind + "/" + c.Name
}

// sidecarFor finds the Sidecar that applies to a proxy: one in its namespace whose selector
// matches (the first by name), else its namespace's Sidecar without selector, else the root
// namespace's Sidecar without selector. Nil means the default scope (everything visible).
func (t *traffic) sidecarFor(ns string, labels map[string]string) *config.Config {
	var plain *config.Config
	for _, c := range t.sidecars[ns] {
		sel, has := config.Selector(c.Spec)
		if has && len(sel) > 0 {
			if config.SelectorMatches(sel, labels) {
				return c
			}
			continue
		}
		if plain == nil {
			plain = c
		}
	}
	if plain != nil {
		return plain
	}
	if ns != t.rootNS {
		for _, c := range t.sidecars[t.rootNS] {
			if sel, has := config.Selector(c.Spec); !has || len(sel) == 0 {
				return c
			}
		}
	}
	return nil
}

// destinationRule picks the DestinationRule for host as seen from a proxy in ns with
// labels: the proxy's namespace first (rules selecting the proxy before plain ones), then
// the service's namespace, then the root namespace; within a namespace an exact host beats
// the most specific wildcard. Rules must be exported to the proxy's namespace.
func (t *traffic) destinationRule(host, svcNS, ns string, labels map[string]string) *destRule {
	if len(t.drs) == 0 {
		return nil
	}
	pick := func(candidates []*destRule, local bool) *destRule {
		var best *destRule
		bestLen := -1
		for pass := 0; pass < 2 && best == nil; pass++ {
			for _, dr := range candidates {
				if local {
					if (pass == 0) != (dr.selector != nil) {
						continue
					}
					if dr.selector != nil && !config.SelectorMatches(dr.selector, labels) {
						continue
					}
				} else {
					if dr.selector != nil || !dr.exportTo.visibleTo(ns) {
						continue
					}
				}
				if dr.host == host {
					return dr
				}
				if strings.HasPrefix(dr.host, "*") && hostMatches(host, dr.host) && len(dr.host) > bestLen {
					best, bestLen = dr, len(dr.host)
				}
			}
		}
		return best
	}
	if dr := pick(t.drByNS[ns], true); dr != nil {
		return dr
	}
	if svcNS != ns {
		if dr := pick(t.drByNS[svcNS], false); dr != nil {
			return dr
		}
	}
	if t.rootNS != ns && t.rootNS != svcNS {
		return pick(t.drByNS[t.rootNS], false)
	}
	return nil
}

// mergeDelegates replaces the delegating http routes of a root VirtualService with the
// routes of their delegates, Istio's merge: match conditions are combined (a delegate route
// that contradicts its root's match is dropped) and the root's settings fill what the
// delegate leaves unset. It returns the merged spec and the namespace each route's hosts
// resolve in.
func mergeDelegates(root *config.Config, spec *networking.VirtualService, delegates map[config.Key]*config.Config, report *Report) (*networking.VirtualService, []string) {
	has := false
	for _, r := range spec.GetHttp() {
		if r.GetDelegate() != nil {
			has = true
		}
	}
	ns := make([]string, 0, len(spec.GetHttp()))
	if !has {
		for range spec.GetHttp() {
			ns = append(ns, root.Namespace)
		}
		return spec, ns
	}
	out := proto.Clone(spec).(*networking.VirtualService)
	out.Http = nil
	for _, r := range spec.GetHttp() {
		d := r.GetDelegate()
		if d == nil {
			out.Http = append(out.Http, r)
			ns = append(ns, root.Namespace)
			continue
		}
		dns := d.GetNamespace()
		if dns == "" {
			dns = root.Namespace
		}
		dkey := config.Key{Kind: config.VirtualService, Namespace: dns, Name: d.GetName()}
		dc := delegates[dkey]
		if dc == nil {
			// Istio drops a route whose delegate does not exist.
			report.add(&Problem{Source: root.Key(), Patch: -1, Resource: "http route " + r.GetName(),
				Err: fmt.Errorf("delegate %s does not exist (or has hosts); the route is left out", dkey)})
			continue
		}
		dspec := dc.Spec.(*networking.VirtualService)
		if !newExportSet(dspec.GetExportTo(), dc.Namespace, nil).visibleTo(root.Namespace) {
			report.add(&Problem{Source: root.Key(), Patch: -1, Resource: "http route " + r.GetName(),
				Err: fmt.Errorf("delegate %s is not exported to namespace %s; the route is left out", dkey, root.Namespace)})
			continue
		}
		for i, leaf := range dspec.GetHttp() {
			merged, ok := mergeHTTPRoute(r, leaf)
			if !ok {
				report.add(&Problem{Source: dc.Key(), Patch: -1, Resource: fmt.Sprintf("http[%d]", i),
					Err: fmt.Errorf("its match cannot narrow the match of %s http route %q; the route is left out", root.Key(), r.GetName())})
				continue
			}
			out.Http = append(out.Http, merged)
			ns = append(ns, dc.Namespace)
		}
	}
	return out, ns
}

func mergeHTTPRoute(root, leaf *networking.HTTPRoute) (*networking.HTTPRoute, bool) {
	m := proto.Clone(leaf).(*networking.HTTPRoute)
	switch {
	case len(root.GetMatch()) == 0:
	case len(leaf.GetMatch()) == 0:
		m.Match = root.GetMatch()
	default:
		m.Match = nil
		for _, rm := range root.GetMatch() {
			for _, lm := range leaf.GetMatch() {
				if matchConflict(rm, lm) {
					continue
				}
				m.Match = append(m.Match, mergeMatch(rm, lm))
			}
		}
		if len(m.Match) == 0 {
			return nil, false
		}
	}
	switch {
	case m.Name == "":
		m.Name = root.GetName()
	case root.GetName() != "":
		m.Name = root.GetName() + "-" + m.Name
	}
	if m.Rewrite == nil {
		m.Rewrite = root.GetRewrite()
	}
	if m.Timeout == nil {
		m.Timeout = root.GetTimeout()
	}
	if m.Retries == nil {
		m.Retries = root.GetRetries()
	}
	if m.Fault == nil {
		m.Fault = root.GetFault()
	}
	if m.Mirror == nil && len(m.Mirrors) == 0 {
		m.Mirror, m.Mirrors = root.GetMirror(), root.GetMirrors()
		m.MirrorPercent, m.MirrorPercentage = root.GetMirrorPercent(), root.GetMirrorPercentage()
	}
	if m.CorsPolicy == nil {
		m.CorsPolicy = root.GetCorsPolicy()
	}
	if m.Headers == nil {
		m.Headers = root.GetHeaders()
	}
	return m, true
}

func mergeMatch(root, leaf *networking.HTTPMatchRequest) *networking.HTTPMatchRequest {
	out := proto.Clone(leaf).(*networking.HTTPMatchRequest)
	switch {
	case out.Name == "":
		out.Name = root.GetName()
	case root.GetName() != "":
		out.Name = root.GetName() + "-" + out.Name
	}
	if out.Uri == nil {
		out.Uri = root.GetUri()
	}
	if out.Scheme == nil {
		out.Scheme = root.GetScheme()
	}
	if out.Method == nil {
		out.Method = root.GetMethod()
	}
	if out.Authority == nil {
		out.Authority = root.GetAuthority()
	}
	mergeMap := func(dst *map[string]*networking.StringMatch, src map[string]*networking.StringMatch) {
		for k, v := range src {
			if *dst == nil {
				*dst = map[string]*networking.StringMatch{}
			}
			if _, ok := (*dst)[k]; !ok {
				(*dst)[k] = v
			}
		}
	}
	mergeMap(&out.Headers, root.GetHeaders())
	mergeMap(&out.WithoutHeaders, root.GetWithoutHeaders())
	mergeMap(&out.QueryParams, root.GetQueryParams())
	if out.Port == 0 {
		out.Port = root.GetPort()
	}
	for k, v := range root.GetSourceLabels() {
		if out.SourceLabels == nil {
			out.SourceLabels = map[string]string{}
		}
		if _, ok := out.SourceLabels[k]; !ok {
			out.SourceLabels[k] = v
		}
	}
	if out.SourceNamespace == "" {
		out.SourceNamespace = root.GetSourceNamespace()
	}
	if len(out.Gateways) == 0 {
		out.Gateways = root.GetGateways()
	}
	return out
}

// matchConflict reports whether a delegate's match cannot be narrower than its root's.
func matchConflict(root, leaf *networking.HTTPMatchRequest) bool {
	pairs := [][2]*networking.StringMatch{{root.GetUri(), leaf.GetUri()}, {root.GetScheme(), leaf.GetScheme()},
		{root.GetMethod(), leaf.GetMethod()}, {root.GetAuthority(), leaf.GetAuthority()}}
	for _, p := range pairs {
		if stringMatchConflict(p[0], p[1]) {
			return true
		}
	}
	for k, v := range leaf.GetHeaders() {
		if stringMatchConflict(root.GetHeaders()[k], v) {
			return true
		}
	}
	for k, v := range leaf.GetWithoutHeaders() {
		if stringMatchConflict(root.GetWithoutHeaders()[k], v) {
			return true
		}
	}
	for k, v := range leaf.GetQueryParams() {
		if stringMatchConflict(root.GetQueryParams()[k], v) {
			return true
		}
	}
	if root.GetIgnoreUriCase() != leaf.GetIgnoreUriCase() {
		return true
	}
	if root.GetPort() != 0 && leaf.GetPort() != 0 && root.GetPort() != leaf.GetPort() {
		return true
	}
	if root.GetSourceNamespace() != "" && leaf.GetSourceNamespace() != "" && root.GetSourceNamespace() != leaf.GetSourceNamespace() {
		return true
	}
	for k, v := range leaf.GetSourceLabels() {
		if rv, ok := root.GetSourceLabels()[k]; ok && rv != v {
			return true
		}
	}
	return false
}

func stringMatchConflict(root, leaf *networking.StringMatch) bool {
	if root == nil || leaf == nil {
		return false
	}
	if root.GetRegex() != "" || leaf.GetRegex() != "" {
		return !proto.Equal(root, leaf)
	}
	if e := root.GetExact(); e != "" {
		if p := leaf.GetPrefix(); p != "" && !strings.HasPrefix(e, p) {
			return true
		}
		if le := leaf.GetExact(); le != "" && le != e {
			return true
		}
	}
	if p := root.GetPrefix(); p != "" {
		if lp := leaf.GetPrefix(); lp != "" && !strings.HasPrefix(lp, p) {
			return true
		}
		if le := leaf.GetExact(); le != "" && !strings.HasPrefix(le, p) {
			return true
		}
	}
	return false
}

// sortedServices orders services by host.
func sortedServices(svcs []*model.Service) {
	slices.SortFunc(svcs, model.CompareHosts)
}
