// Command meshrun starts the local mesh with the sample application (what `make run`
// does): discovery with the sample config directory, the rate-limit service and its Redis
// (with the sample's ratelimit.conf: the front end's global limit), the bookinfo pods as
// agent → proxy → echo on loopback, and steady traffic, then prints where to look and a
// live summary until Ctrl-C, which drains every pod and stops cleanly.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/wasmesh/wasmesh/testenv/internal/meshrunner"
	"github.com/wasmesh/wasmesh/testenv/loadgen"
	"github.com/wasmesh/wasmesh/testenv/localmesh"
	"github.com/wasmesh/wasmesh/testenv/meshview"
	"github.com/wasmesh/wasmesh/testenv/promserver"
)

func main() {
	if err := command().Execute(); err != nil {
		os.Exit(1)
	}
}

func command() *cobra.Command {
	var (
		opts     localmesh.Options
		rate     float64
		interval time.Duration
		once     bool
		prom     bool
		rl       bool
	)
	cmd := &cobra.Command{
		Use:          "meshrun",
		Short:        "Run the local mesh with the sample application and steady traffic",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rl {
				if err := readRateLimitConfig(&opts); err != nil {
					return err
				}
			}
			return run(cmd.OutOrStdout(), opts, rate, interval, once, prom)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.ConfigDir, "config", "testenv/samples/bookinfo", "sample config directory (Istio YAML, templates with {{.WasmDir}})")
	f.StringVar(&opts.Dir, "dir", "build/mesh", "where the running mesh keeps its config, pods and logs")
	f.StringVar(&opts.BinDir, "bin", "bin", "directory of the built binaries")
	f.StringVar(&opts.WasmDir, "wasm", "build/wasm", "directory of the built filters")
	f.StringVar(&opts.Proxy, "proxy", os.Getenv("MESH_PROXY"), "meshproxy (default) or envoy from PATH")
	f.Float64Var(&rate, "rate", 20, "requests per second sent to the front end")
	f.DurationVar(&interval, "interval", 2*time.Second, "how often the live summary is printed")
	f.BoolVar(&opts.Plaintext, "plaintext", false, "run without workload identity: no CA, plaintext xDS on loopback, plaintext between sidecars (default: mutual TLS, PERMISSIVE)")
	f.BoolVar(&prom, "prometheus", true, "run a Prometheus (Debian's prometheus from PATH) scraping every pod and discovery, as Istio's add-on does")
	f.BoolVar(&rl, "ratelimit", true, "run the rate-limit service (bin/ratelimit) and its Redis (redis-server from PATH) with the config directory's "+rateLimitConf+", the front end's global limit")
	f.BoolVar(&once, "once", false, "print the summary once after the first requests, then stop the mesh (a smoke test)")
	return cmd
}

func run(out io.Writer, opts localmesh.Options, rate float64, interval time.Duration, once, prom bool) error {
	begin := time.Now()
	ctx, stop, err := meshrunner.Setup(&opts.Dir, &opts.BinDir, &opts.WasmDir, &opts.ConfigDir)
	if err != nil {
		return err
	}
	defer stop()
	opts.Logf = func(format string, args ...any) { fmt.Fprintf(out, "  "+format+"\n", args...) }
	fmt.Fprintf(out, "starting the local mesh (proxy: %s)\n", or(opts.Proxy, "meshproxy"))
	fmt.Fprintf(out, "logs: %s (discovery), %s (each pod's agent, proxy and app)\n",
		filepath.Join(opts.Dir, "logs"), filepath.Join(opts.Dir, "pods", "<pod>", "logs"))
	m, err := localmesh.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(out, "stopping: every pod drains, then discovery stops")
		m.Close()
		fmt.Fprintln(out, "stopped; logs are in", filepath.Join(opts.Dir, "pods"), "and", filepath.Join(opts.Dir, "logs"))
	}()
	// Pods that need another service at start-up come after the others, which start together.
	var independent, dependent []localmesh.PodSpec
	for _, spec := range localmesh.Bookinfo() {
		if spec.StartupCall == "" {
			independent = append(independent, spec)
		} else {
			dependent = append(dependent, spec)
		}
	}
	for _, wave := range [][]localmesh.PodSpec{independent, dependent} {
		if _, err := m.AddPods(ctx, wave...); err != nil {
			return err
		}
	}
	var front *localmesh.Pod
	for _, p := range m.Pods() {
		if p.Spec.Labels["app"] == "productpage" {
			front = p
		}
	}
	frontURL := front.URL("/")
	var promServer *promserver.Server
	if prom {
		p, err := startPrometheus(ctx, m)
		if err != nil {
			return err
		}
		defer p.Close()
		promServer = p
	}
	pageURL, err := servePage(ctx, m, promServer)
	if err != nil {
		return err
	}
	load, err := meshrunner.StartLoad(ctx, frontURL, rate)
	if err != nil {
		return err
	}
	first := waitFirstSuccess(ctx, load)
	fmt.Fprintf(out, "\nthe mesh is up: first successful request through it %v after start\n\n", first.Sub(begin).Round(time.Millisecond))
	printGuide(out, m, frontURL, promServer, pageURL)

	meshrunner.Summarize(ctx, out, load, interval, once, func(prev, cur loadgen.Result) { printSummary(ctx, out, m, prev, cur) })
	return nil
}

// rateLimitConf is the rate-limit service's configuration in the sample config directory.
const rateLimitConf = "ratelimit.conf"

// readRateLimitConfig sets the mesh's rate-limit service configuration from the config
// directory's ratelimit.conf.
func readRateLimitConfig(opts *localmesh.Options) error {
	b, err := os.ReadFile(filepath.Join(opts.ConfigDir, rateLimitConf))
	if err != nil {
		return fmt.Errorf("the rate-limit service's configuration: %w (run with --ratelimit=false to go without)", err)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return fmt.Errorf("the rate-limit service counts in Redis: %w (`make tools` installs Debian's redis-server; run with --ratelimit=false to go without)", err)
	}
	opts.RateLimitConfig = string(b)
	return nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func waitFirstSuccess(ctx context.Context, g *loadgen.Generator) time.Time {
	for ctx.Err() == nil {
		if g.Snapshot().Succeeded > 0 {
			return time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Now()
}

// startPrometheus runs Prometheus beside the mesh, scraping the pods running at each moment.
func startPrometheus(ctx context.Context, m *localmesh.Mesh) (*promserver.Server, error) {
	p, err := promserver.Start(ctx, m.PrometheusOptions())
	if err != nil {
		return nil, fmt.Errorf("%w (run with --prometheus=false to go without)", err)
	}
	go p.Follow(ctx, time.Second, m.ScrapeTargets)
	return p, nil
}

// servePage serves the mesh page (package meshview) on a free loopback port until ctx ends.
func servePage(ctx context.Context, m *localmesh.Mesh, prom *promserver.Server) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: meshview.Handler(m.ViewSources(prom)), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return "http://" + l.Addr().String() + "/", nil
}

func printGuide(out io.Writer, m *localmesh.Mesh, frontURL string, prom *promserver.Server, pageURL string) {
	fmt.Fprintf(out, "front end:          curl %s\n", frontURL)
	fmt.Fprintf(out, "mesh page:          %s  (the graph, each proxy's sync state, rejected config; live)\n", pageURL)
	if prom != nil {
		fmt.Fprintf(out, "prometheus:         %s  (Istio's dashboards' queries work: istio_requests_total, istio_request_duration_milliseconds_bucket, pilot_*)\n", prom.URL())
	}
	fmt.Fprintf(out, "config (edit live): %s\n", m.ConfigDir())
	fmt.Fprintf(out, "discovery:          %s  %s  %s  %s\n", m.DiscoveryURL("/debug/syncz"), m.DiscoveryURL("/debug/configz"),
		m.DiscoveryURL("/debug/registryz"), m.DiscoveryURL("/metrics"))
	if rl := m.RateLimit(); rl != nil {
		fmt.Fprintf(out, "rate-limit service: gRPC %s as %s  metrics %s  config (edit live) %s  log %s\n",
			rl.GRPCAddr(), localmesh.RateLimitCluster, rl.MetricsURL("/metrics"), rl.ConfigFile(), rl.ServiceLog())
		fmt.Fprintf(out, "redis:              %s  (the rate-limit service's counters; log %s)\n", rl.RedisAddr(), rl.RedisLog())
		fmt.Fprintf(out, "global limit:       the front end's, shared by every caller and proxy (numbers in %s, edit live); a burst gets 429s:\n", rl.ConfigFile())
		fmt.Fprintf(out, "                    seq 600 | xargs -P 40 -I{} curl -s -o /dev/null -w '%%{http_code}\\n' %s | sort | uniq -c\n", frontURL)
	}
	for _, p := range m.Pods() {
		fmt.Fprintf(out, "pod %-22s metrics %s   admin %s\n", p.Spec.Name, p.StatusURL("/stats/prometheus"), p.AdminURL("/"))
	}
	fmt.Fprintln(out, "\nCtrl-C drains every pod and stops the mesh.")
}

// printSummary prints one screen: the load's rate and errors over the last interval, and
// the top istio_requests_total series of every pod by source, destination and code.
func printSummary(ctx context.Context, out io.Writer, m *localmesh.Mesh, prev, cur loadgen.Result) {
	fmt.Fprintf(out, "\n%s\n", meshrunner.LoadLine(prev, cur))
	type row struct {
		key   string
		value float64
	}
	var rows []row
	var frontMetrics []localmesh.Metrics
	for _, p := range m.Pods() {
		if !p.Running() {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		ms, err := p.Metrics(cctx)
		cancel()
		if err != nil {
			continue
		}
		if p.Spec.Labels["app"] == "productpage" {
			frontMetrics = append(frontMetrics, ms)
		}
		for _, s := range ms.Series("istio_requests_total", nil) {
			rows = append(rows, row{localmesh.Describe(s.Labels, "reporter", "source_workload", "destination_workload", "response_code"), s.Value})
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].value > rows[j].value })
	if len(rows) == 0 {
		fmt.Fprintln(out, "  (no istio_requests_total yet: the telemetry filter reports once requests complete)")
	}
	for i, r := range rows {
		if i == 8 {
			break
		}
		fmt.Fprintf(out, "  %8.0f  istio_requests_total%s\n", r.value, strings.TrimSpace(r.key))
	}
	printRateLimited(out, frontMetrics)
	printConfigProblems(ctx, out, m)
}

// printRateLimited prints the front end's 429s by its global limit: the quota filter's
// decisions (wasmesh_quota_global_requests_total) on the productpage proxies.
func printRateLimited(out io.Writer, ms []localmesh.Metrics) {
	if len(ms) == 0 {
		return
	}
	var denied, allowed, failOpen float64
	for _, m := range ms {
		denied += m.Sum("wasmesh_quota_global_requests_total", map[string]string{"decision": "denied"})
		allowed += m.Sum("wasmesh_quota_global_requests_total", map[string]string{"decision": "allowed"})
		failOpen += m.Sum("wasmesh_quota_global_failure_mode_allowed_total", nil)
	}
	fmt.Fprintf(out, "  %8.0f  429 by the front end's global rate limit (allowed %.0f, let through as the service failed or was too slow %.0f)\n",
		denied, allowed, failOpen)
}

// printConfigProblems lists the config documents discovery does not hold in force, with
// file, document and why, where the user is looking while editing the config directory.
func printConfigProblems(ctx context.Context, out io.Writer, m *localmesh.Mesh) {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	problems, err := m.ConfigProblems(cctx)
	if err != nil {
		fmt.Fprintf(out, "  config: cannot read discovery's /debug/configz: %v\n", err)
		return
	}
	for _, p := range problems {
		what := ""
		if p.Config != "" {
			what = " (" + p.Config + ")"
		}
		fmt.Fprintf(out, "  config %s: %s document %d%s: %s\n", p.Status, filepath.Join(m.ConfigDir(), p.File), p.Document, what, p.Error)
	}
}
