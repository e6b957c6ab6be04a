package registry

import (
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

func parse(t *testing.T, y string) []*config.Config {
	t.Helper()
	var out []*config.Config
	for _, d := range config.ParseFile("test.yaml", []byte(y)) {
		require.Nil(t, d.Err, "%v", d.Err)
		out = append(out, d.Config)
	}
	return out
}

const entries = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9080, name: http, targetPort: 8080}, {number: 9090, name: grpc-api}]
  workloadSelector: {labels: {app: reviews}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm, namespace: shop}
spec: {address: 10.0.0.9, labels: {app: reviews}, ports: {grpc-api: 7000}, locality: eu/west}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: shop}
spec:
  hosts: [api.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 443, name: tls, protocol: TLS}]
`

type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) handle(e Event) { r.mu.Lock(); r.events = append(r.events, e); r.mu.Unlock() }
func (r *recorder) all() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

func newRegistry(t *testing.T) (*ServiceEntries, *recorder, *metrics.Metrics) {
	m := metrics.New(prometheus.NewRegistry())
	r := NewServiceEntries(slog.New(slog.NewTextHandler(io.Discard, nil)), m)
	rec := &recorder{}
	r.AddHandler(rec.handle)
	return r, rec, m
}

func addrs(eps []*model.Endpoint) (out []string) {
	for _, e := range eps {
		out = append(out, e.Address+":"+itoa(e.Port)+"@"+itoa(e.ServicePort))
	}
	return
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

func TestServiceEntryServicesAndEndpoints(t *testing.T) {
	r, rec, _ := newRegistry(t)
	r.SetConfigs(parse(t, entries))
	svcs := r.Services()
	require.Len(t, svcs, 2)
	assert.Equal(t, "api.example.com", svcs[0].Hostname)
	assert.Equal(t, model.DNSLB, svcs[0].Resolution)
	assert.True(t, svcs[0].MeshExternal)
	assert.Equal(t, model.GRPC, svcs[1].Ports[1].Protocol)
	// WorkloadEntry ports by name override; otherwise targetPort, else the port number.
	assert.Equal(t, []string{"10.0.0.9:8080@9080", "10.0.0.9:7000@9090"}, addrs(r.Endpoints("reviews.shop.svc.cluster.local")))
	assert.Equal(t, "eu/west", r.Endpoints("reviews.shop.svc.cluster.local")[0].Locality)
	// A DNS entry without endpoints resolves its own host.
	assert.Equal(t, []string{"api.example.com:443@443"}, addrs(r.Endpoints("api.example.com")))
	require.Len(t, rec.all(), 1)
	assert.True(t, rec.all()[0].Full)

	// Setting the same configs again changes nothing.
	r.SetConfigs(parse(t, entries))
	assert.Len(t, rec.all(), 1)
}

func TestAutoRegistrationIsEndpointsOnlyAndHonoursGracePeriod(t *testing.T) {
	r, rec, m := newRegistry(t)
	r.SetConfigs(parse(t, entries))
	a := NewAutoRegistration(workloadsInto{r}, time.Hour, slog.New(slog.NewTextHandler(io.Discard, nil)), m)
	defer a.Close()
	w := &model.Workload{Name: "reviews-1", Namespace: "shop", Labels: map[string]string{"app": "reviews"}, IPs: []string{"127.10.0.1"}, Ports: map[string]uint32{"http": 8081}}
	a.Connect(w, false)
	evs := rec.all()
	require.Len(t, evs, 2)
	assert.False(t, evs[1].Full)
	assert.Equal(t, map[string]struct{}{"reviews.shop.svc.cluster.local": {}}, evs[1].Hosts)
	assert.Equal(t, []string{"10.0.0.9:8080@9080", "127.10.0.1:8081@9080", "10.0.0.9:7000@9090", "127.10.0.1:9090@9090"},
		addrs(r.Endpoints("reviews.shop.svc.cluster.local")))

	// A workload in another namespace or with other labels is not selected.
	a.Connect(&model.Workload{Name: "x", Namespace: "other", Labels: map[string]string{"app": "reviews"}, IPs: []string{"127.10.0.2"}}, false)
	a.Connect(&model.Workload{Name: "y", Namespace: "shop", Labels: map[string]string{"app": "ratings"}, IPs: []string{"127.10.0.3"}}, false)
	assert.Len(t, rec.all(), 2)

	// Disconnect and reconnect within the grace period: still registered, removal cancelled.
	a.Disconnect(w)
	a.Connect(w, false)
	a.mu.Lock()
	assert.Empty(t, a.timers)
	a.mu.Unlock()
	assert.Len(t, r.Endpoints("reviews.shop.svc.cluster.local"), 4)

	// With a short grace period the workload goes away after it.
	a.grace = 10 * time.Millisecond
	a.Disconnect(w)
	require.Eventually(t, func() bool { return len(r.Endpoints("reviews.shop.svc.cluster.local")) == 2 }, 5*time.Second, 5*time.Millisecond)
	evs = rec.all()
	assert.False(t, evs[len(evs)-1].Full)
}

func TestAggregateFirstRegistryWins(t *testing.T) {
	a, _, _ := newRegistry(t)
	b, _, _ := newRegistry(t)
	a.SetConfigs(parse(t, entries))
	b.SetConfigs(parse(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: other, namespace: x}
spec:
  hosts: [api.example.com, db.example.com]
  resolution: STATIC
  ports: [{number: 5432, name: tcp}]
  endpoints: [{address: 10.1.1.1}]
`))
	agg := NewAggregate(a, b)
	var hosts []string
	for _, s := range agg.Services() {
		hosts = append(hosts, s.Hostname+"/"+s.Namespace)
	}
	assert.Equal(t, []string{"api.example.com/shop", "db.example.com/x", "reviews.shop.svc.cluster.local/shop"}, hosts)
	assert.Equal(t, []string{"10.1.1.1:5432@5432"}, addrs(agg.Endpoints("db.example.com")))
}

func TestHealthReportsDriveEndpointHealth(t *testing.T) {
	r, rec, m := newRegistry(t)
	r.SetConfigs(parse(t, entries))
	a := NewAutoRegistration(workloadsInto{r}, time.Hour, slog.New(slog.NewTextHandler(io.Discard, nil)), m)
	defer a.Close()
	health := func(ip string) model.Health {
		for _, e := range r.Endpoints("reviews.shop.svc.cluster.local") {
			if e.Address == ip {
				return e.Health
			}
		}
		t.Fatalf("no endpoint %s", ip)
		return 0
	}
	// A health-checked proxy starts unhealthy until its agent reports.
	a.Connect(&model.Workload{Name: "r1", Namespace: "shop", Labels: map[string]string{"app": "reviews"}, IPs: []string{"127.10.0.1"}}, true)
	assert.Equal(t, model.Unhealthy, health("127.10.0.1"))
	n := len(rec.all())
	a.SetHealth("shop", "r1", true, "")
	assert.Equal(t, model.Healthy, health("127.10.0.1"))
	require.Len(t, rec.all(), n+1)
	assert.False(t, rec.all()[n].Full, "a health change is an endpoints-only change")
	a.SetHealth("shop", "r1", true, "") // no change, no event
	assert.Len(t, rec.all(), n+1)
	a.SetHealth("shop", "r1", false, "draining")
	assert.Equal(t, model.Unhealthy, health("127.10.0.1"))

	// A report that arrives before the proxy connects is kept for it.
	a.SetHealth("shop", "r2", true, "")
	a.Connect(&model.Workload{Name: "r2", Namespace: "shop", Labels: map[string]string{"app": "reviews"}, IPs: []string{"127.10.0.2"}}, true)
	assert.Equal(t, model.Healthy, health("127.10.0.2"))
	// Without the metadata a proxy is healthy at once.
	a.Connect(&model.Workload{Name: "r3", Namespace: "shop", Labels: map[string]string{"app": "reviews"}, IPs: []string{"127.10.0.3"}}, false)
	assert.Equal(t, model.Healthy, health("127.10.0.3"))
}

// A workloadSelector selects the WorkloadEntries of its namespace that carry every one of
// its labels, however the entries are indexed.
func TestWorkloadSelectorMatchesEveryLabelInItsNamespace(t *testing.T) {
	r, _, _ := newRegistry(t)
	r.SetConfigs(parse(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews-v1, namespace: shop}
spec:
  hosts: [reviews-v1.shop.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9080, name: http}]
  workloadSelector: {labels: {version: v1, app: reviews}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: both, namespace: shop}
spec: {address: 10.0.0.1, labels: {app: reviews, version: v1, zone: a}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: other-version, namespace: shop}
spec: {address: 10.0.0.2, labels: {app: reviews, version: v2}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: app-only, namespace: shop}
spec: {address: 10.0.0.3, labels: {app: reviews}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: version-only, namespace: shop}
spec: {address: 10.0.0.4, labels: {version: v1}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: elsewhere, namespace: other}
spec: {address: 10.0.0.5, labels: {app: reviews, version: v1}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: both-again, namespace: shop}
spec: {address: 10.0.0.6, labels: {version: v1, app: reviews}}
`))
	assert.Equal(t, []string{"10.0.0.1:9080@9080", "10.0.0.6:9080@9080"}, addrs(r.Endpoints("reviews-v1.shop.svc.cluster.local")))
}

// An auto-registered workload reaches exactly the ServiceEntries of its namespace whose
// selector it matches (an empty selector matches all), and a label change moves it.
func TestWorkloadChangesReachTheSelectingEntries(t *testing.T) {
	r, rec, _ := newRegistry(t)
	entry := func(name, ns, selector string) string {
		return `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ` + name + `, namespace: ` + ns + `}
spec:
  hosts: [` + name + `.` + ns + `.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 80, name: http}]
  workloadSelector: {labels: ` + selector + `}
---`
	}
	r.SetConfigs(parse(t, entry("a", "shop", "{app: a}")+entry("a-v1", "shop", "{version: v1, app: a}")+
		entry("all", "shop", "{}")+entry("b", "shop", "{app: b}")+entry("a", "other", "{app: a}")))
	host := func(name, ns string) string { return name + "." + ns + ".svc.cluster.local" }
	has := func() map[string]bool {
		out := map[string]bool{}
		for _, h := range []string{host("a", "shop"), host("a-v1", "shop"), host("all", "shop"), host("b", "shop"), host("a", "other")} {
			out[h] = len(r.Endpoints(h)) > 0
		}
		return out
	}
	lastHosts := func() []string {
		ev := rec.all()
		return slices.Sorted(maps.Keys(ev[len(ev)-1].Hosts))
	}

	r.SetWorkload(&model.Workload{Name: "w", Namespace: "shop", Labels: map[string]string{"app": "a", "version": "v1"}, IPs: []string{"10.0.0.1"}})
	assert.ElementsMatch(t, []string{host("a", "shop"), host("a-v1", "shop"), host("all", "shop")}, lastHosts())
	assert.Equal(t, map[string]bool{host("a", "shop"): true, host("a-v1", "shop"): true, host("all", "shop"): true,
		host("b", "shop"): false, host("a", "other"): false}, has())

	r.SetWorkload(&model.Workload{Name: "w", Namespace: "shop", Labels: map[string]string{"app": "b"}, IPs: []string{"10.0.0.1"}})
	assert.ElementsMatch(t, []string{host("a", "shop"), host("a-v1", "shop"), host("all", "shop"), host("b", "shop")}, lastHosts())
	assert.Equal(t, map[string]bool{host("a", "shop"): false, host("a-v1", "shop"): false, host("all", "shop"): true,
		host("b", "shop"): true, host("a", "other"): false}, has())

	r.DeleteWorkload("shop", "w")
	assert.ElementsMatch(t, []string{host("all", "shop"), host("b", "shop")}, lastHosts())
	assert.Equal(t, map[string]bool{host("a", "shop"): false, host("a-v1", "shop"): false, host("all", "shop"): false,
		host("b", "shop"): false, host("a", "other"): false}, has())
}

// SetConfigs with the unchanged configs' pointers (what the sources pass) keeps those
// entries' services and endpoints, auto-registered workloads included, and still follows a
// WorkloadEntry change in the namespace of an entry that selects workloads.
func TestUnchangedEntriesKeepTheirEndpoints(t *testing.T) {
	r, rec, _ := newRegistry(t)
	se := func(name, ns, rest string) string {
		return "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: " + name + ", namespace: " + ns + "}\n" +
			"spec: {hosts: [" + name + "." + ns + ".svc.cluster.local], resolution: STATIC, ports: [{number: 80, name: http}], " + rest + "}\n---\n"
	}
	we := func(name, ns, app, addr string) string {
		return "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: " + name + ", namespace: " + ns + "}\n" +
			"spec: {address: " + addr + ", labels: {app: " + app + "}}\n---\n"
	}
	host := func(name, ns string) string { return name + "." + ns + ".svc.cluster.local" }
	base := parse(t, se("a", "shop", "workloadSelector: {labels: {app: a}}")+se("s", "shop", "endpoints: [{address: 10.9.9.9}]")+
		se("c", "other", "workloadSelector: {labels: {app: c}}")+we("c1", "other", "c", "10.2.0.1"))
	vm1 := parse(t, we("vm1", "shop", "a", "10.1.0.1"))
	r.SetConfigs(append(slices.Clone(base), vm1...))
	r.SetWorkload(&model.Workload{Name: "w", Namespace: "shop", Labels: map[string]string{"app": "a"}, IPs: []string{"10.0.0.1"}})
	want := map[string][]string{
		host("a", "shop"): {"10.0.0.1:80@80", "10.1.0.1:80@80"}, host("s", "shop"): {"10.9.9.9:80@80"}, host("c", "other"): {"10.2.0.1:80@80"},
	}
	got := func() map[string][]string {
		out := map[string][]string{}
		for h := range want {
			out[h] = addrs(r.Endpoints(h))
			slices.Sort(out[h])
		}
		return out
	}
	require.Equal(t, want, got())

	// An unrelated new entry: only its host changes.
	extra := parse(t, se("new", "third", "endpoints: [{address: 10.3.0.1}]"))
	r.SetConfigs(slices.Concat(base, vm1, extra))
	assert.Equal(t, want, got())
	ev := rec.all()
	assert.Equal(t, []string{host("new", "third")}, slices.Sorted(maps.Keys(ev[len(ev)-1].Hosts)))

	// A changed WorkloadEntry in shop: a follows it, the workload stays.
	r.SetConfigs(slices.Concat(base, parse(t, we("vm1", "shop", "a", "10.1.0.2")), extra))
	want[host("a", "shop")] = []string{"10.0.0.1:80@80", "10.1.0.2:80@80"}
	assert.Equal(t, want, got())

	// A new WorkloadEntry in other: c follows it.
	r.SetConfigs(slices.Concat(base, parse(t, we("vm1", "shop", "a", "10.1.0.2")+we("c2", "other", "c", "10.2.0.2")), extra))
	want[host("c", "other")] = []string{"10.2.0.1:80@80", "10.2.0.2:80@80"}
	assert.Equal(t, want, got())
}

// SetConfigs keeps the entries of unchanged configs, and with them what they own and the
// workload-selector index of their namespace: a host changes hands when its first owner
// goes, and a namespace whose entries come and go has its index rebuilt while others keep
// theirs.
func TestKeptEntriesFollowOwnershipAndSelectorIndex(t *testing.T) {
	r, _, _ := newRegistry(t)
	se := func(name, ns, rest string) []*config.Config {
		return parse(t, "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: "+name+", namespace: "+ns+"}\n"+
			"spec: {resolution: STATIC, ports: [{number: 80, name: http}], "+rest+"}\n")
	}
	first := se("a", "shop", "hosts: [h.example], endpoints: [{address: 10.0.0.1}]")
	second := se("b", "shop", "hosts: [h.example], endpoints: [{address: 10.0.0.2}]")
	c := se("c", "shop", "hosts: [c.shop.svc.cluster.local], workloadSelector: {labels: {app: c}}")
	d := se("d", "shop", "hosts: [d.shop.svc.cluster.local], workloadSelector: {labels: {app: d}}")
	e := se("e", "shop", "hosts: [e.shop.svc.cluster.local], workloadSelector: {labels: {app: c}}")
	f := se("f", "other", "hosts: [f.other.svc.cluster.local], workloadSelector: {labels: {app: f}}")
	eps := func(host string) []string { return addrs(r.Endpoints(host)) }

	r.SetConfigs(slices.Concat(first, second, c, d, f))
	assert.Equal(t, []string{"10.0.0.1:80@80"}, eps("h.example"), "the first entry owns the host")
	r.SetConfigs(slices.Concat(second, c, d, f))
	assert.Equal(t, []string{"10.0.0.2:80@80"}, eps("h.example"), "the kept second entry takes it over")
	earlier := se("0a", "shop", "hosts: [h.example], endpoints: [{address: 10.0.0.3}]")
	r.SetConfigs(slices.Concat(earlier, second, c, d, f))
	assert.Equal(t, []string{"10.0.0.3:80@80"}, eps("h.example"), "a new entry before it takes it from the kept one")
	r.SetConfigs(slices.Concat(second, c, d, f))

	r.SetConfigs(slices.Concat(second, c, e, f)) // d goes, e comes: shop's index is rebuilt
	r.SetWorkload(&model.Workload{Name: "w", Namespace: "shop", Labels: map[string]string{"app": "c"}, IPs: []string{"10.1.0.1"}})
	r.SetWorkload(&model.Workload{Name: "v", Namespace: "other", Labels: map[string]string{"app": "f"}, IPs: []string{"10.2.0.1"}})
	assert.Equal(t, []string{"10.1.0.1:80@80"}, eps("c.shop.svc.cluster.local"))
	assert.Equal(t, []string{"10.1.0.1:80@80"}, eps("e.shop.svc.cluster.local"), "the new entry is in its namespace's index")
	assert.Empty(t, eps("d.shop.svc.cluster.local"))
	assert.Equal(t, []string{"10.2.0.1:80@80"}, eps("f.other.svc.cluster.local"), "an unchanged namespace keeps its index")
}

// Changes applied by key (Apply, as the mesh state calls it with a source's event) leave the registry
// as one built from scratch on the same configs, and every host whose service or endpoints
// differ from before is in the change's event: a random walk over ServiceEntries sharing
// hosts (the first by namespace/name owns one), selecting WorkloadEntries and
// auto-registered workloads, DNS entries, and removals.
func TestIncrementalChangesMatchARegistryBuiltFromScratch(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	namespaces := []string{"a", "b"}
	pick := func(list []string) string { return list[rng.IntN(len(list))] }
	se := func(ns, name string) *config.Config {
		hosts := []string{"h" + strconv.Itoa(rng.IntN(6)) + ".example"}
		if rng.IntN(3) == 0 {
			hosts = append(hosts, "h"+strconv.Itoa(rng.IntN(6))+".example")
		}
		rest := "endpoints: [{address: 10.9." + strconv.Itoa(rng.IntN(9)) + ".1}]"
		switch rng.IntN(4) {
		case 0, 1:
			rest = "workloadSelector: {labels: {app: " + pick([]string{"x", "z"}) + "}}"
		case 2:
			rest = "resolution: DNS"
		}
		if !strings.Contains(rest, "DNS") {
			rest += ", resolution: STATIC"
		}
		return parse(t, "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: "+name+", namespace: "+ns+"}\n"+
			"spec: {hosts: ["+strings.Join(hosts, ", ")+"], ports: [{number: "+pick([]string{"80", "81"})+", name: http}], "+rest+"}\n")[0]
	}
	we := func(ns, name string) *config.Config {
		return parse(t, "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: "+name+", namespace: "+ns+"}\n"+
			"spec: {address: 10.1."+strconv.Itoa(rng.IntN(9))+".1, labels: {app: "+pick([]string{"x", "z"})+"}}\n")[0]
	}
	hosts := func(r *ServiceEntries) map[string]string {
		out := map[string]string{}
		for i := range 6 {
			h := "h" + strconv.Itoa(i) + ".example"
			desc := ""
			for _, s := range r.Services() {
				if s.Hostname == h {
					desc = s.Source + " " + itoa(s.Ports[0].Port)
				}
			}
			out[h] = desc + " " + strings.Join(addrs(r.Endpoints(h)), ",")
		}
		return out
	}

	r, rec, _ := newRegistry(t)
	inForce := map[config.Key]*config.Config{}
	r.SetWorkload(&model.Workload{Name: "w", Namespace: "a", Labels: map[string]string{"app": "x"}, IPs: []string{"10.2.0.1"}})
	for step := range 300 {
		before, events := hosts(r), len(rec.all())
		changed := map[config.Key]struct{}{}
		for range 1 + rng.IntN(3) {
			ns, name := pick(namespaces), "c"+strconv.Itoa(rng.IntN(5))
			c := se(ns, name)
			if rng.IntN(2) == 0 {
				c = we(ns, name)
			}
			if rng.IntN(4) == 0 {
				delete(inForce, c.Key())
			} else {
				inForce[c.Key()] = c
			}
			changed[c.Key()] = struct{}{}
		}
		changes := make(map[config.Key]*config.Config, len(changed))
		for k := range changed {
			changes[k] = inForce[k]
		}
		r.Apply(changes)

		fresh, _, _ := newRegistry(t)
		fresh.SetWorkload(&model.Workload{Name: "w", Namespace: "a", Labels: map[string]string{"app": "x"}, IPs: []string{"10.2.0.1"}})
		fresh.SetConfigs(slices.Collect(maps.Values(inForce)))
		after := hosts(r)
		require.Equal(t, hosts(fresh), after, "step %d", step)
		var reported map[string]struct{}
		if ev := rec.all(); len(ev) > events {
			require.Len(t, ev, events+1, "step %d: one event per change", step)
			reported = ev[events].Hosts
		}
		for h := range after {
			if after[h] != before[h] {
				assert.Contains(t, reported, h, "step %d: %s changed from %q to %q", step, h, before[h], after[h])
			}
		}
	}
}

// workloadsInto is the sink that hands the workloads auto-registration publishes to a
// registry, as the mesh state does.
type workloadsInto struct{ r *ServiceEntries }

func (w workloadsInto) Configs(string, source.ConfigEvent)     {}
func (w workloadsInto) Services(string, source.ServiceEvent)   {}
func (w workloadsInto) Endpoints(string, source.EndpointEvent) {}
func (w workloadsInto) Synced(string)                          {}
func (w workloadsInto) Workloads(_ string, ev source.WorkloadEvent) {
	for _, wl := range ev.Updated {
		w.r.SetWorkload(wl)
	}
	for _, k := range ev.Deleted {
		ns, name, _ := strings.Cut(k, "/")
		w.r.DeleteWorkload(ns, name)
	}
}
