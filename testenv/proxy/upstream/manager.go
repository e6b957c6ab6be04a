package upstream

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/wasmesh/wasmesh/testenv/proxy/sds"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// defaultInitialFetchTimeout is Envoy's initial_fetch_timeout: a warming EDS cluster
// becomes active without endpoints after it.
const defaultInitialFetchTimeout = 15 * time.Second

// Manager is the cluster manager. Clusters are replaced whole on update; requests in
// flight keep the *Cluster they started with.
type Manager struct {
	ctx   context.Context
	store *stats.Store
	log   *slog.Logger

	lbs map[clusterv3.Cluster_LbPolicy]LBFactory

	mu       sync.RWMutex
	active   map[string]*entry
	warming  map[string]*entry
	cla      map[string]*endpointv3.ClusterLoadAssignment // last EDS per service name
	onChange []func()
	secrets  *sds.Manager

	cmStats struct {
		added, modified, removed, updateEndpoints *stats.Counter
		active, warmingG                          *stats.Gauge
	}
}

type entry struct {
	c      *Cluster
	cancel context.CancelFunc
	timer  *time.Timer
	static bool
	// hostsReady: the cluster's hosts arrived (or their wait timed out); it may still
	// wait for its secrets.
	hostsReady bool
}

// NewManager returns an empty cluster manager whose background work (DNS refresh, warming
// timeouts) stops with ctx.
func NewManager(ctx context.Context, store *stats.Store, log *slog.Logger) *Manager {
	m := &Manager{ctx: ctx, store: store, log: log, lbs: builtinLBs(),
		active: map[string]*entry{}, warming: map[string]*entry{}, cla: map[string]*endpointv3.ClusterLoadAssignment{}}
	sc := store.Scope("cluster_manager")
	m.cmStats.added = sc.Counter("cluster_added")
	m.cmStats.modified = sc.Counter("cluster_modified")
	m.cmStats.removed = sc.Counter("cluster_removed")
	m.cmStats.updateEndpoints = sc.Counter("cluster_updated")
	m.cmStats.active = sc.Gauge("active_clusters")
	m.cmStats.warmingG = sc.Gauge("warming_clusters")
	return m
}

// SetSecrets gives the manager the secrets of TLS transport sockets (before clusters are
// added).
func (m *Manager) SetSecrets(s *sds.Manager) { m.secrets = s }

// Context is the cluster manager's lifetime (work that outlives a request, such as shadow
// requests, stops with it).
func (m *Manager) Context() context.Context { return m.ctx }

// RegisterLB adds or replaces the balancer of an lb_policy.
func (m *Manager) RegisterLB(p clusterv3.Cluster_LbPolicy, f LBFactory) {
	m.mu.Lock()
	m.lbs[p] = f
	m.mu.Unlock()
}

// OnChange registers f to be called (without locks held) when clusters become active,
// are added or removed.
func (m *Manager) OnChange(f func()) {
	m.mu.Lock()
	m.onChange = append(m.onChange, f)
	m.mu.Unlock()
}

func (m *Manager) notify() {
	m.mu.RLock()
	fs := append([]func(){}, m.onChange...)
	m.mu.RUnlock()
	for _, f := range fs {
		f()
	}
}

// Validate builds a cluster without installing it: the error says why it would be
// rejected.
func (m *Manager) Validate(cfg *clusterv3.Cluster) error {
	_, err := m.build(cfg, "")
	return err
}

func (m *Manager) build(cfg *clusterv3.Cluster, version string) (*Cluster, error) {
	if err := cfg.ValidateAll(); err != nil {
		return nil, fmt.Errorf("cluster %s: %w", cfg.GetName(), err)
	}
	m.mu.RLock()
	lbf := m.lbs[cfg.GetLbPolicy()]
	m.mu.RUnlock()
	if cfg.GetType() == clusterv3.Cluster_ORIGINAL_DST && cfg.GetLbPolicy() == clusterv3.Cluster_CLUSTER_PROVIDED {
		lbf = newRoundRobin
	}
	if lbf == nil {
		return nil, fmt.Errorf("cluster %s: lb_policy %s is not supported", cfg.GetName(), cfg.GetLbPolicy())
	}
	switch cfg.GetClusterDiscoveryType().(type) {
	case *clusterv3.Cluster_Type:
		switch cfg.GetType() {
		case clusterv3.Cluster_STATIC, clusterv3.Cluster_STRICT_DNS, clusterv3.Cluster_LOGICAL_DNS,
			clusterv3.Cluster_EDS, clusterv3.Cluster_ORIGINAL_DST:
		default:
			return nil, fmt.Errorf("cluster %s: type %s is not supported", cfg.GetName(), cfg.GetType())
		}
	case nil:
	default:
		return nil, fmt.Errorf("cluster %s: cluster_type extensions are not supported", cfg.GetName())
	}
	sc := m.store.Scope("cluster." + cfg.GetName())
	lb, err := lbf(cfg, sc)
	if err != nil {
		return nil, fmt.Errorf("cluster %s: %w", cfg.GetName(), err)
	}
	c, err := newCluster(cfg, version, sc, lb)
	if err != nil {
		return nil, err
	}
	if c.transports, err = compileTransports(cfg, m.secrets, sc); err != nil {
		return nil, fmt.Errorf("cluster %s: %w", cfg.GetName(), err)
	}
	if la := cfg.GetLoadAssignment(); la != nil && cfg.GetType() != clusterv3.Cluster_EDS {
		hosts, err := hostsFromAssignment(la)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: load_assignment: %w", cfg.GetName(), err)
		}
		dns := cfg.GetType() == clusterv3.Cluster_STRICT_DNS || cfg.GetType() == clusterv3.Cluster_LOGICAL_DNS
		for _, h := range hosts {
			if dns && h.Network == "unix" {
				return nil, fmt.Errorf("cluster %s: load_assignment: pipe address %s in a %s cluster: only socket addresses resolve", cfg.GetName(), h.Address, cfg.GetType())
			}
		}
	}
	return c, nil
}

// AddOrUpdate installs a cluster. An EDS cluster without endpoints known yet warms: it is
// not used (the previous version, if any, keeps serving) until its endpoints arrive or the
// initial fetch timeout passes. A cluster identical to the installed one is left alone.
func (m *Manager) AddOrUpdate(cfg *clusterv3.Cluster, version string, static bool) error {
	c, err := m.build(cfg, version)
	if err != nil {
		return err
	}
	m.mu.Lock()
	if old := m.active[c.Name]; old != nil && protoEqual(old.c.Config, cfg) {
		m.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithCancel(m.ctx)
	e := &entry{c: c, cancel: cancel, static: static}
	_, existed := m.active[c.Name]
	if w := m.warming[c.Name]; w != nil {
		w.cancel()
		if w.timer != nil {
			w.timer.Stop()
		}
		delete(m.warming, c.Name)
	}
	warm := false
	switch cfg.GetType() {
	case clusterv3.Cluster_EDS:
		if cla := m.cla[c.ServiceName]; cla != nil {
			hs, _ := hostSetFromAssignment(cla)
			c.SetHosts(hs)
		} else {
			warm = true
		}
	case clusterv3.Cluster_STATIC, clusterv3.Cluster_ORIGINAL_DST:
		hs, _ := hostSetFromAssignment(cfg.GetLoadAssignment())
		c.SetHosts(hs)
	case clusterv3.Cluster_STRICT_DNS, clusterv3.Cluster_LOGICAL_DNS:
		hs, _ := hostSetFromAssignment(cfg.GetLoadAssignment())
		hosts := hs.All
		c.SetHosts(hs)
		// The cluster warms until its first resolution, as Envoy's DNS clusters do.
		warm = true
		name := c.Name
		go m.refreshDNS(ctx, c, hosts, cfg.GetType() == clusterv3.Cluster_LOGICAL_DNS, func() { m.finishWarming(name, e) })
	}
	c.start(ctx)
	e.hostsReady = !warm
	// A cluster whose TLS secrets have not arrived warms too, as Envoy's init manager
	// waits for the transport socket's SDS subscriptions.
	secretsPending := !c.transports.ready()
	if warm || secretsPending {
		m.warming[c.Name] = e
	}
	if warm {
		timeout := defaultInitialFetchTimeout
		if t := cfg.GetEdsClusterConfig().GetEdsConfig().GetInitialFetchTimeout(); t != nil {
			timeout = t.AsDuration()
		}
		if timeout > 0 {
			name := c.Name
			e.timer = time.AfterFunc(timeout, func() { m.finishWarming(name, e) })
		}
	} else if !secretsPending {
		m.activate(e, existed)
	}
	m.gauges()
	m.mu.Unlock()
	if secretsPending {
		for _, p := range c.transports.providers() {
			p.OnDone(func() { m.secretsDone(c.Name, e) })
		}
	}
	m.notify()
	return nil
}

// secretsDone activates a warming cluster once its secrets and its hosts are there.
func (m *Manager) secretsDone(name string, e *entry) {
	m.mu.Lock()
	if m.warming[name] != e || !e.hostsReady || !e.c.transports.ready() {
		m.mu.Unlock()
		return
	}
	delete(m.warming, name)
	_, existed := m.active[name]
	m.activate(e, existed)
	m.gauges()
	m.mu.Unlock()
	m.notify()
}

// activate installs e as the active cluster; m.mu must be held.
func (m *Manager) activate(e *entry, existed bool) {
	if old := m.active[e.c.Name]; old != nil {
		old.cancel()
		old.c.Close()
	}
	m.active[e.c.Name] = e
	e.c.Stats.UpdateSuccess.Inc()
	if existed {
		m.cmStats.modified.Inc()
	} else {
		m.cmStats.added.Inc()
	}
}

func (m *Manager) finishWarming(name string, e *entry) {
	m.mu.Lock()
	if m.warming[name] != e {
		m.mu.Unlock()
		return
	}
	e.hostsReady = true
	if !e.c.transports.ready() {
		m.mu.Unlock()
		return
	}
	delete(m.warming, name)
	_, existed := m.active[name]
	if e.c.hosts.Load() == nil {
		e.c.SetHosts(&HostSet{})
	}
	m.activate(e, existed)
	m.gauges()
	m.mu.Unlock()
	m.notify()
}

func (m *Manager) gauges() {
	m.cmStats.active.Set(int64(len(m.active)))
	m.cmStats.warmingG.Set(int64(len(m.warming)))
}

// Remove deletes a dynamic cluster (static clusters stay, as in Envoy).
func (m *Manager) Remove(name string) {
	m.mu.Lock()
	if e := m.active[name]; e != nil && !e.static {
		e.cancel()
		e.c.Close()
		delete(m.active, name)
		m.cmStats.removed.Inc()
	}
	if w := m.warming[name]; w != nil {
		w.cancel()
		if w.timer != nil {
			w.timer.Stop()
		}
		delete(m.warming, name)
	}
	m.gauges()
	m.mu.Unlock()
	m.notify()
}

// DynamicNames lists the non-static clusters (active or warming), for SotW removal.
func (m *Manager) DynamicNames() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	seen := map[string]bool{}
	for n, e := range m.active {
		if !e.static {
			seen[n] = true
		}
	}
	for n := range m.warming {
		seen[n] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// UpdateEndpoints applies an EDS ClusterLoadAssignment to every cluster with its service
// name, activating warming clusters.
func (m *Manager) UpdateEndpoints(cla *endpointv3.ClusterLoadAssignment) error {
	base, err := hostSetFromAssignment(cla)
	if err != nil {
		return fmt.Errorf("cluster load assignment %s: %w", cla.GetClusterName(), err)
	}
	hosts := base.All
	hostSet := func() *HostSet {
		hs := NewHostSet(cloneHosts(hosts))
		hs.OverprovisioningFactor = base.OverprovisioningFactor
		return hs
	}
	m.mu.Lock()
	m.cla[cla.GetClusterName()] = cla
	for _, e := range m.active {
		if e.c.Config.GetType() == clusterv3.Cluster_EDS && e.c.ServiceName == cla.GetClusterName() {
			e.c.SetHosts(hostSet())
			e.c.Stats.UpdateSuccess.Inc()
			if len(hosts) == 0 {
				e.c.Stats.UpdateEmpty.Inc()
			}
		}
	}
	var done []*entry
	for name, e := range m.warming {
		if e.c.ServiceName == cla.GetClusterName() {
			e.c.SetHosts(hostSet())
			if e.timer != nil {
				e.timer.Stop()
			}
			e.hostsReady = true
			if !e.c.transports.ready() {
				continue // secretsDone activates it
			}
			delete(m.warming, name)
			done = append(done, e)
		}
	}
	for _, e := range done {
		_, existed := m.active[e.c.Name]
		m.activate(e, existed)
	}
	m.cmStats.updateEndpoints.Inc()
	m.gauges()
	m.mu.Unlock()
	m.notify()
	return nil
}

// RemoveEndpoints forgets the assignment of a service name (delta EDS removal): its
// clusters keep no hosts.
func (m *Manager) RemoveEndpoints(serviceName string) {
	m.mu.Lock()
	delete(m.cla, serviceName)
	for _, e := range m.active {
		if e.c.Config.GetType() == clusterv3.Cluster_EDS && e.c.ServiceName == serviceName {
			e.c.SetHosts(&HostSet{})
		}
	}
	m.mu.Unlock()
}

func cloneHosts(hs []*Host) []*Host {
	out := make([]*Host, len(hs))
	for i, h := range hs {
		out[i] = &Host{Address: h.Address, Network: h.Network, Hostname: h.Hostname, Weight: h.Weight, Priority: h.Priority,
			Locality: h.Locality, LocalityWeight: h.LocalityWeight, Metadata: h.Metadata, Health: h.Health}
	}
	return out
}

// Get returns the active cluster name, or nil.
func (m *Manager) Get(name string) *Cluster {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if e := m.active[name]; e != nil {
		return e.c
	}
	return nil
}

// Active returns the active clusters sorted by name.
func (m *Manager) Active() []*Cluster { return m.list(m.active) }

// Warming returns the warming clusters sorted by name.
func (m *Manager) Warming() []*Cluster { return m.list(m.warming) }

// IsStatic reports whether the active cluster name came from the bootstrap.
func (m *Manager) IsStatic(name string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e := m.active[name]
	return e != nil && e.static
}

func (m *Manager) list(src map[string]*entry) []*Cluster {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]*Cluster, 0, len(src))
	for _, e := range src {
		out = append(out, e.c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// EDSServiceNames lists the EDS service names of every EDS cluster (active or warming),
// the resource names of the EDS subscription.
func (m *Manager) EDSServiceNames() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	seen := map[string]bool{}
	for _, src := range []map[string]*entry{m.active, m.warming} {
		for _, e := range src {
			if e.c.Config.GetType() == clusterv3.Cluster_EDS {
				seen[e.c.ServiceName] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// Close stops every cluster.
func (m *Manager) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.active {
		e.cancel()
		e.c.Close()
	}
	for _, e := range m.warming {
		e.cancel()
		if e.timer != nil {
			e.timer.Stop()
		}
	}
}

// refreshDNS resolves the hostnames of a DNS cluster every dns_refresh_rate (Envoy's
// default 5s): STRICT_DNS gets a host per address, LOGICAL_DNS one host per endpoint with
// the first address, both after dns_lookup_family.
func (m *Manager) refreshDNS(ctx context.Context, c *Cluster, template []*Host, logical bool, resolved func()) {
	rate := 5 * time.Second
	if r := c.Config.GetDnsRefreshRate(); r != nil && r.AsDuration() > 0 {
		rate = r.AsDuration()
	}
	t := time.NewTicker(rate)
	defer t.Stop()
	for {
		var hosts []*Host
		for _, h := range template {
			hostname, port, err := net.SplitHostPort(h.Address)
			if err != nil {
				continue
			}
			ips, err := net.DefaultResolver.LookupIPAddr(ctx, hostname)
			if err != nil {
				m.log.Debug("dns resolution failed", "cluster", c.Name, "host", hostname, "err", err)
				continue
			}
			addrs := byFamily(ips, c.Config.GetDnsLookupFamily())
			if logical && len(addrs) > 1 {
				addrs = addrs[:1]
			}
			for _, a := range addrs {
				nh := cloneHosts([]*Host{h})[0]
				nh.Address = net.JoinHostPort(a, port)
				nh.Hostname = hostname
				hosts = append(hosts, nh)
			}
		}
		if hosts != nil {
			hs := NewHostSet(hosts)
			hs.OverprovisioningFactor = c.Hosts().OverprovisioningFactor
			c.SetHosts(hs)
		}
		if resolved != nil {
			resolved()
			resolved = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// byFamily applies dns_lookup_family to resolved addresses: AUTO prefers IPv6 and falls
// back to IPv4, V4_PREFERRED the other way round, ALL keeps both.
func byFamily(ips []net.IPAddr, f clusterv3.Cluster_DnsLookupFamily) []string {
	var v4, v6 []string
	for _, ip := range ips {
		if ip.IP.To4() != nil {
			v4 = append(v4, ip.IP.String())
		} else {
			v6 = append(v6, ip.IP.String())
		}
	}
	switch f {
	case clusterv3.Cluster_V4_ONLY:
		return v4
	case clusterv3.Cluster_V6_ONLY:
		return v6
	case clusterv3.Cluster_V4_PREFERRED:
		if len(v4) > 0 {
			return v4
		}
		return v6
	case clusterv3.Cluster_ALL:
		return append(v4, v6...)
	}
	if len(v6) > 0 {
		return v6
	}
	return v4
}

func protoEqual(a, b proto.Message) bool { return proto.Equal(a, b) }

// OriginalDstHost returns a host for an ORIGINAL_DST cluster from the address the
// downstream connection was sent to.
func OriginalDstHost(addr string) *Host {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(addr, strconv.Itoa(80))
	}
	return &Host{Address: addr, Weight: 1, st: &hostState{}}
}
