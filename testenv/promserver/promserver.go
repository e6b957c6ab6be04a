// Package promserver runs a real Prometheus server (Debian's `prometheus`, 2.42 here) for
// the local mesh, scraping it as Istio's Prometheus add-on scrapes a cluster: each pod's
// merged page (the agent's :15020/stats/prometheus, which carries the proxy's istio_*
// series and the agent's own) under the job "kubernetes-pods" with the pod's namespace, name
// and app/version labels, and discovery's /metrics under the job "pilot", as istiod's
// :15014 is. Pods come and go, so their targets are a file_sd file that SetPods rewrites;
// Prometheus reads it again on change.
package promserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/wasmesh/wasmesh/testenv/internal/httpget"
)

// Options configure a server.
type Options struct {
	// Binary is the prometheus executable; default "prometheus" from PATH.
	Binary string
	// Dir holds the configuration, the targets file, the TSDB and the log.
	Dir string
	// Discovery is discovery's HTTP address (host:port) serving /metrics.
	Discovery string
	// ScrapeInterval defaults to 5s (Istio's add-on scrapes every 15s; the local mesh is
	// small and a user watches it live).
	ScrapeInterval time.Duration
	// Env is added to the process's minimal environment (PATH, HOME).
	Env []string
}

// Target is one pod to scrape.
type Target struct {
	// Address is host:port of the pod's merged metrics page (/stats/prometheus).
	Address string
	// Namespace and Pod name the pod; Labels are its labels (app, version).
	Namespace, Pod string
	Labels         map[string]string
}

// Server is a running Prometheus.
type Server struct {
	opts Options
	addr string
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu      sync.Mutex
	written string // the targets file's last content
}

// Find returns the prometheus binary: bin when set, else from PATH.
func Find(bin string) (string, error) {
	if bin == "" {
		bin = "prometheus"
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("prometheus not found (%v): `make tools` installs Debian's prometheus", err)
	}
	return p, nil
}

// Start writes the configuration and starts Prometheus on a free loopback port; it returns
// once the server answers ready. Close stops it.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := Find(opts.Binary)
	if err != nil {
		return nil, err
	}
	if opts.ScrapeInterval <= 0 {
		opts.ScrapeInterval = 5 * time.Second
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, done: make(chan struct{})}
	if err := s.SetPods(nil); err != nil {
		return nil, err
	}
	cfg := filepath.Join(opts.Dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(s.config()), 0o644); err != nil {
		return nil, err
	}
	// The port is picked free and may be taken before Prometheus binds it: try again.
	for attempt := 1; ; attempt++ {
		err := s.start(ctx, bin, cfg)
		if err == nil {
			return s, nil
		}
		if attempt == 3 || !errors.Is(err, errExitedAtStart) {
			return nil, err
		}
		s.done = make(chan struct{})
	}
}

var errExitedAtStart = errors.New("prometheus exited at start")

// start runs the process on a free port and waits until it is ready.
func (s *Server) start(ctx context.Context, bin, cfg string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	logf, err := os.OpenFile(filepath.Join(s.opts.Dir, "prometheus.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	s.cmd = exec.Command(bin, "--config.file="+cfg, "--web.listen-address="+s.addr,
		"--storage.tsdb.path="+filepath.Join(s.opts.Dir, "data"), "--storage.tsdb.retention.time=1d")
	s.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, s.opts.Env...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// Its own process group, killed with the process that started it: a runner killed
	// outright leaves no Prometheus behind.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", bin, err)
	}
	done := s.done
	go func() {
		s.err = s.cmd.Wait()
		logf.Close()
		close(done)
	}()
	if err := s.waitReady(ctx); err != nil {
		s.Close()
		return err
	}
	return nil
}

// config is the scrape configuration: Istio's add-on jobs, with static and file-based
// discovery standing in for Kubernetes service discovery.
func (s *Server) config() string {
	iv := s.opts.ScrapeInterval.String()
	var b strings.Builder
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  evaluation_interval: %s\nscrape_configs:\n", iv, iv)
	b.WriteString("- job_name: kubernetes-pods\n  metrics_path: /stats/prometheus\n")
	fmt.Fprintf(&b, "  file_sd_configs:\n  - files: [%q]\n    refresh_interval: 1s\n", s.targetsFile())
	if s.opts.Discovery != "" {
		b.WriteString("- job_name: pilot\n  metrics_path: /metrics\n")
		fmt.Fprintf(&b, "  static_configs:\n  - targets: [%q]\n    labels: {app: istiod, namespace: istio-system}\n", s.opts.Discovery)
	}
	return b.String()
}

func (s *Server) targetsFile() string { return filepath.Join(s.opts.Dir, "pods.json") }

// SetPods replaces the pods scraped. The file is replaced whole (rename), as file_sd
// requires, and only when it changes.
func (s *Server) SetPods(targets []Target) error {
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	groups := make([]group, 0, len(targets))
	for _, t := range targets {
		labels := map[string]string{"namespace": t.Namespace, "pod": t.Pod}
		for k, v := range t.Labels {
			if _, taken := labels[k]; !taken && validLabelName(k) {
				labels[k] = v
			}
		}
		groups = append(groups, group{Targets: []string{t.Address}, Labels: labels})
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].Targets[0] < groups[j].Targets[0] })
	b, err := json.MarshalIndent(groups, "", "  ")
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if string(b) == s.written {
		return nil
	}
	tmp := s.targetsFile() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.targetsFile()); err != nil {
		return err
	}
	s.written = string(b)
	return nil
}

// validLabelName says whether a Kubernetes label key is a Prometheus label name as it is
// (app, version); others (app.kubernetes.io/name) are left out rather than mangled.
func validLabelName(k string) bool {
	for i, c := range k {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return k != ""
}

// URL is the server's address, for a browser or the HTTP API.
func (s *Server) URL() string { return "http://" + s.addr }

// waitReady polls /-/ready until it answers 200, the process exits or ctx ends.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := get(ctx, s.URL()+"/-/ready", nil); err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("%w (%v); see %s", errExitedAtStart, s.err, filepath.Join(s.opts.Dir, "prometheus.log"))
		case <-ctx.Done():
			return fmt.Errorf("prometheus not ready on %s: %w", s.addr, ctx.Err())
		case <-tick.C:
		}
	}
}

// Follow keeps the scraped pods equal to what pods returns, checked every interval, until
// ctx ends.
func (s *Server) Follow(ctx context.Context, interval time.Duration, pods func() []Target) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		_ = s.SetPods(pods()) // a failed write is tried again at the next tick
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close stops the server (SIGTERM, then SIGKILL after 10 s).
func (s *Server) Close() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Sample is one series of an instant vector.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Query evaluates expr now through the HTTP API (/api/v1/query) and returns its instant
// vector (a scalar comes back as one sample without labels).
func (s *Server) Query(ctx context.Context, expr string) ([]Sample, error) {
	var resp struct {
		Status    string `json:"status"`
		Error     string `json:"error"`
		ErrorType string `json:"errorType"`
		Data      struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := get(ctx, s.URL()+"/api/v1/query?query="+url.QueryEscape(expr), &resp); err != nil && resp.Status == "" {
		return nil, err
	}
	if resp.Status != "success" {
		return nil, fmt.Errorf("query %q: %s: %s", expr, resp.ErrorType, resp.Error)
	}
	return decodeResult(resp.Data.ResultType, resp.Data.Result)
}

func decodeResult(kind string, raw json.RawMessage) ([]Sample, error) {
	parse := func(v [2]any) (float64, error) {
		str, _ := v[1].(string)
		return strconv.ParseFloat(str, 64)
	}
	switch kind {
	case "vector":
		var vec []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(raw, &vec); err != nil {
			return nil, err
		}
		out := make([]Sample, 0, len(vec))
		for _, e := range vec {
			f, err := parse(e.Value)
			if err != nil {
				return nil, err
			}
			out = append(out, Sample{Labels: e.Metric, Value: f})
		}
		return out, nil
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, err
		}
		f, err := parse(v)
		return []Sample{{Value: f}}, err
	}
	return nil, fmt.Errorf("result type %q is not an instant vector", kind)
}

// ActiveTargets returns the scrape targets' health by job (/api/v1/targets): "up" or the
// last scrape's error, keyed by scrape URL.
func (s *Server) ActiveTargets(ctx context.Context) (map[string]string, error) {
	var resp struct {
		Data struct {
			ActiveTargets []struct {
				ScrapeURL string `json:"scrapeUrl"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := get(ctx, s.URL()+"/api/v1/targets", &resp); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, t := range resp.Data.ActiveTargets {
		out[t.ScrapeURL] = t.Health
		if t.LastError != "" {
			out[t.ScrapeURL] = t.Health + ": " + t.LastError
		}
	}
	return out, nil
}

// get GETs u and decodes a JSON body into v (if not nil), also with an error status: the
// API explains its errors in the body.
func get(ctx context.Context, u string, v any) error {
	body, err := httpget.Get(ctx, u)
	if v != nil && len(body) > 0 {
		if jerr := json.Unmarshal(body, v); jerr != nil && err == nil {
			return fmt.Errorf("GET %s: %w", u, jerr)
		}
	}
	return err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// CheckMetrics runs `promtool check metrics` (from the same Debian package as prometheus)
// on a metrics page and returns what it reports, one finding per line ("<name> <problem>");
// empty when the page is clean. A page promtool cannot parse is an error.
func CheckMetrics(ctx context.Context, page []byte) (string, error) {
	bin, err := exec.LookPath("promtool")
	if err != nil {
		return "", fmt.Errorf("promtool not found (%v): `make tools` installs Debian's prometheus", err)
	}
	cmd := exec.CommandContext(ctx, bin, "check", "metrics")
	cmd.Stdin = strings.NewReader(string(page))
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return "", nil
	case errors.As(err, &exit) && exit.ExitCode() == 3: // lint findings
		return stdout.String() + stderr.String(), nil
	}
	return "", fmt.Errorf("promtool check metrics: %v: %s", err, strings.TrimSpace(stderr.String()))
}
