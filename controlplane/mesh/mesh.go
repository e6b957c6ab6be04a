// Package mesh loads Istio's MeshConfig from a YAML file, fills Istio's defaults, and watches
// the file so a change reaches the proxies as a full push. A bad file keeps the last good
// mesh config in force.
package mesh

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshconfig "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"
)

// Default returns Istio's defaults for the fields the control plane reads.
func Default() *meshconfig.MeshConfig {
	return &meshconfig.MeshConfig{
		ConnectTimeout:           durationpb.New(10 * time.Second),
		ProtocolDetectionTimeout: durationpb.New(0),
		RootNamespace:            "istio-system",
		TrustDomain:              "cluster.local",
		EnableTracing:            false,
		AccessLogFile:            "",
		OutboundTrafficPolicy:    &meshconfig.MeshConfig_OutboundTrafficPolicy{Mode: meshconfig.MeshConfig_OutboundTrafficPolicy_ALLOW_ANY},
		DefaultConfig: &meshconfig.ProxyConfig{
			ConfigPath:               "./etc/istio/proxy",
			DiscoveryAddress:         "istiod.istio-system.svc:15010", // discovery's plaintext xDS, as the agent's default
			DrainDuration:            durationpb.New(45 * time.Second),
			TerminationDrainDuration: durationpb.New(5 * time.Second),
			StatusPort:               15020,
			ProxyAdminPort:           15000,
		},
		// Locality load balancing is on unless a DestinationRule or the mesh turns it off; a
		// rule's outlier detection then makes endpoints fail over by locality.
		LocalityLbSetting:              &networking.LocalityLoadBalancerSetting{Enabled: wrapperspb.Bool(true)},
		DefaultServiceExportTo:         []string{"*"},
		DefaultVirtualServiceExportTo:  []string{"*"},
		DefaultDestinationRuleExportTo: []string{"*"},
	}
}

// Parse reads MeshConfig YAML over the defaults (fields present in the file win). Unknown
// fields are an error naming the file.
func Parse(name string, data []byte) (*meshconfig.MeshConfig, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: invalid YAML: %w", name, err)
	}
	m := Default()
	if len(js) == 0 || string(js) == "null" {
		return m, nil
	}
	var file meshconfig.MeshConfig
	if err := protojson.Unmarshal(js, &file); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	// Each field the file sets replaces the default wholesale: a merge would append to
	// repeated fields and could not express an enum's zero value (REGISTRY_ONLY).
	dst := m.ProtoReflect()
	file.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dst.Set(fd, v)
		return true
	})
	if file.GetDefaultConfig() != nil {
		dc := Default().GetDefaultConfig()
		proto.Merge(dc, file.GetDefaultConfig())
		m.DefaultConfig = dc
	}
	if m.GetConnectTimeout().AsDuration() <= 0 {
		return nil, fmt.Errorf("%s: connectTimeout: must be positive", name)
	}
	return m, nil
}

// Watcher holds the mesh config in force and reloads it when the file changes.
type Watcher struct {
	path string
	log  *slog.Logger

	mu       sync.RWMutex
	current  *meshconfig.MeshConfig
	lastErr  error
	handlers []func()
}

// NewWatcher loads path (an empty path means the defaults). The first load must succeed.
func NewWatcher(path string, log *slog.Logger) (*Watcher, error) {
	w := &Watcher{path: path, log: log.With("scope", "mesh"), current: Default()}
	if path == "" {
		return w, nil
	}
	m, err := load(path)
	if err != nil {
		return nil, err
	}
	w.current = m
	return w, nil
}

func load(path string) (*meshconfig.MeshConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("mesh config: %w", err)
	}
	return Parse(path, data)
}

// Mesh returns the mesh config in force; callers must not modify it.
func (w *Watcher) Mesh() *meshconfig.MeshConfig {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.current
}

// LastError is the error of the latest reload, nil when it applied.
func (w *Watcher) LastError() error {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.lastErr
}

// AddHandler registers f to run after a changed mesh config is applied. Register before Run.
func (w *Watcher) AddHandler(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handlers = append(w.handlers, f)
}

// Reload reads the file again; a bad file is logged and keeps the last good config.
func (w *Watcher) Reload() {
	if w.path == "" {
		return
	}
	m, err := load(w.path)
	w.mu.Lock()
	w.lastErr = err
	if err != nil {
		w.mu.Unlock()
		w.log.Error("mesh config rejected; keeping the last good one", "error", err)
		return
	}
	changed := !proto.Equal(m, w.current)
	if changed {
		w.current = m
	}
	handlers := append([]func(){}, w.handlers...)
	w.mu.Unlock()
	if changed {
		w.log.Info("mesh config changed", "file", w.path)
		for _, h := range handlers {
			h()
		}
	}
}

// Run watches the file's directory (so editors that replace the file are seen) until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	if w.path == "" {
		<-ctx.Done()
		return nil
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching mesh config: %w", err)
	}
	defer fw.Close()
	if err := fw.Add(filepath.Dir(w.path)); err != nil {
		return fmt.Errorf("watching mesh config: %w", err)
	}
	target := filepath.Clean(w.path)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return nil
			}
			// Kubernetes ConfigMaps swap a "..data" symlink, so any event in the directory counts.
			if filepath.Clean(ev.Name) == target || filepath.Base(ev.Name) == "..data" {
				w.Reload()
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return nil
			}
			w.log.Error("watch error", "error", err)
		}
	}
}
