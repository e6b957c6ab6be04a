package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	meshconfig "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/inject"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/podnode"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// experimentalCommand is istioctl's "x": commands whose interface may change.
func experimentalCommand() *cobra.Command {
	x := &cobra.Command{Use: "x", Aliases: []string{"experimental"}, Short: "Experimental commands"}
	x.AddCommand(translateCommand())
	return x
}

// translateTypes are the --type values, in the order a proxy receives them.
var translateTypes = []string{xds.ClusterType, xds.EndpointType, xds.ListenerType, xds.RouteType, xds.ExtensionType}

type translateFlags struct {
	proxy, meshConfig, typ, output, wasmCacheDir string
	workloads                                    []string
	mtls                                         bool
	timeout                                      time.Duration
}

func translateCommand() *cobra.Command {
	var fl translateFlags
	cmd := &cobra.Command{
		Use:   "translate CONFIG_DIR --proxy NODE_ID|BOOTSTRAP_JSON|POD_YAML",
		Short: "Print, offline, the xDS discovery would send a proxy for a config directory",
		Long: `translate runs discovery's own pipeline on a config directory (and mesh config), with no
server and no cluster, and prints what discovery would send one proxy: its clusters (cds),
the endpoints of those using EDS (eds), its listeners (lds), the route configurations they
name (rds) and the extension configs (ecds), each list sorted by name, so two configs' effect
on a proxy can be diffed in CI. The proxy is a node id (sidecar~IP~POD.NAMESPACE~NAMESPACE.svc.cluster.local),
a running proxy's bootstrap (its JSON, as "meshctl proxy-config bootstrap POD -o json"
prints it: the node with all its metadata, exactly what the proxy sends discovery), or a
Pod's YAML (with status.podIP): the sidecar injector's template and the pod give the
node's labels, namespace, service account, IP, ports and annotations as the agent would.
The proxy is registered as a workload as when it connects; --workload adds the sidecars
of other pods (a file of Pod YAML, or a proxy's bootstrap JSON; repeatable) as connected,
so they are endpoints too (and their service accounts the clusters' SANs).
WasmPlugin modules are fetched as discovery fetches them (into --wasmCacheDir).`,
		Example: `  meshctl x translate configs/ --proxy pod.yaml --type lds
  meshctl x translate configs/ --proxy sidecar~10.0.0.5~web-1.shop~shop.svc.cluster.local -o yaml
  meshctl proxy-config bootstrap web-1 -o json > web-1.json && meshctl x translate configs/ --proxy web-1.json
  meshctl x translate configs/ --proxy frontend-pod.yaml --workload backend-pods.yaml --type eds`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return translate(cmd, args[0], fl)
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.proxy, "proxy", "", "the proxy: its node id, or a file with its bootstrap's JSON or its Pod's YAML")
	f.StringArrayVar(&fl.workloads, "workload", nil, "a file of Pod YAML whose sidecars are connected too, or another proxy's bootstrap JSON (repeatable)")
	f.StringVar(&fl.meshConfig, "meshConfig", "", "mesh config YAML (default: wasmesh's defaults)")
	f.StringVar(&fl.typ, "type", "all", "what to print: cds, eds, lds, rds, ecds or all")
	f.StringVarP(&fl.output, "output", "o", "json", "output format: json or yaml")
	f.BoolVar(&fl.mtls, "mtls", true, "generate mutual TLS between workloads, as discovery's --mtls")
	f.StringVar(&fl.wasmCacheDir, "wasmCacheDir", "", "where fetched WasmPlugin modules are kept (discovery's default)")
	f.DurationVar(&fl.timeout, "timeout", time.Minute, "give up after this long (WasmPlugin modules fetched)")
	_ = cmd.MarkFlagRequired("proxy")
	return cmd
}

func translate(cmd *cobra.Command, dir string, fl translateFlags) error {
	types, err := selectTypes(fl.typ)
	if err != nil {
		return err
	}
	if fl.output != "json" && fl.output != "yaml" {
		return fmt.Errorf("--output %q: want json or yaml", fl.output)
	}
	m, err := meshConfig(fl.meshConfig)
	if err != nil {
		return err
	}
	node, err := proxyNode(fl.proxy, m)
	if err != nil {
		return err
	}
	others, err := workloadNodes(fl.workloads, m)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), fl.timeout)
	defer cancel()
	// Discovery's log says what it skipped (rejected documents, modules that failed).
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	dump, err := discovery.Translate(ctx, discovery.Options{ConfigDir: dir, MeshConfigFile: fl.meshConfig, MTLS: fl.mtls,
		WasmCacheDir: fl.wasmCacheDir}, node, log, others...)
	if err != nil {
		return err
	}
	return writeTranslation(cmd.OutOrStdout(), node.GetId(), dump, types, fl.output)
}

func selectTypes(s string) ([]string, error) {
	if s == "all" {
		return translateTypes, nil
	}
	for _, t := range translateTypes {
		if xds.ShortType(t) == s {
			return []string{t}, nil
		}
	}
	return nil, fmt.Errorf("--type %q: want cds, eds, lds, rds, ecds or all", s)
}

// meshConfig reads --meshConfig (defaults without one).
func meshConfig(file string) (*meshconfig.MeshConfig, error) {
	if file == "" {
		return mesh.Default(), nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return mesh.Parse(file, data)
}

// proxyNode reads --proxy: a file (an Envoy bootstrap's JSON, as `proxy-config bootstrap
// -o json` prints it, or a Pod's YAML), else a node id.
func proxyNode(proxy string, m *meshconfig.MeshConfig) (*core.Node, error) {
	data, err := os.ReadFile(proxy)
	if err != nil {
		if strings.Count(proxy, "~") == 3 {
			return &core.Node{Id: proxy}, nil
		}
		return nil, fmt.Errorf("--proxy %q: neither a node id (type~ip~pod.namespace~domain) nor a readable file: %w", proxy, err)
	}
	if node, ok, err := bootstrapNode(proxy, data); ok {
		return node, err
	}
	pod, err := podnode.ParsePod(proxy, data)
	if err != nil {
		return nil, err
	}
	return podnode.Node(inject.DefaultConfig(), m, pod)
}

// bootstrapNode reads the node of an Envoy bootstrap in JSON: the bootstrap itself
// ({"node": ...}) or an admin config_dump's bootstrap section ({"bootstrap": {"node":
// ...}}, what `proxy-config bootstrap -o json` prints). ok is false when data is not such
// JSON (a Pod's YAML, then).
func bootstrapNode(file string, data []byte) (*core.Node, bool, error) {
	var doc struct {
		Node      json.RawMessage `json:"node"`
		Bootstrap struct {
			Node json.RawMessage `json:"node"`
		} `json:"bootstrap"`
	}
	if json.Unmarshal(data, &doc) != nil {
		return nil, false, nil
	}
	raw := doc.Node
	if raw == nil {
		raw = doc.Bootstrap.Node
	}
	if raw == nil {
		return nil, false, nil
	}
	node := &core.Node{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(raw, node); err != nil {
		return nil, true, fmt.Errorf("--proxy %s: the bootstrap's node: %w", file, err)
	}
	if node.GetId() == "" {
		return nil, true, fmt.Errorf("--proxy %s: the bootstrap's node has no id", file)
	}
	return node, true, nil
}

// workloadNodes reads --workload files: the nodes of their pods' sidecars, or the node of
// a proxy's bootstrap.
func workloadNodes(files []string, m *meshconfig.MeshConfig) ([]*core.Node, error) {
	var out []*core.Node
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("--workload: %w", err)
		}
		if node, ok, err := bootstrapNode(f, data); ok {
			if err != nil {
				return nil, fmt.Errorf("--workload: %w", err)
			}
			out = append(out, node)
			continue
		}
		pods, err := podnode.ParsePods(f, data)
		if err != nil {
			return nil, fmt.Errorf("--workload: %w", err)
		}
		for _, pod := range pods {
			n, err := podnode.Node(inject.DefaultConfig(), m, pod)
			if err != nil {
				return nil, fmt.Errorf("--workload: %w", err)
			}
			out = append(out, n)
		}
	}
	return out, nil
}

// writeTranslation prints the resources of types, each as its Any's JSON (with @type),
// whitespace normalised so the output is the same from run to run.
func writeTranslation(w io.Writer, id string, dump map[string]*xds.Resources, types []string, output string) error {
	var b bytes.Buffer
	b.WriteString("{\n  \"proxy\": ")
	idJSON, _ := json.Marshal(id)
	b.Write(idJSON)
	for _, t := range types {
		fmt.Fprintf(&b, ",\n  %q: [", xds.ShortType(t))
		for i, r := range dump[t].Items {
			js, err := protojson.Marshal(r.Any)
			if err != nil {
				return fmt.Errorf("%s %s: %w", xds.ShortType(t), r.Name, err)
			}
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString("\n    ")
			var c bytes.Buffer
			if err := json.Compact(&c, js); err != nil {
				return err
			}
			b.Write(c.Bytes())
		}
		b.WriteString("]")
	}
	b.WriteString("\n}\n")
	out := b.Bytes()
	if output == "yaml" {
		y, err := yaml.JSONToYAML(out)
		if err != nil {
			return err
		}
		out = y
	} else {
		var ind bytes.Buffer
		if err := json.Indent(&ind, out, "", "  "); err != nil {
			return err
		}
		out = ind.Bytes()
	}
	_, err := w.Write(out)
	return err
}
