package discovery

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/pusher"
	"github.com/wasmesh/wasmesh/controlplane/wasmfetch"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// extensions sets up the WasmPlugin module fetcher and the reporting of extension configs that
// could not be applied; it returns the config store the server reads, which hands out
// WasmPlugins with their modules' local paths.
func (d *Discovery) extensions(store pusher.ConfigStore) (pusher.ConfigStore, error) {
	dir := d.opts.WasmCacheDir
	if dir == "" {
		dir = defaultCacheDir()
	}
	f, err := wasmfetch.New(wasmfetch.Options{Dir: dir}, d.log.With("scope", "wasm"), d.Reg, func(keys []config.Key) {
		// A module became usable (or failed): push the plugins that use it.
		d.Pusher.ConfigUpdate(push.NewFull(push.ReasonConfig, keys...))
	})
	if err != nil {
		return nil, fmt.Errorf("wasmCacheDir: %w", err)
	}
	d.Modules = f
	d.Reg.MustRegister(&problemCollector{d: d})
	return wasmfetch.NewStore(store, f), nil
}

// defaultCacheDir is the user's cache directory's wasmesh/wasm, or one in the temporary
// directory where that cannot be created (no home directory).
func defaultCacheDir() string {
	if base, err := os.UserCacheDir(); err == nil {
		dir := filepath.Join(base, "wasmesh", "wasm")
		if os.MkdirAll(dir, 0o755) == nil {
			return dir
		}
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("wasmesh-wasm-%d", os.Getuid()))
}

// onSnapshot logs each configuration problem the first time it is found in a snapshot.
func (d *Discovery) onSnapshot(snap *xds.Snapshot) {
	xds.ReportTo(snap, func(p *xds.Problem) {
		args := []any{"config", p.Source.String(), "resource", p.Resource, "error", p.Message}
		if p.Patch >= 0 {
			args = append(args, "patch", p.Patch)
		}
		d.log.Warn("configuration not applied", append(args, "scope", "extensions")...)
	})
}

type extensionStatus struct {
	// NotApplied lists EnvoyFilter patches (with their index) and other extension configs that
	// could not be applied to a generated resource, which was sent without them.
	NotApplied  []*xds.Problem     `json:"notApplied"`
	WasmModules []wasmfetch.Status `json:"wasmModules"`
}

func (d *Discovery) extensionStatus() any {
	st := extensionStatus{NotApplied: []*xds.Problem{}, WasmModules: d.Modules.Status()}
	if snap := d.Pusher.Snapshot(); snap != nil {
		st.NotApplied = xds.Problems(snap)
	}
	return st
}

// problemCollector exports the current snapshot's problems as a gauge per config (and patch).
type problemCollector struct{ d *Discovery }

var problemDesc = prometheus.NewDesc("wasmesh_config_not_applied",
	"Generated resources an extension config (EnvoyFilter patch, WasmPlugin, Telemetry) could not be applied to, in the current push.",
	[]string{"kind", "namespace", "name", "patch"}, nil)

func (c *problemCollector) Describe(ch chan<- *prometheus.Desc) { ch <- problemDesc }

func (c *problemCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.d.Pusher.Snapshot()
	if snap == nil {
		return
	}
	type key struct {
		k     config.Key
		patch int
	}
	counts := map[key]int{}
	for _, p := range xds.Problems(snap) {
		counts[key{p.Source, p.Patch}]++
	}
	for k, n := range counts {
		patch := ""
		if k.patch >= 0 {
			patch = strconv.Itoa(k.patch)
		}
		ch <- prometheus.MustNewConstMetric(problemDesc, prometheus.GaugeValue, float64(n), string(k.k.Kind), k.k.Namespace, k.k.Name, patch)
	}
}
