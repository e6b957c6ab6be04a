package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/wasmesh/wasmesh/controlplane/proxyconfig"
	"github.com/wasmesh/wasmesh/controlplane/proxystatus"
)

// discoveryFlags are how meshctl reaches discovery's debug HTTP port (--httpAddr, 15014).
type discoveryFlags struct {
	addrs   []string
	timeout time.Duration
}

func (f *discoveryFlags) add(cmd *cobra.Command) {
	def := []string{"127.0.0.1:15014"}
	if env := os.Getenv("WASMESH_DISCOVERY_ADDRESS"); env != "" {
		def = strings.Split(env, ",")
	}
	cmd.Flags().StringSliceVar(&f.addrs, "discoveryAddress", def,
		"discovery's debug HTTP address (host:port or URL; its --httpAddr); repeat or comma-separate for several replicas ($WASMESH_DISCOVERY_ADDRESS)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "how long each request may take")
}

func (f *discoveryFlags) client() *http.Client { return &http.Client{Timeout: f.timeout} }

func (f *discoveryFlags) proxies(ctx context.Context) ([]proxystatus.Proxy, error) {
	return proxystatus.Fetch(ctx, f.client(), f.addrs)
}

// completePods offers the pods connected to discovery, for shell completion.
func (f *discoveryFlags) completePods(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ps, err := f.proxies(cmd.Context())
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var out []string
	for _, p := range ps {
		out = append(out, p.Pod())
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func checkOutput(o string, allowed ...string) error {
	for _, a := range allowed {
		if o == a {
			return nil
		}
	}
	return fmt.Errorf("--output %q: want one of %s", o, strings.Join(allowed, ", "))
}

// proxyStatusCommand is istioctl proxy-status.
func proxyStatusCommand() *cobra.Command {
	var df discoveryFlags
	var kf kubeFlags
	var output, admin string
	cmd := &cobra.Command{
		Use:   "proxy-status [<pod>[.<namespace>]]",
		Short: "Every proxy connected to discovery and whether each xDS type is SYNCED, STALE or NOT SENT",
		Long: `proxy-status lists the proxies connected to discovery (read from each replica's
/debug/syncz; give --discoveryAddress once per replica, or comma-separated, and the tables
are merged) with the replica serving each, and per type (CDS, LDS, EDS, RDS, ECDS):

  SYNCED    the proxy acked the latest response discovery sent
  STALE     sent and not yet acked, or rejected: "STALE (NACK)", the proxy's error below
  NOT SENT  discovery sent nothing of that type (or the proxy did not ask for it)

On Kubernetes reach each discovery replica's port 15014 with a port-forward, e.g.
"kubectl -n istio-system port-forward pod/<istiod pod> 15014" (and 15015:15014 for the next
replica), then --discoveryAddress localhost:15014,localhost:15015.

With a pod, that proxy only, with the versions sent and acked per type, whether its own
admin /config_dump holds the versions acked, and whether it holds the resources discovery
generates for it (RESOURCES, by name). Its admin is found as for proxy-config (its pod
localhost, port 15000; --admin overrides; on Kubernetes, --kubeconfig or --context given,
a port-forward to the pod's port 15000 through the API server).`,
		Example: `  meshctl proxy-status --discoveryAddress 127.0.0.1:15014
  meshctl proxy-status --discoveryAddress 10.0.0.5:15014,10.0.0.6:15014 -o yaml
  meshctl proxy-status productpage-v1-1.default`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: df.completePods,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, "table", "json", "yaml"); err != nil {
				return err
			}
			proxies, err := df.proxies(cmd.Context())
			if err != nil {
				return err
			}
			if len(args) == 0 {
				rows := proxystatus.Rows(proxies)
				if output != "table" {
					return proxyconfig.WriteRaw(cmd.OutOrStdout(), output, rows)
				}
				return proxystatus.WriteTable(cmd.OutOrStdout(), rows)
			}
			return proxyStatusOf(cmd, &df, &kf, proxies, args[0], admin, output)
		},
	}
	df.add(cmd)
	kf.add(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table, json or yaml")
	cmd.Flags().StringVar(&admin, "admin", "", "the proxy's admin URL (default: http://<pod localhost>:15000, as discovery reports it)")
	return cmd
}

func proxyStatusOf(cmd *cobra.Command, df *discoveryFlags, kf *kubeFlags, proxies []proxystatus.Proxy, pod, admin, output string) error {
	p, err := proxystatus.Find(proxies, pod)
	if err != nil {
		return err
	}
	row := proxystatus.Rows([]proxystatus.Proxy{p})[0]
	url, done, err := adminAddress(cmd.Context(), admin, kf, pod, func() (*proxystatus.Proxy, error) { return &p, nil })
	defer done()
	if err == nil {
		var body []byte
		if body, err = proxystatus.Get(cmd.Context(), df.client(), url+"/config_dump?include_eds"); err == nil {
			var d *proxyconfig.Dump
			if d, err = proxyconfig.ParseDump(body); err == nil {
				row.Compare(d.Versions())
				var sent map[string][]string
				if sent, err = proxystatus.DiscoveryNames(cmd.Context(), df.client(), p); err == nil {
					row.CompareResources(sent, d.Names())
				}
			}
		}
	}
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "Warning: the proxy's own config is not compared: %v\n", err)
	}
	if output != "table" {
		return proxyconfig.WriteRaw(cmd.OutOrStdout(), output, row)
	}
	return proxystatus.WriteDetail(cmd.OutOrStdout(), row)
}

// adminPort is the proxy's admin port on its pod localhost (Envoy's, istio-proxy's 15000).
const adminPort = 15000

// adminAddress is the URL of a proxy's admin: --admin, else on Kubernetes (kube set) a
// port-forward to the pod's admin port, else the pod localhost discovery reports (lookup).
// done closes what it opened.
func adminAddress(ctx context.Context, admin string, kube *kubeFlags, pod string, lookup func() (*proxystatus.Proxy, error)) (url string, done func(), err error) {
	done = func() {}
	if admin == "" && kube.set() {
		addr, closer, err := kube.forward(ctx, pod, adminPort)
		if err != nil {
			return "", done, err
		}
		return "http://" + addr, closer, nil
	}
	var p *proxystatus.Proxy
	if admin == "" {
		if p, err = lookup(); err != nil {
			return "", done, err
		}
	}
	url, err = adminURL(admin, p)
	return url, done, err
}

// adminURL is --admin, else the admin of the proxy as discovery reports it: its pod
// localhost (WASMESH_LOCALHOST) on port 15000 (docs/contracts.md).
func adminURL(flag string, p *proxystatus.Proxy) (string, error) {
	if flag != "" {
		if !strings.HasPrefix(flag, "http://") && !strings.HasPrefix(flag, "https://") {
			flag = "http://" + flag
		}
		return strings.TrimSuffix(flag, "/"), nil
	}
	if p == nil || p.Localhost == "" {
		return "", fmt.Errorf("discovery does not say where the proxy's admin is: pass --admin")
	}
	return "http://" + net.JoinHostPort(p.Localhost, strconv.Itoa(adminPort)), nil
}
