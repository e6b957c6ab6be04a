package xds

import (
	"fmt"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	wasmhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/telemetryapi"
	"github.com/wasmesh/wasmesh/controlplane/wasmplugin"
)

// The Telemetry API configures the telemetry filter wherever a proxy has it: the ECDS
// resource of a WasmPlugin whose module is telemetry.wasm (per direction when the overrides
// differ by mode), or a Wasm filter loading telemetry.wasm inline in a connection manager, as
// an EnvoyFilter inserts it (the listener's direction picks the overrides).

// telemetryOverlay is the Telemetry API's configuration for one proxy's telemetry filter;
// nil when no Telemetry applies.
type telemetryOverlay struct {
	o    *telemetryapi.Overlay
	snap *Snapshot
}

type telemetryKey struct{ ns, labels string }

func telemetryFor(snap *Snapshot, p *model.Proxy) *telemetryOverlay {
	k := telemetryKey{p.Namespace, model.SortedLabels(p.Labels)}
	return snap.full.telemetry.Get(k, func() *telemetryOverlay {
		o := telemetryapi.Build(snap.Mesh, telemetryapi.Select(snap.Configs, rootNamespace(snap), p.Namespace, p.Labels))
		if o == nil {
			return (*telemetryOverlay)(nil)
		}
		return &telemetryOverlay{o: o, snap: snap}
	})
}

// splits reports whether the configuration differs between inbound and outbound.
func (t *telemetryOverlay) splits() bool { return t != nil && t.o.Split() }

// key identifies the overlay of one direction ("" for none).
func (t *telemetryOverlay) key(inbound bool) string {
	if t == nil {
		return ""
	}
	return t.o.Key(inbound)
}

// inlineKey identifies the overlay for telemetry filters inline in listeners ("" for none).
func (t *telemetryOverlay) inlineKey() string {
	if t == nil {
		return ""
	}
	return t.o.Key(false) + "|" + t.o.Key(true)
}

// apply merges the overlay of a direction into a telemetry filter configuration, reporting
// the overrides it had to leave out.
func (t *telemetryOverlay) apply(cfg string, inbound bool, resource string) (string, error) {
	if t == nil {
		return cfg, nil
	}
	out, problems, err := t.o.Apply(cfg, inbound)
	for _, p := range problems {
		reportOf(t.snap).add(&Problem{Source: p.Source, Patch: -1, Resource: resource, Err: p.Err})
	}
	return out, err
}

// applyInline merges the overlay into the telemetry filters inline in a listener's
// connection managers. It reports whether it changed anything.
func (t *telemetryOverlay) applyInline(l *listener.Listener) (bool, error) {
	if t == nil {
		return false, nil
	}
	inbound := l.GetTrafficDirection() == core.TrafficDirection_INBOUND
	changed := false
	for _, fc := range allChains(l) {
		for _, f := range fc.GetFilters() {
			if f.GetName() != wellknown.HTTPConnectionManager || f.GetTypedConfig() == nil {
				continue
			}
			h := &hcm.HttpConnectionManager{}
			if err := f.GetTypedConfig().UnmarshalTo(h); err != nil {
				return false, err
			}
			hChanged := false
			for _, hf := range h.GetHttpFilters() {
				ok, err := t.applyToFilter(hf, inbound, "listener "+l.GetName())
				if err != nil {
					return false, fmt.Errorf("HTTP filter %s: %w", hf.GetName(), err)
				}
				hChanged = hChanged || ok
			}
			if hChanged {
				f.ConfigType = &listener.Filter_TypedConfig{TypedConfig: mustAny(h)}
				changed = true
			}
		}
	}
	return changed, nil
}

func (t *telemetryOverlay) applyToFilter(hf *hcm.HttpFilter, inbound bool, resource string) (bool, error) {
	tc := hf.GetTypedConfig()
	if tc == nil || tc.GetTypeUrl() != wasmplugin.WasmTypeURL {
		return false, nil
	}
	w := &wasmhttp.Wasm{}
	if err := tc.UnmarshalTo(w); err != nil {
		return false, err
	}
	code := w.GetConfig().GetVmConfig().GetCode()
	module := code.GetLocal().GetFilename()
	if module == "" {
		module = code.GetRemote().GetHttpUri().GetUri()
	}
	if !wasmplugin.IsTelemetryModule(module) {
		return false, nil
	}
	var cfg string
	if c := w.GetConfig().GetConfiguration(); c != nil {
		sv := &wrapperspb.StringValue{}
		if err := c.UnmarshalTo(sv); err != nil {
			return false, fmt.Errorf("telemetry filter configuration: want a StringValue holding JSON: %w", err)
		}
		cfg = sv.GetValue()
	}
	out, err := t.apply(cfg, inbound, resource)
	if err != nil {
		return false, err
	}
	if strings.TrimSpace(out) == strings.TrimSpace(cfg) {
		return false, nil
	}
	w.Config.Configuration = mustAny(wrapperspb.String(out))
	hf.ConfigType = &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(w)}
	return true, nil
}

// source names the Telemetry a problem comes from: the most specific one in effect.
func (t *telemetryOverlay) source() config.Key {
	if t == nil || len(t.o.Sources) == 0 {
		return config.Key{Kind: config.Telemetry}
	}
	return t.o.Sources[len(t.o.Sources)-1]
}
