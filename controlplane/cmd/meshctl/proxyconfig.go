package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/wasmesh/wasmesh/controlplane/proxyconfig"
	"github.com/wasmesh/wasmesh/controlplane/proxystatus"
)

// proxyConfigFlags are what every proxy-config subcommand takes.
type proxyConfigFlags struct {
	discoveryFlags
	kube          kubeFlags
	admin, output string
}

// proxyConfigCommand is istioctl proxy-config: tables of a proxy's admin /config_dump.
func proxyConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "proxy-config",
		Aliases: []string{"pc"},
		Short:   "Print a proxy's clusters, listeners, routes, endpoints, secrets or bootstrap from its admin API",
		Long: `proxy-config reads a proxy's admin API (/config_dump, and /clusters for endpoints) and
prints it as istioctl does: a table, or with -o json / -o yaml the resources themselves.

The pod (<name>[.<namespace>], namespace default) is looked up in discovery
(--discoveryAddress): its proxy's admin is on its pod localhost, port 15000 (in the local
mesh each pod has its own loopback address). --admin gives the admin URL instead, and then
no pod is needed. On Kubernetes (--kubeconfig or --context given) the pod
(<name>[.<namespace>], else -n, else the context's namespace) is reached as istioctl
reaches it: a port-forward to its port 15000 through the API server (client-go's, SPDY),
opened for the command and closed after.`,
		Example: `  meshctl proxy-config clusters productpage-v1-1 --direction outbound --port 9080
  meshctl proxy-config listeners reviews-v1-1.default -o json
  meshctl proxy-config routes --admin http://localhost:15000
  meshctl proxy-config clusters reviews-v1-5d8f -n shop --kubeconfig ~/.kube/config`,
	}
	table := func(name string, aliases []string, short string, run func(*cobra.Command, *proxyconfig.Source, string) error) *cobra.Command {
		var f proxyConfigFlags
		sub := &cobra.Command{
			Use:               name + " [<pod>[.<namespace>]]",
			Aliases:           aliases,
			Short:             short,
			Args:              cobra.MaximumNArgs(1),
			ValidArgsFunction: f.completePods,
			RunE: func(cmd *cobra.Command, args []string) error {
				src, done, err := f.source(cmd.Context(), args)
				if err != nil {
					return err
				}
				defer done()
				return run(cmd, src, f.output)
			},
		}
		f.discoveryFlags.add(sub)
		f.kube.add(sub)
		sub.Flags().StringVar(&f.admin, "admin", "", "the proxy's admin URL (then no pod is needed)")
		def := "table"
		if name == "bootstrap" {
			def = "json" // istioctl's default for the bootstrap
		}
		sub.Flags().StringVarP(&f.output, "output", "o", def, "table, json or yaml")
		return sub
	}
	var cf proxyconfig.ClusterFilter
	clusters := table("clusters", []string{"cluster", "c"}, "The proxy's clusters: SERVICE FQDN, PORT, SUBSET, DIRECTION, TYPE, DESTINATION RULE",
		func(cmd *cobra.Command, src *proxyconfig.Source, out string) error {
			return src.Clusters(cmd.OutOrStdout(), out, cf)
		})
	clusters.Flags().StringVar(&cf.FQDN, "fqdn", "", "only clusters whose FQDN contains this")
	clusters.Flags().IntVar(&cf.Port, "port", 0, "only clusters of this port")
	clusters.Flags().StringVar(&cf.Subset, "subset", "", "only clusters of this subset")
	clusters.Flags().StringVar(&cf.Direction, "direction", "", "only inbound or outbound clusters")
	var lf proxyconfig.ListenerFilter
	listeners := table("listeners", []string{"listener", "l"}, "The proxy's listeners: ADDRESSES, PORT, MATCH, DESTINATION",
		func(cmd *cobra.Command, src *proxyconfig.Source, out string) error {
			return src.Listeners(cmd.OutOrStdout(), out, lf)
		})
	listeners.Flags().StringVar(&lf.Address, "address", "", "only listeners on this address")
	listeners.Flags().Uint32Var(&lf.Port, "port", 0, "only listeners on this port")
	listeners.Flags().StringVar(&lf.Type, "type", "", "only listeners of this type: HTTP, TCP or HTTP+TCP")
	var rname string
	routes := table("routes", []string{"route", "r"}, "The proxy's routes: NAME, VHOST NAME, DOMAINS, MATCH, VIRTUAL SERVICE",
		func(cmd *cobra.Command, src *proxyconfig.Source, out string) error {
			return src.Routes(cmd.OutOrStdout(), out, rname)
		})
	routes.Flags().StringVar(&rname, "name", "", "only the route configuration of this name")
	var ef proxyconfig.EndpointFilter
	endpoints := table("endpoints", []string{"endpoint", "ep"}, "The proxy's endpoints (/clusters): ENDPOINT, STATUS, OUTLIER CHECK, CLUSTER",
		func(cmd *cobra.Command, src *proxyconfig.Source, out string) error {
			return src.Endpoints(cmd.OutOrStdout(), out, ef)
		})
	endpoints.Flags().StringVar(&ef.Address, "address", "", "only endpoints of this address")
	endpoints.Flags().Uint32Var(&ef.Port, "port", 0, "only endpoints of this port")
	endpoints.Flags().StringVar(&ef.Cluster, "cluster", "", "only the endpoints of this cluster")
	endpoints.Flags().StringVar(&ef.Status, "status", "", "only endpoints of this health status: HEALTHY, UNHEALTHY, DRAINING, ...")
	secrets := table("secrets", []string{"secret", "s"}, "The proxy's SDS secrets: RESOURCE NAME, TYPE, STATUS, VALID CERT, SERIAL NUMBER, NOT AFTER, NOT BEFORE",
		func(cmd *cobra.Command, src *proxyconfig.Source, out string) error {
			return src.Secrets(cmd.OutOrStdout(), out, time.Now())
		})
	bootstrap := table("bootstrap", []string{"b"}, "The proxy's bootstrap (JSON by default, as istioctl; -o table for a summary)",
		func(cmd *cobra.Command, src *proxyconfig.Source, out string) error {
			return src.Bootstrap(cmd.OutOrStdout(), out)
		})
	cmd.AddCommand(clusters, listeners, routes, endpoints, secrets, bootstrap)
	return cmd
}

// source finds the admin: --admin, else on Kubernetes a port-forward to the pod's, else
// the pod's proxy as discovery reports it. done ends what it opened.
func (f *proxyConfigFlags) source(ctx context.Context, args []string) (src *proxyconfig.Source, done func(), err error) {
	done = func() {}
	if err := checkOutput(f.output, "table", "json", "yaml"); err != nil {
		return nil, done, err
	}
	if f.admin == "" && len(args) == 0 {
		return nil, done, fmt.Errorf("name a pod (<name>[.<namespace>]) or give --admin")
	}
	pod := ""
	if len(args) > 0 {
		pod = args[0]
	}
	url, done, err := adminAddress(ctx, f.admin, &f.kube, pod, func() (*proxystatus.Proxy, error) {
		proxies, err := f.proxies(ctx)
		if err != nil {
			return nil, err
		}
		found, err := proxystatus.Find(proxies, pod)
		return &found, err
	})
	if err != nil {
		return nil, done, err
	}
	return &proxyconfig.Source{Get: func(path string) ([]byte, error) {
		return proxystatus.Get(ctx, f.client(), url+path)
	}}, done, nil
}
