package envoyfilter

import (
	"slices"
	"strconv"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// ClusterContext is the patch context of a cluster: inbound for "inbound|..." and the inbound
// passthrough cluster, outbound for every other (as Istio builds them).
func ClusterContext(name string) networking.EnvoyFilter_PatchContext {
	if strings.HasPrefix(name, "inbound|") || name == "InboundPassthroughCluster" {
		return networking.EnvoyFilter_SIDECAR_INBOUND
	}
	return networking.EnvoyFilter_SIDECAR_OUTBOUND
}

// HasClusterPatches reports whether PatchCluster or Added(CLUSTER) can change anything.
func (s *Set) HasClusterPatches() bool { return s.Has(networking.EnvoyFilter_CLUSTER) }

// PatchCluster applies the set's REMOVE and MERGE cluster patches to c, which it modifies
// (pass a copy). hosts are the services an inbound cluster serves: a cluster match on service
// compares them, since an inbound cluster's name carries no host. It returns the cluster, or
// nil when a patch removed it, and the patches that were undone.
func (s *Set) PatchCluster(c *cluster.Cluster, hosts []string) (*cluster.Cluster, []*PatchError) {
	ctx := ClusterContext(c.GetName())
	st := &stepper{resource: "cluster " + c.GetName()}
	cur := proto.Message(c)
	for _, p := range s.patches[networking.EnvoyFilter_CLUSTER] {
		if p.Op == networking.EnvoyFilter_Patch_ADD || !contextMatches(p, ctx) || !clusterMatch(cur.(*cluster.Cluster), p, hosts) {
			continue
		}
		if p.Op == networking.EnvoyFilter_Patch_REMOVE {
			return nil, st.errs
		}
		cur = st.step(cur, p, func(m proto.Message) (bool, error) {
			return true, Merge(m, p.Value, p.Op == networking.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST)
		})
	}
	return cur.(*cluster.Cluster), st.errs
}

// clusterMatch is Istio's: an exact name, or the parts of "<direction>|<port>|<subset>|<host>".
func clusterMatch(c *cluster.Cluster, p *Patch, hosts []string) bool {
	m := p.Match.GetCluster()
	if m == nil {
		return true
	}
	if m.GetName() != "" {
		return m.GetName() == c.GetName()
	}
	parts := strings.Split(c.GetName(), "|")
	if len(parts) != 4 {
		// BlackHoleCluster and friends only match by name.
		return m.GetPortNumber() == 0 && m.GetSubset() == "" && m.GetService() == ""
	}
	port, _ := strconv.Atoi(parts[1])
	subset, host := parts[2], parts[3]
	matchHosts := []string{host}
	if parts[0] == "inbound" && len(hosts) > 0 {
		matchHosts = hosts
	}
	if m.GetSubset() != "" && m.GetSubset() != subset {
		return false
	}
	if m.GetService() != "" && !slices.Contains(matchHosts, m.GetService()) {
		return false
	}
	return m.GetPortNumber() == 0 || int(m.GetPortNumber()) == port
}

// ExtensionConfigs returns the extension configs the set's EXTENSION_CONFIG patches add, by
// name; when two patches add the same name, the later one (in application order) wins.
func (s *Set) ExtensionConfigs() map[string]*AddedResource {
	out := map[string]*AddedResource{}
	for _, p := range s.patches[networking.EnvoyFilter_EXTENSION_CONFIG] {
		tec := p.Value.(*core.TypedExtensionConfig)
		out[tec.GetName()] = &AddedResource{Patch: p, Value: tec}
	}
	return out
}
