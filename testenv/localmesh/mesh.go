// Package localmesh runs the mesh on one machine, on loopback only: discovery, and for each
// pod the sidecar trio a Kubernetes pod has (agent → proxy → application), with pod labels
// and annotations in downward-API files. There is no traffic capture (Istio's
// captureMode NONE): each pod has its own loopback pod IP, where the proxy's inbound
// listeners are, and its own private "localhost", where the application and the proxy's
// outbound listeners and admin are (docs/contracts.md). It is what `make run` starts and
// what the end-to-end tests build their meshes with.
package localmesh

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/wasmesh/wasmesh/testenv/internal/httpget"
	"github.com/wasmesh/wasmesh/testenv/meshview"
)

// Options configure a mesh.
type Options struct {
	// BinDir holds discovery, agent, meshproxy and echo; default $WASMESH_BIN_DIR.
	BinDir string
	// WasmDir holds the filters' .wasm; default $WASMESH_WASM_DIR. Config files can refer
	// to it as {{.WasmDir}}.
	WasmDir string
	// Dir is where the mesh keeps its config, pods and logs; default a new temp dir,
	// removed by Close.
	Dir string
	// Proxy is "meshproxy" (the default) or "envoy" (from PATH); default $MESH_PROXY.
	Proxy string
	// ConfigDir is copied into the mesh's config directory, each file rendered as a Go
	// template with {{.WasmDir}}; Config adds files by name.
	ConfigDir string
	Config    map[string]string
	// DiscoveryEnv is added to discovery's environment (PILOT_DEBOUNCE_AFTER, ...).
	DiscoveryEnv []string
	// Logf reports progress; nil is silent.
	Logf func(format string, args ...any)
	// Plaintext runs the mesh without workload identity: no CA, xDS in plaintext on
	// loopback, sidecars talking plaintext. By default discovery runs its CA and serves xDS
	// only over TLS, every pod gets a credential (identity.go) its agent shows for its
	// certificate and its xDS, and sidecars talk mutual TLS (mesh-wide PERMISSIVE, Istio's
	// default, so a client outside the mesh still reaches a pod).
	Plaintext bool
	// RateLimitConfig, when set, is the configuration (Envoy ratelimit's YAML) of a
	// rate-limit service the mesh runs with its own Redis, a mesh service at
	// RateLimitCluster (ratelimit.go).
	RateLimitConfig string
}

// Mesh is a running local mesh.
type Mesh struct {
	opts      Options
	ownDir    bool
	configDir string
	net       byte // second octet of every pod address
	netClaim  net.Listener
	grpcAddr  string
	httpAddr  string
	proxyBin  string
	identity  *identity // nil with Options.Plaintext

	mu        sync.Mutex
	discovery *Process
	pods      []*Pod
	podSeq    int
	rateLimit *RateLimit
}

// Start renders the config, starts discovery and waits until it is ready.
func Start(ctx context.Context, opts Options) (*Mesh, error) {
	if opts.BinDir == "" {
		opts.BinDir = os.Getenv("WASMESH_BIN_DIR")
	}
	if opts.WasmDir == "" {
		opts.WasmDir = os.Getenv("WASMESH_WASM_DIR")
	}
	if opts.Proxy == "" {
		opts.Proxy = os.Getenv("MESH_PROXY")
	}
	if opts.Proxy == "" {
		opts.Proxy = "meshproxy"
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	m := &Mesh{opts: opts}
	if err := m.findBinaries(); err != nil {
		return nil, err
	}
	if err := m.claimNet(); err != nil {
		return nil, err
	}
	if m.opts.Dir == "" {
		d, err := os.MkdirTemp("", "wasmesh-")
		if err != nil {
			return nil, err
		}
		m.opts.Dir, m.ownDir = d, true
	}
	m.configDir = filepath.Join(m.opts.Dir, "config")
	if err := os.MkdirAll(m.configDir, 0o755); err != nil {
		return nil, err
	}
	if err := m.renderConfig(); err != nil {
		m.Close()
		return nil, err
	}
	if m.opts.RateLimitConfig != "" {
		if err := m.startRateLimit(ctx); err != nil {
			m.Close()
			return nil, err
		}
	}
	if err := m.startDiscoveryOnFreePorts(ctx); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// pickPort is freePort; a variable for the test that takes a port before discovery binds it.
var pickPort = freePort

// startDiscoveryOnFreePorts starts discovery on ports the kernel had free. A port is free
// when it is picked and may be taken (as an outgoing connection's source port, by another
// mesh) before discovery binds it: then discovery says so and exits, and it is started
// again on other ports.
func (m *Mesh) startDiscoveryOnFreePorts(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		grpc, err := pickPort("127.0.0.1")
		if err != nil {
			return err
		}
		httpPort, err := pickPort("127.0.0.1")
		if err != nil {
			return err
		}
		m.grpcAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(grpc))
		m.httpAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort))
		if !m.opts.Plaintext {
			if m.identity, err = newIdentity(m.opts.Dir, m.grpcAddr); err != nil {
				return err
			}
		}
		err = m.StartDiscovery(ctx)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return err
		}
		m.opts.Logf("discovery's port was taken before it bound it; starting it again on others: %v", err)
	}
}

// netClaimPort is where a mesh holds a listener on 127.<net>.255.254, an address no pod
// gets, for as long as it runs: meshes running side by side (test packages run in parallel)
// then never share a pod address block, whose fixed proxy ports would collide.
var netClaimPort = 15999 // a variable for the test, which claims blocks on a port of its own

// netBlocks is how many second octets meshes pick from: 30 to 89 (pod IPs), their pods'
// localhost addresses 130 to 189.
const netBlocks = 60

// claimNet picks a free second octet for the mesh's pod addresses and claims it.
func (m *Mesh) claimNet() error {
	var err error
	first := rand.IntN(netBlocks)
	for i := range netBlocks {
		n := byte(30 + (first+i)%netBlocks)
		var l net.Listener
		if l, err = net.Listen("tcp", net.JoinHostPort(fmt.Sprintf("127.%d.255.254", n), strconv.Itoa(netClaimPort))); err == nil {
			m.net, m.netClaim = n, l
			return nil
		}
	}
	return fmt.Errorf("localmesh: no free pod address block 127.30-89.x.x: %w", err)
}

func (m *Mesh) findBinaries() error {
	if m.opts.BinDir == "" {
		return errors.New("localmesh: no binary directory: set WASMESH_BIN_DIR or run `make build`")
	}
	for _, b := range []string{"discovery", "agent", "echo"} {
		if _, err := os.Stat(filepath.Join(m.opts.BinDir, b)); err != nil {
			return fmt.Errorf("localmesh: %s is missing in %s (run `make build`): %w", b, m.opts.BinDir, err)
		}
	}
	switch m.opts.Proxy {
	case "meshproxy":
		m.proxyBin = filepath.Join(m.opts.BinDir, "meshproxy")
		if _, err := os.Stat(m.proxyBin); err != nil {
			return fmt.Errorf("localmesh: meshproxy is missing in %s (run `make build`): %w", m.opts.BinDir, err)
		}
	case "envoy":
		p, err := exec.LookPath("envoy")
		if err != nil {
			return fmt.Errorf("localmesh: MESH_PROXY=envoy but there is no envoy on PATH: %w", err)
		}
		m.proxyBin = p
	default:
		return fmt.Errorf("localmesh: proxy %q is neither meshproxy nor envoy", m.opts.Proxy)
	}
	return nil
}

// ProxyName is the proxy the pods run ("meshproxy" or "envoy").
func (m *Mesh) ProxyName() string { return m.opts.Proxy }

// Dir is the mesh's directory (config/, pods/, logs/).
func (m *Mesh) Dir() string { return m.opts.Dir }

// ConfigDir is the directory discovery watches.
func (m *Mesh) ConfigDir() string { return m.configDir }

// DiscoveryURL is the URL of path on discovery's debug HTTP server.
func (m *Mesh) DiscoveryURL(path string) string { return "http://" + m.httpAddr + path }

// DiscoveryAddress is discovery's xDS gRPC address: its TLS port (Istio's 15012, also the
// CA's), or with Options.Plaintext its loopback plaintext port.
func (m *Mesh) DiscoveryAddress() string { return m.grpcAddr }

func (m *Mesh) renderConfig() error {
	files := map[string]string{}
	if m.opts.ConfigDir != "" {
		entries, err := os.ReadDir(m.opts.ConfigDir)
		if err != nil {
			return fmt.Errorf("localmesh: config dir: %w", err)
		}
		for _, e := range entries {
			if e.IsDir() {
				continue
			}
			b, err := os.ReadFile(filepath.Join(m.opts.ConfigDir, e.Name()))
			if err != nil {
				return err
			}
			files[e.Name()] = string(b)
		}
	}
	for k, v := range m.opts.Config {
		files[k] = v
	}
	names := make([]string, 0, len(files))
	for k := range files {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := m.WriteConfig(n, files[n]); err != nil {
			return err
		}
	}
	return nil
}

// WriteConfig renders content (a Go template with {{.WasmDir}}) and replaces the config
// file name atomically, as an editor saving a file does; discovery picks it up.
func (m *Mesh) WriteConfig(name, content string) error {
	b, err := RenderConfig(name, content, m.opts.WasmDir)
	if err != nil {
		return err
	}
	tmp := filepath.Join(m.configDir, "."+name+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(m.configDir, name))
}

// RenderConfig renders the config file name's content, a Go template with {{.WasmDir}}
// (the sample config's templates).
func RenderConfig(name, content, wasmDir string) ([]byte, error) {
	t, err := template.New(name).Option("missingkey=error").Parse(content)
	if err != nil {
		return nil, fmt.Errorf("localmesh: config %s: %w", name, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, map[string]string{"WasmDir": wasmDir}); err != nil {
		return nil, fmt.Errorf("localmesh: config %s: %w", name, err)
	}
	return b.Bytes(), nil
}

// RemoveConfig deletes a config file.
func (m *Mesh) RemoveConfig(name string) error {
	return os.Remove(filepath.Join(m.configDir, name))
}

// StartDiscovery starts discovery (again, after StopDiscovery) and waits until it is ready.
func (m *Mesh) StartDiscovery(ctx context.Context) error {
	env := append([]string{"PILOT_DEBOUNCE_AFTER=100ms"}, m.opts.DiscoveryEnv...)
	args := []string{"--configDir", m.configDir, "--httpAddr", m.httpAddr,
		"--workloadEntryGracePeriod", "3s", "--wasmCacheDir", filepath.Join(m.opts.Dir, "wasm-cache")}
	if m.identity != nil {
		args = append(args, m.identity.discoveryArgs()...)
	} else {
		args = append(args, "--grpcAddr", m.grpcAddr, "--mtls=false")
	}
	p, err := m.startProcess("discovery", filepath.Join(m.opts.Dir, "logs"), filepath.Join(m.opts.BinDir, "discovery"), args, env)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.discovery = p
	m.mu.Unlock()
	if err := waitFor(ctx, p, "discovery to be ready", func() error { return httpOK(m.DiscoveryURL("/ready")) }); err != nil {
		return err
	}
	m.opts.Logf("discovery ready: xDS on %s, debug on http://%s", m.grpcAddr, m.httpAddr)
	return nil
}

// StopDiscovery stops discovery gracefully (its proxies keep their last config).
func (m *Mesh) StopDiscovery(ctx context.Context) error {
	m.mu.Lock()
	p := m.discovery
	m.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Stop(ctx)
}

// Pods returns the pods started so far, stopped ones included.
func (m *Mesh) Pods() []*Pod {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*Pod(nil), m.pods...)
}

// Close stops every pod and discovery, leaving no process behind, and removes the mesh's
// directory if Start made it. Pods stop callers first (stopOrder): a pod gets its SIGTERM
// once every pod that calls it has exited, so a client outside the mesh gets from the front
// end an answer or a refused connection, never a 5xx from a callee that left first.
func (m *Mesh) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, wave := range stopOrder(m.Pods()) {
		var wg sync.WaitGroup
		for _, p := range wave {
			wg.Add(1)
			go func() { defer wg.Done(); _ = p.Stop(ctx) }()
		}
		wg.Wait()
	}
	_ = m.StopDiscovery(ctx)
	m.stopRateLimit(ctx)
	if m.netClaim != nil {
		_ = m.netClaim.Close()
	}
	if m.ownDir && os.Getenv("WASMESH_KEEP_MESH_DIR") == "" {
		_ = os.RemoveAll(m.opts.Dir)
	}
}

// stopOrder puts pods in waves to stop one after the other: a wave holds the pods that no
// pod of a later wave calls (PodSpec.Calls and StartupCall, by service name and namespace).
// Pods that call each other round a cycle stop together.
func stopOrder(pods []*Pod) [][]*Pod {
	left := append([]*Pod(nil), pods...)
	var waves [][]*Pod
	for len(left) > 0 {
		var wave, rest []*Pod
		for _, p := range left {
			if calledByAnother(p, left) {
				rest = append(rest, p)
			} else {
				wave = append(wave, p)
			}
		}
		if len(wave) == 0 { // a cycle: stop what is left at once
			wave, rest = left, nil
		}
		waves = append(waves, wave)
		left = rest
	}
	return waves
}

func calledByAnother(p *Pod, pods []*Pod) bool {
	for _, caller := range pods {
		if caller != p && caller.calls(p) {
			return true
		}
	}
	return false
}

// calls reports whether p's application calls a service that callee serves: a call's host
// <service>[.<namespace>[...]] names the app label and namespace of the pods behind it.
func (p *Pod) calls(callee *Pod) bool {
	for _, raw := range append(append([]string(nil), p.Spec.Calls...), p.Spec.StartupCall) {
		u, err := url.Parse(raw)
		if raw == "" || err != nil {
			continue
		}
		labels := strings.Split(u.Hostname(), ".")
		ns := p.Spec.Namespace
		if len(labels) > 1 {
			ns = labels[1]
		}
		if labels[0] == callee.Spec.Labels["app"] && ns == callee.Spec.Namespace {
			return true
		}
	}
	return false
}

func httpOK(url string) error {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

func freePort(ip string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ConfigProblem is a config document discovery does not hold wholly in force, as
// /debug/configz reports it: rejected (with or without a last good version kept), ignored
// or partly applied, with the file, the document's position and why. The mesh page shows
// the same type.
type ConfigProblem = meshview.Rejected

// ConfigProblems reads discovery's /debug/configz for the documents not wholly in force.
func (m *Mesh) ConfigProblems(ctx context.Context) ([]ConfigProblem, error) {
	b, err := httpget.Get(ctx, m.DiscoveryURL("/debug/configz"))
	if err != nil {
		return nil, err
	}
	var page struct {
		Documents []ConfigProblem `json:"documents"`
	}
	if err := json.Unmarshal(b, &page); err != nil {
		return nil, fmt.Errorf("discovery /debug/configz: %w", err)
	}
	var out []ConfigProblem
	for _, d := range page.Documents {
		if d.Status != "applied" {
			out = append(out, d)
		}
	}
	return out, nil
}
