// Command meshrun-k8s runs the local mesh on a real Kubernetes control plane (what `make
// run-k8s` does): etcd, kube-apiserver, kube-controller-manager and kube-scheduler, one node
// that runs pods as processes, discovery installed from its manifests (two replicas), the
// bookinfo sample as Deployments and Services with sidecars, and steady traffic; then it
// prints where to look and a live summary until Ctrl-C, which stops everything. It runs
// itself in a network namespace of its own, where the pod network is local (see package
// kubemesh).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/wasmesh/wasmesh/testenv/internal/meshrunner"
	"github.com/wasmesh/wasmesh/testenv/kubemesh"
	"github.com/wasmesh/wasmesh/testenv/loadgen"
)

func main() {
	if !kubemesh.InNetns() {
		code, err := kubemesh.RunInNetns()
		if err != nil {
			fmt.Fprintln(os.Stderr, "meshrun-k8s:", err)
			os.Exit(1)
		}
		os.Exit(code)
	}
	if err := kubemesh.SetUpNetns(); err != nil {
		fmt.Fprintln(os.Stderr, "meshrun-k8s: setting up the network namespace:", err)
		os.Exit(1)
	}
	if err := command().Execute(); err != nil {
		os.Exit(1)
	}
}

func command() *cobra.Command {
	var (
		opts     kubemesh.Options
		rate     float64
		interval time.Duration
		once     bool
	)
	cmd := &cobra.Command{
		Use:          "meshrun-k8s",
		Short:        "Run the local mesh on a real Kubernetes control plane with the sample application and steady traffic",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd.OutOrStdout(), opts, rate, interval, once)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Dir, "dir", "build/mesh-k8s", "where the cluster, the node's pods, their logs and the applied manifests are kept")
	f.StringVar(&opts.BinDir, "bin", "bin", "directory of the built binaries")
	f.StringVar(&opts.WasmDir, "wasm", "build/wasm", "directory of the built filters")
	f.StringVar(&opts.KubeBinDir, "kubeBin", os.Getenv("WASMESH_KUBE_BIN_DIR"), "directory of kube-apiserver, etcd, ... (make kube-bin)")
	f.StringVar(&opts.SampleDir, "config", "testenv/samples/bookinfo", "sample config directory (Istio YAML, templates with {{.WasmDir}}; its ServiceEntries are replaced by Services)")
	f.Float64Var(&rate, "rate", 20, "requests per second sent to the front end")
	f.DurationVar(&interval, "interval", 2*time.Second, "how often the live summary is printed")
	f.BoolVar(&once, "once", false, "print the summary once after the first requests, then stop (a smoke test)")
	return cmd
}

func run(out io.Writer, opts kubemesh.Options, rate float64, interval time.Duration, once bool) error {
	ctx, stop, err := meshrunner.Setup(&opts.Dir, &opts.BinDir, &opts.WasmDir, &opts.SampleDir)
	if err != nil {
		return err
	}
	defer stop()
	opts.Logf = func(format string, args ...any) { fmt.Fprintf(out, "  "+format+"\n", args...) }
	fmt.Fprintln(out, "starting the Kubernetes control plane, a node, and discovery (2 replicas)")
	begin := time.Now()
	m, err := kubemesh.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(out, "stopping: the node's pods, the control plane")
		m.Close()
		fmt.Fprintln(out, "stopped; logs are in", filepath.Join(m.Dir(), "node", "pods"), "and", filepath.Join(m.Dir(), "cluster"))
	}()
	s, err := m.Sample()
	if err != nil {
		return err
	}
	applied := time.Now()
	if err := m.ApplySample(ctx, s); err != nil {
		return err
	}
	first, err := m.WaitFirstRequest(ctx, 3*time.Minute)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nthe mesh is up: first successful request through it %v after the sample was applied (%v after start)\n\n",
		first.Sub(applied).Round(time.Millisecond), first.Sub(begin).Round(time.Millisecond))
	frontURL := m.FrontURL(ctx, "/")
	load, err := meshrunner.StartLoad(ctx, frontURL, rate)
	if err != nil {
		return err
	}
	printGuide(out, m, frontURL)
	meshrunner.Summarize(ctx, out, load, interval, once, func(prev, cur loadgen.Result) { printSummary(ctx, out, m, prev, cur) })
	return nil
}

func printGuide(out io.Writer, m *kubemesh.Mesh, frontURL string) {
	// The mesh lives in this process's network namespace: reach it from a shell with nsenter.
	enter := fmt.Sprintf("nsenter --net=/proc/%d/ns/net", os.Getpid())
	fmt.Fprintf(out, "kubectl:    %s %s --kubeconfig %s get pods -A\n", enter, m.KubectlPath(), m.Cluster.Kubeconfig)
	fmt.Fprintf(out, "front end:  %s curl %s\n", enter, frontURL)
	fmt.Fprintf(out, "discovery:  through %s (the istiod Service's xDS port); debug pages on each replica's pod IP, port 15014\n", m.XDS.Addr())
	fmt.Fprintf(out, "logs:       %s/<namespace>_<pod>_<uid>/logs/<container>/<run>.log\n", filepath.Join(m.Dir(), "node", "pods"))
	fmt.Fprintln(out, "\nCtrl-C stops everything.")
}

// printSummary prints one screen: the load over the last interval and each discovery
// replica (pod IP, readiness, leadership, restarts, proxies served).
func printSummary(ctx context.Context, out io.Writer, m *kubemesh.Mesh, prev, cur loadgen.Result) {
	fmt.Fprintf(out, "\n%s\n", meshrunner.LoadLine(prev, cur))
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	reps, err := m.Replicas(cctx)
	if err != nil {
		fmt.Fprintf(out, "  discovery: %v\n", err)
	}
	for _, r := range reps {
		fmt.Fprintf(out, "  discovery %-28s %-15s ready %-5v leading %-5v restarts %d  proxies %d\n",
			r.Pod, r.IP, r.Ready, r.Leader.Leading, r.Restarts, len(r.Proxies))
	}
}
