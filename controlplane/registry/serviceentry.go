package registry

import (
	"fmt"
	"log/slog"
	"maps"
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
//
// Config changes are applied by key: a change costs the configs it touches and the hosts
// and workload selectors they reach, not the size of the mesh.
type ServiceEntries struct {
	log     *slog.Logger
	metrics *metrics.Metrics

	mu        sync.RWMutex
	configs   map[config.Key]*config.Config            // the ServiceEntries and WorkloadEntries in force
	entries   map[config.Key]*seEntry                  // by ServiceEntry key
	definers  map[string][]*seEntry                    // entries defining each host, in key order: the first owns it
	selecting map[string]map[string][]*seEntry         // entries with a workload selector, by namespace and leastLabel
	wes       map[string]map[config.Key]*config.Config // WorkloadEntries by namespace
	weByLabel map[string]map[string][]*config.Config   // WorkloadEntries by namespace and labelKey(k, v)
	workloads map[string]map[string]*model.Workload    // auto-registered, by namespace and key
	services  map[string]*model.Service                // by host: its owner's
	endpoints map[string][]*model.Endpoint             // by host
	sorted    []*model.Service                         // services by host, made when asked; replaced, never changed in place
	handlers  []Handler
}

type seEntry struct {
	cfg      *config.Config
	key      config.Key
	spec     *networking.ServiceEntry
	defined  []*model.Service // every service of the entry's hosts
	services []*model.Service // those it owns (a host defined twice goes to the first entry)
	selKey   string           // leastLabel of its workload selector
}

// NewServiceEntries returns an empty registry.
func NewServiceEntries(log *slog.Logger, m *metrics.Metrics) *ServiceEntries {
	return &ServiceEntries{
		log: log.With("scope", "serviceentry"), metrics: m,
		configs: map[config.Key]*config.Config{}, entries: map[config.Key]*seEntry{}, definers: map[string][]*seEntry{},
		selecting: map[string]map[string][]*seEntry{}, wes: map[string]map[config.Key]*config.Config{},
		weByLabel: map[string]map[string][]*config.Config{}, workloads: map[string]map[string]*model.Workload{},
		services: map[string]*model.Service{}, endpoints: map[string][]*model.Endpoint{},
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
		r.sorted = slices.SortedFunc(maps.Values(r.services), model.CompareHosts)
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
// notifies handlers of what changed. A config whose pointer is the one in force is
// unchanged (sources keep the pointers of unchanged configs).
func (r *ServiceEntries) SetConfigs(cs []*config.Config) {
	r.mu.Lock()
	changes := map[config.Key]*config.Config{}
	listed := make(map[config.Key]bool, len(cs))
	for _, c := range cs {
		if c.Kind != config.ServiceEntry && c.Kind != config.WorkloadEntry {
			continue
		}
		listed[c.Key()] = true
		if r.configs[c.Key()] != c {
			changes[c.Key()] = c
		}
	}
	for k := range r.configs {
		if !listed[k] {
			changes[k] = nil
		}
	}
	r.apply(changes)
}

// Apply applies changed configs by key (a nil config: removed), as a config event carries
// them; keys of other kinds than ServiceEntry and WorkloadEntry are ignored.
func (r *ServiceEntries) Apply(changed map[config.Key]*config.Config) {
	changes := map[config.Key]*config.Config{}
	for k, c := range changed {
		if k.Kind == config.ServiceEntry || k.Kind == config.WorkloadEntry {
			changes[k] = c
		}
	}
	if len(changes) == 0 {
		return
	}
	r.mu.Lock()
	r.apply(changes)
}

// apply installs changes (a nil config: removed), recomputes what they reach and notifies
// handlers. The caller holds r.mu; apply releases it.
func (r *ServiceEntries) apply(changes map[config.Key]*config.Config) {
	hosts := map[string]struct{}{}   // hosts whose definers changed
	recompute := map[*seEntry]bool{} // entries whose endpoints are computed again
	var weChanged []*config.Config   // WorkloadEntries that came or went (a change is both)
	for k, c := range changes {
		if c == nil || r.configs[k] != c {
			switch k.Kind {
			case config.ServiceEntry:
				if old := r.entries[k]; old != nil {
					r.removeEntry(old, hosts)
				}
				if c != nil {
					r.addEntry(c, hosts)
				}
			case config.WorkloadEntry:
				if old := r.wes[k.Namespace][k]; old != nil {
					r.removeWorkloadEntry(old)
					weChanged = append(weChanged, old)
				}
				if c != nil {
					r.addWorkloadEntry(c)
					weChanged = append(weChanged, c)
				}
			}
		}
		if c == nil {
			delete(r.configs, k)
		} else {
			r.configs[k] = c
		}
	}
	// Who owns the hosts whose definers changed, and what every definer of them owns now.
	ev := Event{Hosts: map[string]struct{}{}}
	for h := range hosts {
		for _, e := range r.definers[h] {
			r.reown(e)
		}
		var svc *model.Service
		if ds := r.definers[h]; len(ds) > 0 {
			svc = ds[0].owned(h)
			recompute[ds[0]] = true // its endpoints fill the host (in scope below)
		}
		if old := r.services[h]; old != svc {
			ev.Full = true
			ev.Hosts[h] = struct{}{}
			if svc == nil {
				delete(r.services, h)
			} else {
				r.services[h] = svc
			}
		}
	}
	if ev.Full {
		r.sorted = patchSorted(r.sorted, r.services, ev.Hosts)
	}
	// Entries selecting a WorkloadEntry that changed follow it.
	for _, c := range weChanged {
		r.addSelecting(recompute, c.Namespace, c.Spec.(*networking.WorkloadEntry).GetLabels())
	}
	// Every host whose definers changed is in scope: one nobody owns any more loses its
	// endpoints.
	r.recomputeEndpoints(recompute, hosts, ev.Hosts)
	r.metrics.Services.Set(float64(len(r.services)))
	handlers := r.handlers
	r.mu.Unlock()
	notify(handlers, ev)
}

// addEntry indexes a new ServiceEntry, recording the hosts it defines.
func (r *ServiceEntries) addEntry(c *config.Config, hosts map[string]struct{}) {
	e := &seEntry{cfg: c, key: c.Key(), spec: c.Spec.(*networking.ServiceEntry)}
	for _, s := range servicesOf(c, e.spec) {
		if !slices.ContainsFunc(e.defined, func(d *model.Service) bool { return d.Hostname == s.Hostname }) {
			e.defined = append(e.defined, s) // a host listed twice is defined once
		}
	}
	for _, s := range e.defined {
		ds := r.definers[s.Hostname]
		i, _ := slices.BinarySearchFunc(ds, e.key, func(d *seEntry, k config.Key) int { return config.CompareKeys(d.key, k) })
		ds = slices.Insert(ds, i, e)
		r.definers[s.Hostname] = ds
		hosts[s.Hostname] = struct{}{}
		if len(ds) > 1 {
			// The first wins; the ignored one is e, or the entry e took the host from.
			ignored := e
			if i == 0 {
				ignored = ds[1]
			}
			r.log.Warn("host defined by two ServiceEntries; the first wins", "host", s.Hostname, "winner", ds[0].key.String(), "ignored", ignored.key.String())
			r.metrics.DuplicateServiceHost.Inc()
		}
	}
	if sel := e.spec.GetWorkloadSelector(); sel != nil {
		e.selKey = leastLabel(sel.GetLabels())
		bySel := r.selecting[c.Namespace]
		if bySel == nil {
			bySel = map[string][]*seEntry{}
			r.selecting[c.Namespace] = bySel
		}
		bySel[e.selKey] = append(bySel[e.selKey], e)
	}
	r.entries[e.key] = e
}

// removeEntry unindexes a ServiceEntry, recording the hosts it defined.
func (r *ServiceEntries) removeEntry(e *seEntry, hosts map[string]struct{}) {
	for _, s := range e.defined {
		deleteFrom(r.definers, s.Hostname, e)
		hosts[s.Hostname] = struct{}{}
	}
	if bySel := r.selecting[e.cfg.Namespace]; e.spec.GetWorkloadSelector() != nil && bySel != nil {
		deleteFrom(bySel, e.selKey, e)
		if len(bySel) == 0 {
			delete(r.selecting, e.cfg.Namespace)
		}
	}
	delete(r.entries, e.key)
}

// reown brings what e owns up to date with the definers of its hosts, keeping the service a
// host had when it is equal.
func (r *ServiceEntries) reown(e *seEntry) {
	var owned []*model.Service
	for _, s := range e.defined {
		if r.definers[s.Hostname][0] != e {
			continue
		}
		if old := r.services[s.Hostname]; model.ServiceEqual(old, s) {
			s = old
		}
		owned = append(owned, s)
	}
	e.services = owned
}

// HostHolder is a host a ServiceEntry defines that another ServiceEntry holds.
type HostHolder struct {
	Host   string
	Holder config.Key // the ServiceEntry in force for Host
}

// NotInForce says how much of a ServiceEntry is not in force: hosts it defines that a
// ServiceEntry first by namespace and name defines too (the first wins).
type NotInForce struct {
	Hosts []HostHolder // sorted by host
	// Partly: the entry holds other hosts of its own, so it is partly in force.
	Partly bool
}

// Status is the entry's status for /debug/configz: "ignored", or "partly applied".
func (n NotInForce) Status() string {
	if n.Partly {
		return "partly applied"
	}
	return "ignored"
}

// Reason names each host the entry does not hold and the ServiceEntry that does.
func (n NotInForce) Reason() string {
	var b strings.Builder
	for i, h := range n.Hosts {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "host %s is already defined by %s (the first by namespace and name wins)", h.Host, h.Holder)
	}
	return b.String()
}

// NotInForce returns, by key, the ServiceEntries some of whose hosts another ServiceEntry
// holds.
func (r *ServiceEntries) NotInForce() map[config.Key]NotInForce {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := map[config.Key]NotInForce{}
	for k, e := range r.entries {
		if len(e.services) == len(e.defined) {
			continue
		}
		n := NotInForce{Partly: len(e.services) > 0}
		for _, s := range e.defined {
			if ds := r.definers[s.Hostname]; ds[0] != e {
				n.Hosts = append(n.Hosts, HostHolder{Host: s.Hostname, Holder: ds[0].key})
			}
		}
		slices.SortFunc(n.Hosts, func(a, b HostHolder) int { return strings.Compare(a.Host, b.Host) })
		out[k] = n
	}
	return out
}

// owned returns the service e owns for host (nil if it does not own it).
func (e *seEntry) owned(host string) *model.Service {
	for _, s := range e.services {
		if s.Hostname == host {
			return s
		}
	}
	return nil
}

// owns reports whether e owns host (caller holds r.mu).
func (r *ServiceEntries) owns(e *seEntry, host string) bool {
	ds := r.definers[host]
	return len(ds) > 0 && ds[0] == e
}

// patchSorted returns the services list sorted by host brought up to date for the changed
// hosts, as a new slice (snapshots hold the old one); many changes leave it to be made
// again when asked (nil).
func patchSorted(sorted []*model.Service, services map[string]*model.Service, changed map[string]struct{}) []*model.Service {
	if sorted == nil || len(changed) > len(sorted)/16 {
		return nil
	}
	sorted = slices.Clone(sorted)
	for h := range changed {
		sorted = model.PatchServices(sorted, h, services[h])
	}
	return sorted
}

// addWorkloadEntry indexes a WorkloadEntry by namespace and label.
func (r *ServiceEntries) addWorkloadEntry(c *config.Config) {
	if r.wes[c.Namespace] == nil {
		r.wes[c.Namespace] = map[config.Key]*config.Config{}
		r.weByLabel[c.Namespace] = map[string][]*config.Config{}
	}
	r.wes[c.Namespace][c.Key()] = c
	byLabel := r.weByLabel[c.Namespace]
	for k, v := range c.Spec.(*networking.WorkloadEntry).GetLabels() {
		byLabel[labelKey(k, v)] = append(byLabel[labelKey(k, v)], c)
	}
}

// removeWorkloadEntry unindexes a WorkloadEntry.
func (r *ServiceEntries) removeWorkloadEntry(c *config.Config) {
	delete(r.wes[c.Namespace], c.Key())
	byLabel := r.weByLabel[c.Namespace]
	for k, v := range c.Spec.(*networking.WorkloadEntry).GetLabels() {
		deleteFrom(byLabel, labelKey(k, v), c)
	}
	if len(r.wes[c.Namespace]) == 0 {
		delete(r.wes, c.Namespace)
		delete(r.weByLabel, c.Namespace)
	}
}

// deleteFrom removes v from the list m[k], and the key with its last value.
func deleteFrom[K, V comparable](m map[K][]V, k K, v V) {
	if list := slices.DeleteFunc(m[k], func(o V) bool { return o == v }); len(list) == 0 {
		delete(m, k)
	} else {
		m[k] = list
	}
}

// replaceEndpoints installs the computed endpoints of the hosts in scope, in place (every
// reader holds r.mu), recording in changed the hosts whose endpoints differ: a change
// costs its few hosts, not a copy of the mesh's endpoints.
func (r *ServiceEntries) replaceEndpoints(computed map[string][]*model.Endpoint, scope map[string]struct{}, changed map[string]struct{}) {
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
	recompute := map[*seEntry]bool{}
	for _, w := range []*model.Workload{old, cur} {
		if w != nil {
			r.addSelecting(recompute, ns, w.Labels)
		}
	}
	r.recomputeEndpoints(recompute, map[string]struct{}{}, ev.Hosts)
	return ev
}

// recomputeEndpoints computes the endpoints of entries and installs those of the hosts in
// scope and of every host the entries own, recording in changed the hosts whose endpoints
// differ (caller holds r.mu).
func (r *ServiceEntries) recomputeEndpoints(entries map[*seEntry]bool, scope map[string]struct{}, changed map[string]struct{}) {
	computed := map[string][]*model.Endpoint{}
	for e := range entries {
		if r.entries[e.key] != e {
			continue // replaced or removed
		}
		for _, s := range e.services {
			scope[s.Hostname] = struct{}{}
		}
		r.computeEndpoints(e, computed)
	}
	r.replaceEndpoints(computed, scope, changed)
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
		return slices.Collect(maps.Values(r.wes[ns]))
	}
	return r.weByLabel[ns][leastLabel(selector)]
}

// addSelecting adds to set the entries of ns whose workload selector matches labels. The
// index narrows them to the entries whose least label the labels carry (or whose selector
// is empty), so that a workload change is not a match against every ServiceEntry
// (caller holds r.mu).
func (r *ServiceEntries) addSelecting(set map[*seEntry]bool, ns string, labels map[string]string) {
	byLabel := r.selecting[ns]
	match := func(es []*seEntry) {
		for _, e := range es {
			if config.SelectorMatches(e.spec.GetWorkloadSelector().GetLabels(), labels) {
				set[e] = true
			}
		}
	}
	match(byLabel[""])
	for k, v := range labels {
		match(byLabel[labelKey(k, v)])
	}
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
			if r.owns(e, s.Hostname) {
				out[s.Hostname] = hostEps
			}
		}
		return
	}
	model.SortEndpoints(eps)
	for _, s := range e.services {
		if r.owns(e, s.Hostname) && len(eps) > 0 {
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
