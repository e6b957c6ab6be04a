package registry

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
)

// A ServiceEntry's workloadSelector becomes its services' selector (the proxies it serves
// inbound); an entry without one selects nothing, and an empty one selects every workload.
func TestServicesCarryTheirEntrysSelector(t *testing.T) {
	r, _, _ := newRegistry(t)
	r.SetConfigs(parse(t, entries+`---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: all, namespace: shop}
spec: {hosts: [all.shop.svc.cluster.local], resolution: STATIC, ports: [{number: 80, name: http}], workloadSelector: {}}
`))
	selectors := map[string]map[string]string{}
	for _, s := range r.Services() {
		selectors[s.Hostname] = s.WorkloadSelector
	}
	assert.Equal(t, map[string]map[string]string{"api.example.com": nil, "all.shop.svc.cluster.local": {},
		"reviews.shop.svc.cluster.local": {"app": "reviews"}}, selectors)
	assert.NotNil(t, selectors["all.shop.svc.cluster.local"], "empty, not absent")
}

// An empty workloadSelector selects every WorkloadEntry of its namespace; a workload with
// no address (a pod not yet scheduled) is no endpoint.
func TestEmptySelectorsAndWorkloadsWithoutAddress(t *testing.T) {
	r, _, _ := newRegistry(t)
	r.SetConfigs(parse(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: all, namespace: shop}
spec: {hosts: [all.shop.svc.cluster.local], resolution: STATIC, ports: [{number: 80, name: http}], workloadSelector: {}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm1, namespace: shop}
spec: {address: 10.0.0.1, labels: {app: a}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm2, namespace: shop}
spec: {address: 10.0.0.2}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: elsewhere, namespace: other}
spec: {address: 10.0.0.3}
`))
	const host = "all.shop.svc.cluster.local"
	assert.Equal(t, []string{"10.0.0.1:80@80", "10.0.0.2:80@80"}, addrs(r.Endpoints(host)))
	r.SetWorkload(&model.Workload{Name: "pending", Namespace: "shop", Labels: map[string]string{"app": "a"}})
	r.SetWorkload(&model.Workload{Name: "running", Namespace: "shop", IPs: []string{"10.0.0.4"}})
	assert.Equal(t, []string{"10.0.0.1:80@80", "10.0.0.2:80@80", "10.0.0.4:80@80"}, addrs(r.Endpoints(host)))
}

// A ServiceEntry whose hosts another entry, first by namespace and name, already defines
// is not in force for them: ignored when it holds none of its hosts, partly applied when it
// holds some; the reason names each host and its holder (/debug/configz).
func TestNotInForceNamesEachHostAndItsHolder(t *testing.T) {
	r, _, _ := newRegistry(t)
	se := func(name, hosts string) string {
		return "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: " + name + ", namespace: shop}\n" +
			"spec: {hosts: [" + hosts + "], resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: 10.0.0.1}]}\n---\n"
	}
	r.SetConfigs(parse(t, se("a", "x.example, y.example")+se("b", "y.example, z.example")+se("c", "x.example")+se("d", "w.example")))
	key := func(name string) config.Key {
		return config.Key{Kind: config.ServiceEntry, Namespace: "shop", Name: name}
	}
	got := r.NotInForce()
	assert.Equal(t, map[config.Key]NotInForce{
		key("b"): {Hosts: []HostHolder{{Host: "y.example", Holder: key("a")}}, Partly: true},
		key("c"): {Hosts: []HostHolder{{Host: "x.example", Holder: key("a")}}},
	}, got)
	assert.Equal(t, "partly applied", got[key("b")].Status())
	assert.Equal(t, "ignored", got[key("c")].Status())
	assert.Equal(t, "host y.example is already defined by "+key("a").String()+" (the first by namespace and name wins)", got[key("b")].Reason())

	r.SetConfigs(parse(t, se("b", "y.example, z.example")+se("c", "x.example, y.example")))
	got = r.NotInForce()
	assert.Equal(t, "host y.example is already defined by "+key("b").String()+" (the first by namespace and name wins)",
		got[key("c")].Reason(), "c holds x.example now")
	assert.Equal(t, "partly applied", got[key("c")].Status())
	assert.Len(t, got, 1)
}

// A registry whose configs and workloads all go keeps nothing of them: no service, no
// endpoint, and no index entry (hosts' definers, selectors, WorkloadEntries by label), so a
// long-running registry does not grow with what came and went.
func TestNothingIsLeftOfWhatWent(t *testing.T) {
	r, _, _ := newRegistry(t)
	r.SetConfigs(parse(t, entries+`---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: shared, namespace: other}
spec: {hosts: [api.example.com], resolution: STATIC, ports: [{number: 80, name: http}], workloadSelector: {labels: {app: x}}}
`))
	r.SetWorkload(&model.Workload{Name: "w", Namespace: "shop", Labels: map[string]string{"app": "reviews"}, IPs: []string{"10.1.0.1"}})
	require.NotEmpty(t, r.Endpoints("reviews.shop.svc.cluster.local"))
	r.DeleteWorkload("shop", "w")
	r.SetConfigs(nil)
	assert.Empty(t, r.Services())
	r.mu.RLock()
	defer r.mu.RUnlock()
	for name, n := range map[string]int{"configs": len(r.configs), "entries": len(r.entries), "definers": len(r.definers),
		"selecting": len(r.selecting), "wes": len(r.wes), "weByLabel": len(r.weByLabel), "services": len(r.services),
		"endpoints": len(r.endpoints)} {
		assert.Zero(t, n, name)
	}
	for ns, ws := range r.workloads {
		assert.Empty(t, ws, ns)
	}
}

// A workload stays registered while any of its connections is open (a proxy reconnecting
// opens the new stream before the old one is gone): closing one of two schedules no
// removal; closing the last does, after the grace period. The registered workloads are
// listed in key order.
func TestAWorkloadStaysWhileAnyConnectionIsOpen(t *testing.T) {
	r, _, m := newRegistry(t)
	r.SetConfigs(parse(t, entries))
	a := NewAutoRegistration(workloadsInto{r}, time.Hour, slog.New(slog.NewTextHandler(io.Discard, nil)), m)
	defer a.Close()
	w := &model.Workload{Name: "reviews-2", Namespace: "shop", Labels: map[string]string{"app": "reviews"}, IPs: []string{"127.10.0.2"}}
	other := &model.Workload{Name: "reviews-1", Namespace: "shop", Labels: map[string]string{"app": "reviews"}, IPs: []string{"127.10.0.1"}}
	a.Connect(w, false)
	a.Connect(other, false)
	a.Connect(w, false)
	var keys []string
	for _, wl := range r.Workloads() {
		keys = append(keys, wl.Key())
	}
	assert.Equal(t, []string{"shop/reviews-1", "shop/reviews-2"}, keys)

	a.Disconnect(w)
	a.mu.Lock()
	assert.Empty(t, a.timers, "one connection is still open")
	a.grace = 10 * time.Millisecond
	a.mu.Unlock()
	a.Disconnect(w)
	require.Eventually(t, func() bool { return len(r.Workloads()) == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, "shop/reviews-1", r.Workloads()[0].Key())
	a.Disconnect(w) // one disconnect too many changes nothing
	assert.Len(t, r.Workloads(), 1)
}

// Without endpoints or a workloadSelector, a DNS or DNS_ROUND_ROBIN ServiceEntry resolves its
// own hosts (an endpoint per host and port, addressed by the host name); a STATIC or NONE one
// has no endpoints.
func TestEntriesWithoutEndpointsResolveTheirHostsByDNS(t *testing.T) {
	r, _, _ := newRegistry(t)
	se := func(name, resolution string) string {
		return "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: " + name + ", namespace: shop}\n" +
			"spec: {hosts: [" + name + ".example], resolution: " + resolution + ", ports: [{number: 443, name: tls, protocol: TLS}]}\n---\n"
	}
	r.SetConfigs(parse(t, se("dns", "DNS")+se("rr", "DNS_ROUND_ROBIN")+se("static", "STATIC")+se("none", "NONE")))
	got := map[string][]string{}
	for _, s := range r.Services() {
		got[s.Hostname] = addrs(r.Endpoints(s.Hostname))
	}
	assert.Equal(t, map[string][]string{"dns.example": {"dns.example:443@443"}, "rr.example": {"rr.example:443@443"},
		"static.example": nil, "none.example": nil}, got)
}

// Two ServiceEntries defining one host are logged as a warning naming the winner (the first
// by namespace and name) and the ignored one, whichever came first.
func TestADuplicateHostWarningNamesWinnerAndIgnored(t *testing.T) {
	se := func(name string) string {
		return "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: " + name + ", namespace: shop}\n" +
			"spec: {hosts: [x.example], resolution: STATIC, ports: [{number: 80, name: http}]}\n"
	}
	for _, order := range [][]string{{"a", "b"}, {"b", "a"}} {
		t.Run(strings.Join(order, " then "), func(t *testing.T) {
			var log bytes.Buffer
			r := NewServiceEntries(slog.New(slog.NewJSONHandler(&log, nil)), metrics.New(prometheus.NewRegistry()))
			var cs []*config.Config
			for _, name := range order {
				cs = append(cs, parse(t, se(name))...)
				r.SetConfigs(cs)
			}
			var warnings [][2]string
			for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
				var rec struct{ Msg, Winner, Ignored string }
				require.NoError(t, json.Unmarshal([]byte(line), &rec))
				if strings.HasPrefix(rec.Msg, "host defined by two ServiceEntries") {
					warnings = append(warnings, [2]string{rec.Winner, rec.Ignored})
				}
			}
			assert.Equal(t, [][2]string{{"ServiceEntry shop/a", "ServiceEntry shop/b"}}, warnings)
		})
	}
}

// A disconnected proxy stays registered for Istio's PILOT_WORKLOAD_ENTRY_GRACE_PERIOD
// default, 10 s.
func TestDefaultGracePeriodIsIstios(t *testing.T) {
	assert.Equal(t, 10*time.Second, DefaultGracePeriod)
}
