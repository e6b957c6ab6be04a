package xds_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// generated is what a proxy receives from a snapshot, every type, by type and name.
type generated map[string]*xds.Resource

func generateAll(snap *xds.Snapshot, p *model.Proxy) generated {
	out := generated{}
	for typ, rs := range xds.Dump(xds.CachedView(snap, p, xds.Shape(p))) {
		for _, r := range rs.Items {
			out[xds.ShortType(typ)+" "+r.Name] = r
		}
	}
	return out
}

// differences names what got and want disagree on, with both messages.
func differences(got, want generated) []string {
	var out []string
	for k, w := range want {
		g := got[k]
		switch {
		case g == nil:
			out = append(out, "missing "+k)
		case g.Hash != w.Hash:
			out = append(out, fmt.Sprintf("%s:\n got %s\nwant %s", k, protojson.Format(g.Message), protojson.Format(w.Message)))
		}
	}
	for k := range got {
		if want[k] == nil {
			out = append(out, "extra "+k)
		}
	}
	slices.Sort(out)
	return out
}

// A run of ServiceEntry changes, each pushed as the server pushes it (endpoints-only or
// services-only snapshots derived from the one before), leaves every proxy of every golden
// case receiving exactly what a snapshot built from scratch for it alone gives it, while
// the resources of unchanged hosts are the ones generated before the change (inherited, not
// generated again); earlier snapshots keep generating what they did.
func TestDerivedSnapshotsGenerateWhatAFreshBuildDoes(t *testing.T) {
	for ci, dir := range goldenCases(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			f := loadCase(t, dir)
			rng := rand.New(rand.NewPCG(uint64(ci), 7))
			configs := map[config.Key]*config.Config{}
			for _, cfg := range f.configs {
				configs[cfg.Key()] = cfg
			}
			original := map[config.Key]*config.Config{}
			for _, cfg := range f.configs {
				if cfg.Kind == config.ServiceEntry {
					original[cfg.Key()] = cfg
				}
			}
			// Services beyond the case's, so that a change of one or two hosts is small
			// enough to be derived rather than built anew; some land in the case's namespace.
			for i := range 40 {
				ns := "fill"
				if i%4 == 0 {
					ns = "shop"
				}
				cfg := seConfig(fmt.Sprintf("fill-%d", i), ns, fmt.Sprintf("10.8.0.%d", i))
				original[cfg.Key()] = cfg
				configs[cfg.Key()] = cfg
			}
			keys := slices.SortedFunc(maps.Keys(original), func(a, b config.Key) int { return strings.Compare(a.String(), b.String()) })
			ev := registry.Event{Hosts: map[string]struct{}{}}
			f.reg.AddHandler(func(e registry.Event) {
				ev.Full = ev.Full || e.Full
				for h := range e.Hosts {
					ev.Hosts[h] = struct{}{}
				}
			})
			list := func() []*config.Config {
				out := slices.Collect(maps.Values(configs))
				slices.SortFunc(out, func(a, b *config.Config) int { return strings.Compare(a.Key().String(), b.Key().String()) })
				return out
			}
			f.reg.SetConfigs(list())
			agg := registry.NewAggregate(f.reg)
			snap := f.build("v0", list(), agg)
			type moment struct {
				snap *xds.Snapshot
				want []generated
			}
			var history []moment
			before := make([]generated, len(f.proxies))
			for i, p := range f.proxies {
				before[i] = generateAll(snap, p)
			}
			shared, derived := 0, 0
			for step := range 30 {
				ev = registry.Event{Hosts: map[string]struct{}{}}
				changed := map[config.Key]struct{}{}
				for range 1 + rng.IntN(2) {
					k := keys[rng.IntN(len(keys))]
					changed[k] = struct{}{}
					configs[k] = changeServiceEntry(rng, configs[k], original[k])
					if configs[k] == nil {
						delete(configs, k)
					}
				}
				changes := make(map[config.Key]*config.Config, len(changed))
				for k := range changed {
					changes[k] = configs[k]
				}
				f.reg.Apply(changes)
				full := ev.Full
				for h := range ev.Hosts {
					if svc := snap.Service(h); svc != nil && svc.Resolution != model.ClientSideLB {
						full = true // as the server: DNS endpoints live in their clusters
					}
				}
				version := fmt.Sprintf("v%d", step+1)
				// A services-only change small enough to be derived (not built anew).
				servicesOnly := full && len(ev.Hosts) <= len(snap.Services)/16
				if full {
					snap = snap.WithServices(version, config.NewIndex(list()), agg, ev.Hosts)
				} else {
					snap = snap.WithEndpoints(version, agg, ev.Hosts)
				}
				m := moment{snap: snap}
				for i, p := range f.proxies {
					// A snapshot of its own: what the chain shares between proxies must not
					// leak from one to another either.
					want := generateAll(f.build("fresh", list(), agg), p)
					got := generateAll(snap, p)
					require.Empty(t, differences(got, want), "step %d (%v), proxy %s", step, ev.Hosts, p.ID)
					m.want = append(m.want, got)
					for k, r := range got {
						if old := before[i][k]; servicesOnly && old != nil && (strings.HasPrefix(k, "cds outbound|") || strings.HasPrefix(k, "eds ")) {
							derived++
							if old == r {
								shared++
							}
						}
					}
					before[i] = got
				}
				history = append(history, m)
				for _, h := range history {
					for i, p := range f.proxies {
						require.Empty(t, differences(generateAll(h.snap, p), h.want[i]), "snapshot %s changed later, proxy %s", h.snap.Version, p.ID)
					}
				}
			}
			// Most outbound clusters and assignments belong to hosts a services-only step did
			// not change.
			t.Logf("%d of %d resources shared", shared, derived)
			assert.Greater(t, shared, derived*3/4, "resources of unchanged hosts generated again")
		})
	}
}

// seConfig is a static ServiceEntry with one endpoint, as the parser would make it.
func seConfig(name, ns, addr string) *config.Config {
	return &config.Config{
		Meta: config.Meta{Kind: config.ServiceEntry, Group: "networking.istio.io", Version: "v1", Name: name, Namespace: ns},
		Spec: &networking.ServiceEntry{
			Hosts:      []string{name + "." + ns + ".svc.cluster.local"},
			Location:   networking.ServiceEntry_MESH_INTERNAL,
			Resolution: networking.ServiceEntry_STATIC,
			Ports:      []*networking.ServicePort{{Number: 80, Name: "http", Protocol: "HTTP"}},
			Endpoints:  []*networking.WorkloadEntry{{Address: addr, Labels: map[string]string{"version": "v1"}}},
		},
	}
}

// changeServiceEntry returns the next state of a ServiceEntry (nil: removed): back to its
// original, removed, or with an endpoint added or dropped, a port's target changed.
func changeServiceEntry(rng *rand.Rand, cur, original *config.Config) *config.Config {
	if cur == nil {
		return original
	}
	spec := proto.Clone(cur.Spec).(*networking.ServiceEntry)
	switch rng.IntN(5) {
	case 0:
		return nil
	case 1:
		return original
	case 2:
		labels := map[string]string{"version": []string{"v1", "v2"}[rng.IntN(2)]}
		spec.Endpoints = append(spec.Endpoints, &networking.WorkloadEntry{Address: fmt.Sprintf("10.9.%d.%d", rng.IntN(200), rng.IntN(200)), Labels: labels})
	case 3:
		if len(spec.Endpoints) > 1 {
			spec.Endpoints = spec.Endpoints[1:]
		} else {
			return original
		}
	case 4:
		if len(spec.Ports) > 0 && spec.Resolution != networking.ServiceEntry_DNS_ROUND_ROBIN {
			spec.Ports[0].TargetPort = 9000 + uint32(rng.IntN(50))
		} else {
			return nil
		}
	}
	next := *cur
	next.Spec = spec
	return &next
}
