package upstream

import clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"

// builtinLBs are the load balancing policies the Manager knows, by lb_policy. A policy not
// listed here makes a cluster invalid (NACKed), as an Envoy without it would.
func builtinLBs() map[clusterv3.Cluster_LbPolicy]LBFactory {
	return map[clusterv3.Cluster_LbPolicy]LBFactory{
		clusterv3.Cluster_ROUND_ROBIN: newRoundRobin,
	}
}
