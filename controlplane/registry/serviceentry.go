package registry

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
)

// ServiceEntries is the registry built from ServiceEntry and WorkloadEntry configs plus
// auto-registered workloads. A ServiceEntry's hosts are visible mesh-wide.
type ServiceEntries struct {
	log     *slog.Logger
	metrics *metrics.Metrics

	mu        sync.RWMutex
	entries   []*seEntry                             // sorted by namespace/name
	selecting map[string]map[string][]*seEntry       // entries with a workload selector, by namespace and leastLabel
	wes       map[string][]*config.Config            // WorkloadEntries by namespace
	weByLabel map[string]map[string][]*config.Config // WorkloadEntries by namespace and labelKey(k, v)
	workloads map[string]map[string]*model.Workload  // auto-registered, by namespace and key
	services  map[string]*model.Service              // by host
	owner     map[string]*seEntry                    // which entry owns a host
	endpoints map[string][]*model.Endpoint           // by host
	sorted    []*model.Service                       // services by host, made when asked; nil after a change
	gen       uint64                                 // SetConfigs calls
	handlers  []Handler
	// spare holds the maps SetConfigs replaced last time, cleared and filled again by the
	// next: a config change allocates what changed, not a copy of the mesh's services.
	spare struct {
		had       map[*config.Config]*seEntry
		services  map[string]*model.Service
		owner     map[string]*seEntry
		endpoints map[string][]*model.Endpoint
	}
}

// reuse clears a spare map for another fill (or makes one of size n).
func reuse[K comparable, V any](m map[K]V, n int) map[K]V {
	if m == nil {
		return make(map[K]V, n)
	}
	clear(m)
	return m
}

type seEntry struct {
	cfg      *config.Config
	spec     *networking.ServiceEntry
	defined  []*model.Service // every service of the entry's hosts
	services []*model.Service // those it owns (a host defined twice goes to the first entry)
	pos      int              // index in entries
	selKey   string           // leastLabel of its workload selector
	gen      uint64           // the SetConfigs that last listed it
	// sameServices: the last SetConfigs kept the entry and what it owns (its endpoints
	// are the ones it had).
	sameServices bool
}

// NewServiceEntries returns an empty registry.
func NewServiceEntries(log *slog.Logger, m *metrics.Metrics) *ServiceEntries {
	return &ServiceEntries{
		log: log.With("scope", "serviceentry"), metrics: m,
		wes: map[string][]*config.Config{}, workloads: map[string]map[string]*model.Workload{},
		services: map[string]*model.Service{}, owner: map[string]*seEntry{}, endpoints: map[string][]*model.Endpoint{},
	}
}

// Name implements Registry.
func (r *ServiceEntries) Name() string { return "ServiceEntry" }

// AddHandler implements Registry.
func (r *ServiceEntries) AddHandler(h Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.handlers = append(r.handlers, h)
}

// Services implements Registry.
func (r *ServiceEntries) Services() []*model.Service {
	r.mu.RLock()
	if out := r.sorted; out != nil || len(r.services) == 0 {
		r.mu.RUnlock()
		return out
	}
	r.mu.RUnlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sorted == nil {
		r.sorted = make([]*model.Service, 0, len(r.services))
		for _, s := range r.services {
			r.sorted = append(r.sorted, s)
		}
		slices.SortFunc(r.sorted, func(a, b *model.Service) int { return strings.Compare(a.Hostname, b.Hostname) })
	}
	return r.sorted
}

// Endpoints implements Registry.
func (r *ServiceEntries) Endpoints(host string) []*model.Endpoint {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.endpoints[host]
}

// Workloads lists the auto-registered workloads, for debug output.
func (r *ServiceEntries) Workloads() []*model.Workload {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []*model.Workload
	for _, ws := range r.workloads {
		for _, w := range ws {
			out = append(out, w)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// SetConfigs replaces the ServiceEntries and WorkloadEntries (other kinds are ignored) and
// notifies handlers of what changed.
func (r *ServiceEntries) SetConfigs(cs []*config.Config) {
	// Sized as before: a change adds or removes a few of them.
	ses := make([]*config.Config, 0, len(r.entries))
	wes := make(map[string][]*config.Config, len(r.wes))
	for _, c := range cs {
		switch c.Kind {
		case config.ServiceEntry:
			ses = append(ses, c)
		case config.WorkloadEntry:
			wes[c.Namespace] = append(wes[c.Namespace], c)
		}
	}
	config.SortConfigs(ses)
	for _, list := range wes {
		config.SortConfigs(list)
	}

	r.mu.Lock()
	// An unchanged config (sources keep its pointer) keeps its entry: the services it
	// defines, its selector key, and what it owned unless a host changed hands.
	had := reuse(r.spare.had, len(r.entries))
	defer func() { clear(had); r.spare.had = had }()
	for _, e := range r.entries {
		had[e.cfg] = e
	}
	r.gen++
	entries := make([]*seEntry, 0, len(ses))
	changedNS := map[string]bool{} // namespaces whose entries came or went
	services := reuse(r.spare.services, len(r.services))
	owner := reuse(r.spare.owner, len(r.services))
	for i, c := range ses {
		e := had[c]
		if e == nil {
			e = &seEntry{cfg: c, spec: c.Spec.(*networking.ServiceEntry)}
			e.defined = servicesOf(e.cfg, e.spec)
			if sel := e.spec.GetWorkloadSelector(); sel != nil {
				e.selKey = leastLabel(sel.GetLabels())
			}
			changedNS[c.Namespace] = true
		}
		e.pos, e.gen = i, r.gen
		entries = append(entries, e)
		// What it owns now, copied only once it differs from what it owned.
		var owned []*model.Service
		n := 0
		e.sameServices = had[c] != nil
		for _, s := range e.defined {
			if prev, dup := owner[s.Hostname]; dup {
				r.log.Warn("host defined by two ServiceEntries; the first wins", "host", s.Hostname, "winner", prev.cfg.Key().String(), "ignored", e.cfg.Key().String())
				r.metrics.DuplicateServiceHost.Inc()
				continue
			}
			if old := r.services[s.Hostname]; model.ServiceEqual(old, s) {
				s = old
			}
			services[s.Hostname] = s
			owner[s.Hostname] = e
			if e.sameServices && (n >= len(e.services) || e.services[n] != s) {
				e.sameServices, owned = false, slices.Clone(e.services[:n])
			}
			if !e.sameServices {
				owned = append(owned, s)
			}
			n++
		}
		if e.sameServices && n != len(e.services) {
			e.sameServices, owned = false, slices.Clone(e.services[:n])
		}
		if !e.sameServices {
			e.services = owned
		}
	}
	for _, e := range r.entries {
		if e.gen != r.gen {
			changedNS[e.cfg.Namespace] = true // removed
		}
	}
	// The selecting index of a namespace whose entries are the same entries is kept.
	selecting := make(map[string]map[string][]*seEntry, len(r.selecting))
	for ns, bySel := range r.selecting {
		if !changedNS[ns] {
			selecting[ns] = bySel
		}
	}
	for _, e := range entries {
		ns := e.cfg.Namespace
		if changedNS[ns] && e.spec.GetWorkloadSelector() != nil {
			if selecting[ns] == nil {
				selecting[ns] = map[string][]*seEntry{}
			}
			selecting[ns][e.selKey] = append(selecting[ns][e.selKey], e)
		}
	}
	// Namespaces whose WorkloadEntries are the very configs they were keep their index, and
	// their entries' endpoints below.
	weChanged := map[string]bool{} // namespaces whose WorkloadEntries changed
	for ns := range r.wes {
		if !slices.Equal(r.wes[ns], wes[ns]) {
			weChanged[ns] = true
		}
	}
	for ns := range wes {
		if _, ok := r.wes[ns]; !ok {
			weChanged[ns] = true
		}
	}
	byLabel := make(map[string]map[string][]*config.Config, len(wes))
	for ns, list := range wes {
		if !weChanged[ns] {
			byLabel[ns] = r.weByLabel[ns]
		} else {
			byLabel[ns] = indexByLabel(list)
		}
	}
	r.entries, r.selecting, r.wes, r.weByLabel = entries, selecting, wes, byLabel
	ev := Event{Hosts: map[string]struct{}{}}
	for h, s := range services {
		if r.services[h] != s {
			ev.Full = true
			ev.Hosts[h] = struct{}{}
		}
	}
	for h := range r.services {
		if _, ok := services[h]; !ok {
			ev.Full = true
			ev.Hosts[h] = struct{}{}
		}
	}
	r.spare.services, r.spare.owner = r.services, r.owner
	r.services, r.owner = services, owner
	if ev.Full {
		r.sorted = nil // a new slice: snapshots hold the old one
	}
	endpoints := reuse(r.spare.endpoints, len(r.endpoints))
	for _, e := range entries {
		// An unchanged entry owning the same services has the endpoints it had, unless it
		// selects workloads and its namespace's WorkloadEntries changed (auto-registered
		// workloads update r.endpoints in place as they come and go).
		if e.sameServices && (e.spec.GetWorkloadSelector() == nil || !weChanged[e.cfg.Namespace]) {
			for _, s := range e.services {
				if eps, ok := r.endpoints[s.Hostname]; ok {
					endpoints[s.Hostname] = eps
				}
			}
			continue
		}
		r.computeEndpoints(e, endpoints)
	}
	r.replaceEndpoints(endpoints, nil, ev.Hosts)
	r.metrics.Services.Set(float64(len(services)))
	handlers := r.handlers
	r.mu.Unlock()
	notify(handlers, ev)
}

// replaceEndpoints installs computed endpoints for the hosts in scope (every host when scope
// is nil), recording in changed the hosts whose endpoints differ.
func (r *ServiceEntries) replaceEndpoints(computed map[string][]*model.Endpoint, scope map[string]bool, changed map[string]struct{}) {
	if scope == nil {
		for h, old := range r.endpoints {
			if _, ok := computed[h]; !ok && len(old) > 0 {
				changed[h] = struct{}{}
			}
		}
		for h, eps := range computed {
			if !model.EndpointsEqual(r.endpoints[h], eps) {
				changed[h] = struct{}{}
			} else {
				computed[h] = r.endpoints[h]
			}
		}
		r.spare.endpoints, r.endpoints = r.endpoints, computed
		return
	}
	// Only the hosts in scope change, in place (every reader holds r.mu): a workload
	// change costs its few hosts, not a copy of the mesh's endpoints.
	for h := range scope {
		if !model.EndpointsEqual(r.endpoints[h], computed[h]) {
			changed[h] = struct{}{}
			if len(computed[h]) == 0 {
				delete(r.endpoints, h)
			} else {
				r.endpoints[h] = computed[h]
			}
		}
	}
}

func notify(handlers []Handler, ev Event) {
	if len(ev.Hosts) == 0 {
		return
	}
	for _, h := range handlers {
		h(ev)
	}
}

// SetWorkload adds or updates an auto-registered workload; its endpoints change (an
// endpoints-only event) for every ServiceEntry in its namespace that selects it.
func (r *ServiceEntries) SetWorkload(w *model.Workload) {
	r.mu.Lock()
	ns := r.workloads[w.Namespace]
	if ns == nil {
		ns = map[string]*model.Workload{}
		r.workloads[w.Namespace] = ns
	}
	old := ns[w.Key()]
	if old != nil && old.Equal(w) {
		r.mu.Unlock()
		return
	}
	ns[w.Key()] = w
	ev := r.workloadChanged(w.Namespace, old, w)
	handlers := r.handlers
	r.mu.Unlock()
	notify(handlers, ev)
}

// DeleteWorkload removes an auto-registered workload.
func (r *ServiceEntries) DeleteWorkload(namespace, name string) {
	key := namespace + "/" + name
	r.mu.Lock()
	old := r.workloads[namespace][key]
	if old == nil {
		r.mu.Unlock()
		return
	}
	delete(r.workloads[namespace], key)
	ev := r.workloadChanged(namespace, old, nil)
	handlers := r.handlers
	r.mu.Unlock()
	notify(handlers, ev)
}

// workloadChanged recomputes the endpoints of the entries in ns whose selector matches the
// old or new version of a workload.
func (r *ServiceEntries) workloadChanged(ns string, old, cur *model.Workload) Event {
	ev := Event{Hosts: map[string]struct{}{}}
	computed := map[string][]*model.Endpoint{}
	scope := map[string]bool{}
	for _, e := range r.entriesSelecting(ns, old, cur) {
		sel := e.spec.GetWorkloadSelector()
		if !(old != nil && config.SelectorMatches(sel.GetLabels(), old.Labels)) &&
			!(cur != nil && config.SelectorMatches(sel.GetLabels(), cur.Labels)) {
			continue
		}
		for _, s := range e.services {
			scope[s.Hostname] = true
		}
		r.computeEndpoints(e, computed)
	}
	r.replaceEndpoints(computed, scope, ev.Hosts)
	return ev
}

// servicesOf turns a ServiceEntry into one service per host.
func servicesOf(c *config.Config, se *networking.ServiceEntry) []*model.Service {
	ports := make([]model.Port, 0, len(se.GetPorts()))
	for _, p := range se.GetPorts() {
		ports = append(ports, model.Port{Name: p.GetName(), Port: p.GetNumber(), TargetPort: p.GetTargetPort(), Protocol: model.ParseProtocol(p.GetProtocol(), p.GetName())})
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i].Port < ports[j].Port })
	res := model.ClientSideLB
	switch se.GetResolution() {
	case networking.ServiceEntry_DNS:
		res = model.DNSLB
	case networking.ServiceEntry_DNS_ROUND_ROBIN:
		res = model.DNSRoundRobin
	case networking.ServiceEntry_NONE:
		res = model.Passthrough
	}
	out := make([]*model.Service, 0, len(se.GetHosts()))
	for _, h := range se.GetHosts() {
		out = append(out, &model.Service{
			Hostname: h, Namespace: c.Namespace, Name: c.Name, Addresses: se.GetAddresses(), Ports: ports,
			Resolution: res, MeshExternal: se.GetLocation() == networking.ServiceEntry_MESH_EXTERNAL,
			ExportTo: se.GetExportTo(), Labels: c.Labels, Source: c.Key().String(),
			WorkloadSelector: selectorOf(se),
		})
	}
	return out
}

// endpointPort picks the port an endpoint serves a service port on: the workload's named
// port, else the service port's targetPort, else the service port number.
func endpointPort(p model.Port, named map[string]uint32) uint32 {
	if n := named[p.Name]; n != 0 {
		return n
	}
	if p.TargetPort != 0 {
		return p.TargetPort
	}
	return p.Port
}

// labelKey is one label as an index key (label keys cannot contain a NUL).
func labelKey(k, v string) string { return k + "\x00" + v }

// indexByLabel indexes one namespace's WorkloadEntries by each of their labels.
func indexByLabel(list []*config.Config) map[string][]*config.Config {
	byLabel := map[string][]*config.Config{}
	for _, c := range list {
		for k, v := range c.Spec.(*networking.WorkloadEntry).GetLabels() {
			byLabel[labelKey(k, v)] = append(byLabel[labelKey(k, v)], c)
		}
	}
	return byLabel
}

// leastLabel is the selector's label with the least key as an index key ("" for an empty
// selector, which matches every workload): a workload the selector matches carries it.
func leastLabel(selector map[string]string) string {
	least, first := "", true
	for k := range selector {
		if first || k < least {
			least, first = k, false
		}
	}
	if first {
		return ""
	}
	return labelKey(least, selector[least])
}

// selectable narrows the WorkloadEntries of ns that selector may match to those carrying
// its least label, so that recomputing every ServiceEntry's endpoints is not services x
// WorkloadEntries; the caller still matches the whole selector (caller holds r.mu).
func (r *ServiceEntries) selectable(ns string, selector map[string]string) []*config.Config {
	if len(selector) == 0 {
		return r.wes[ns]
	}
	return r.weByLabel[ns][leastLabel(selector)]
}

// entriesSelecting narrows the ServiceEntries of ns with a workload selector to those whose
// least label one of the workloads carries (or whose selector is empty), in entries order,
// so that a workload change is not a match against every ServiceEntry; the caller still
// matches the whole selector (caller holds r.mu).
func (r *ServiceEntries) entriesSelecting(ns string, workloads ...*model.Workload) []*seEntry {
	byLabel := r.selecting[ns]
	out := slices.Clone(byLabel[""])
	for _, w := range workloads {
		if w == nil {
			continue
		}
		for k, v := range w.Labels {
			out = append(out, byLabel[labelKey(k, v)]...)
		}
	}
	slices.SortFunc(out, func(a, b *seEntry) int { return a.pos - b.pos })
	return slices.Compact(out)
}

// computeEndpoints fills out[host] for every host of e (caller holds r.mu).
func (r *ServiceEntries) computeEndpoints(e *seEntry, out map[string][]*model.Endpoint) {
	if len(e.services) == 0 {
		return
	}
	ports := e.services[0].Ports
	var eps []*model.Endpoint
	add := func(addr string, named map[string]uint32, labels map[string]string, locality, network, sa string, weight uint32, workload string, health model.Health) {
		for _, p := range ports {
			eps = append(eps, &model.Endpoint{
				Address: addr, Port: endpointPort(p, named), ServicePort: p.Port, Labels: labels, Locality: locality,
				Network: network, ServiceAccount: sa, Weight: weight, Health: health, Workload: workload, Namespace: e.cfg.Namespace,
			})
		}
	}
	switch {
	case len(e.spec.GetEndpoints()) > 0:
		for i, we := range e.spec.GetEndpoints() {
			add(we.GetAddress(), we.GetPorts(), we.GetLabels(), we.GetLocality(), we.GetNetwork(), we.GetServiceAccount(), we.GetWeight(),
				fmt.Sprintf("ServiceEntry %s/%s endpoints[%d]", e.cfg.Namespace, e.cfg.Name, i), model.Healthy)
		}
	case e.spec.GetWorkloadSelector() != nil:
		sel := e.spec.GetWorkloadSelector().GetLabels()
		for _, c := range r.selectable(e.cfg.Namespace, sel) {
			we := c.Spec.(*networking.WorkloadEntry)
			if config.SelectorMatches(sel, we.GetLabels()) {
				add(we.GetAddress(), we.GetPorts(), we.GetLabels(), we.GetLocality(), we.GetNetwork(), we.GetServiceAccount(), we.GetWeight(),
					"WorkloadEntry "+c.Namespace+"/"+c.Name, model.Healthy)
			}
		}
		for _, w := range r.workloads[e.cfg.Namespace] {
			if config.SelectorMatches(sel, w.Labels) && len(w.IPs) > 0 {
				add(w.IPs[0], w.Ports, w.Labels, w.Locality, "", w.ServiceAccount, 0, "proxy "+w.Key(), w.Health)
			}
		}
	case e.spec.GetResolution() == networking.ServiceEntry_DNS || e.spec.GetResolution() == networking.ServiceEntry_DNS_ROUND_ROBIN:
		// Without endpoints a DNS entry resolves its own host (Istio's behaviour); done per host below.
		for _, s := range e.services {
			var hostEps []*model.Endpoint
			for _, p := range ports {
				hostEps = append(hostEps, &model.Endpoint{Address: s.Hostname, Port: endpointPort(p, nil), ServicePort: p.Port, Health: model.Healthy,
					Workload: "ServiceEntry " + e.cfg.Namespace + "/" + e.cfg.Name, Namespace: e.cfg.Namespace})
			}
			if r.owner[s.Hostname] == e {
				out[s.Hostname] = hostEps
			}
		}
		return
	}
	model.SortEndpoints(eps)
	for _, s := range e.services {
		if r.owner[s.Hostname] == e && len(eps) > 0 {
			out[s.Hostname] = eps
		}
	}
}

func selectorOf(se *networking.ServiceEntry) map[string]string {
	if se.GetWorkloadSelector() == nil {
		return nil
	}
	if l := se.GetWorkloadSelector().GetLabels(); l != nil {
		return l
	}
	return map[string]string{}
}
