package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/wasmfetch"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// Translate returns, with nothing served, what discovery built with opts would send the
// proxy that presents node: every xDS type with the names the proxy subscribes to (the EDS
// clusters of its CDS, the routes and extension configs of its LDS), each set sorted by
// name, as xds.Dump and /debug/config_dump give them. It runs discovery's own pipeline (the
// config directory and mesh config through meshstate and the registry, the WasmPlugin
// module fetcher, the pusher's snapshot, the generators) without listeners, Kubernetes, CA
// or webhooks, which opts' fields for those are cleared of. The proxy, and the other
// proxies connected (their nodes), are registered as workloads as when they connect (when
// their nodes carry workload metadata), healthy, as they are once their agents' first
// reports arrived. Translate returns once every WasmPlugin module is fetched or has failed
// and the snapshot in force includes that; ctx bounds the wait.
func Translate(ctx context.Context, opts Options, node *core.Node, log *slog.Logger, connected ...*core.Node) (map[string]*xds.Resources, error) {
	proxy, err := model.ParseNode(node)
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	var workloads []*model.Workload
	for _, n := range append([]*core.Node{node}, connected...) {
		p, err := model.ParseNode(n)
		if err != nil {
			return nil, fmt.Errorf("connected proxy: %w", err)
		}
		if w, ok := p.Workload(); ok {
			workloads = append(workloads, w)
		}
	}
	opts.GRPCAddr, opts.HTTPAddr = "", ""
	opts.Kube, opts.KubeStatus, opts.LeaderElection, opts.Sources = nil, false, false, nil
	opts.Webhook, opts.CA = WebhookOptions{}, CAOptions{}
	// Module fetches push again: a short quiet period ends the wait sooner.
	opts.Debounce = push.DebounceOptions{After: time.Millisecond, Max: 50 * time.Millisecond}
	d, err := New(opts, log)
	if err != nil {
		return nil, err
	}
	for _, w := range workloads {
		d.AutoReg.Connect(w, false)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	waitErr := d.waitTranslated(runCtx)
	var dump map[string]*xds.Resources
	if waitErr == nil {
		dump = xds.Dump(d.Pusher.View(proxy))
	}
	cancel()
	if err := <-done; err != nil {
		return nil, err
	}
	if waitErr != nil {
		return nil, waitErr
	}
	return dump, nil
}

// waitTranslated waits until the snapshot in force is the last one the config gives: the
// first is built, no module is still being fetched, no change waits to be pushed, and the
// snapshot stayed the same across two looks (a fetch's outcome is recorded just before its
// push is asked for).
func (d *Discovery) waitTranslated(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	last, stable := "", 0
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("configuration not translated in time (wasm modules still being fetched: %v): %w",
				pendingModules(d.Modules.Status()), ctx.Err())
		case <-tick.C:
		}
		snap := d.Pusher.Snapshot()
		if snap == nil || !d.Settled() || len(pendingModules(d.Modules.Status())) > 0 {
			stable = 0
			continue
		}
		if snap.Version == last {
			stable++
		} else {
			last, stable = snap.Version, 0
		}
		if stable >= 2 {
			return nil
		}
	}
}

// pendingModules lists the URLs of the modules not yet fetched (nor failed).
func pendingModules(st []wasmfetch.Status) []string {
	var out []string
	for _, m := range st {
		if m.State == wasmfetch.StatePending {
			out = append(out, m.URL)
		}
	}
	return out
}
