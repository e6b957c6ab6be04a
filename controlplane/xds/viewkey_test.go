package xds_test

import (
	"path/filepath"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// variants are copies of p that differ in what a pod of the same workload differs in: its
// address (and name), its locality, its localhost.
func variants(p *model.Proxy) []*model.Proxy {
	ip := *p
	ip.ID, ip.Name, ip.IPAddresses = p.ID+"-other", p.Name+"-other", []string{"10.254.0.9"}
	loc := *p
	loc.Locality = &core.Locality{Region: "elsewhere", Zone: "z9"}
	out := []*model.Proxy{&ip, &loc}
	if p.Localhost != "" {
		lh := *p
		lh.Localhost = "127.0.0.99"
		out = append(out, &lh)
	}
	return out
}

// Proxies share what was generated for another with the same view key (the server generates
// LDS, CDS and RDS once per key and snapshot). For every golden case, every proxy and pods
// of its workload that differ in address, locality or localhost, what the shared snapshot
// gives each equals what a snapshot built for it alone gives it: the key holds everything the
// resources depend on.
func TestProxiesSharingAViewKeyGetWhatTheyWouldAlone(t *testing.T) {
	for _, dir := range goldenCases(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			f := loadCase(t, dir)
			var all []*model.Proxy
			for _, p := range f.proxies {
				all = append(all, p)
				all = append(all, variants(p)...)
			}
			for _, p := range all {
				fresh := f.build("fresh", f.configs, registry.NewAggregate(f.reg))
				assert.Empty(t, differences(generateAll(f.snap, p), generateAll(fresh, p)), "proxy %s (locality %v, localhost %s)", p.ID, p.Locality, p.Localhost)
			}
		})
	}
}

// Pods of one workload under a Sidecar share their listeners and clusters across addresses
// and localities (no rule in the case balances by locality): they are generated once. A pod
// whose Sidecar forwards to its own address (defaultEndpoint 0.0.0.0) gets its own.
func TestPodsOfAScopedWorkloadShareTheirResources(t *testing.T) {
	f := loadCase(t, "testdata/sidecar-scope")
	byApp := map[string]*model.Proxy{}
	for _, p := range f.proxies {
		byApp[p.Labels["app"]] = p
	}
	client, edge := byApp["client"], byApp["edge"]
	require.NotNil(t, client)
	require.NotNil(t, edge)
	view := func(p *model.Proxy) *xds.View { return xds.CachedView(f.snap, p, xds.Shape(p)) }
	for _, other := range variants(client) {
		assert.Same(t, xds.Clusters(view(client)), xds.Clusters(view(other)), "clusters of %s (locality %v)", other.ID, other.Locality)
		assert.Same(t, xds.Listeners(view(client)), xds.Listeners(view(other)), "listeners of %s (locality %v)", other.ID, other.Locality)
	}
	other := variants(edge)[0]
	require.NotEqual(t, edge.IP(), other.IP())
	assert.NotSame(t, xds.Clusters(view(edge)), xds.Clusters(view(other)), "a pod whose ingress forwards to its own address")
}
