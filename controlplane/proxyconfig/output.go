package proxyconfig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"
)

// WriteRaw prints v (raw JSON, or a value to encode) as indented JSON or as YAML.
func WriteRaw(w io.Writer, format string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	switch format {
	case "json":
		if err := json.Indent(&out, b, "", "    "); err != nil {
			return err
		}
		out.WriteByte('\n')
	case "yaml":
		y, err := yaml.JSONToYAML(b)
		if err != nil {
			return err
		}
		out.Write(y)
	default:
		return fmt.Errorf("output format %q: want json or yaml", format)
	}
	_, err = w.Write(out.Bytes())
	return err
}

// rawPaths say where each section keeps its resources: the list, then the path inside an
// element to the resource (snake_case, as Envoy writes it).
var rawPaths = map[string][][]string{
	"clusters":  {{"dynamic_active_clusters", "cluster"}, {"static_clusters", "cluster"}},
	"listeners": {{"dynamic_listeners", "active_state", "listener"}, {"static_listeners", "listener"}},
	"routes":    {{"dynamic_route_configs", "route_config"}, {"static_route_configs", "route_config"}},
}

// RawResources are a section's resources as the proxy wrote them, those whose name keep
// accepts (nil: all), for -o json and -o yaml: what the table shows, unabridged.
func (d *Dump) RawResources(section string, keep func(name string) bool) ([]json.RawMessage, error) {
	return d.rawAt(section, rawPaths[section], "name", keep)
}

// rawAt are the resources at paths of a section, by their field nameField.
func (d *Dump) rawAt(section string, paths [][]string, nameField string, keep func(name string) bool) ([]json.RawMessage, error) {
	raw, ok := d.Raw[section]
	if !ok {
		return nil, fmt.Errorf("the config dump has no %s section", section)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, err
	}
	out := []json.RawMessage{}
	for _, path := range paths {
		var list []json.RawMessage
		if err := json.Unmarshal(top[path[0]], &list); err != nil && top[path[0]] != nil {
			return nil, fmt.Errorf("%s %s: %w", section, path[0], err)
		}
		for _, el := range list {
			res := dig(el, path[1:])
			if res == nil {
				continue
			}
			var name string
			_ = json.Unmarshal(dig(res, []string{nameField}), &name)
			if keep == nil || keep(name) {
				out = append(out, res)
			}
		}
	}
	return out, nil
}

// dynamicNames say where the resources xDS gave the proxy are, per type: section, path,
// name field.
var dynamicNames = map[string]struct {
	section, field string
	path           []string
}{
	"cds":  {"clusters", "name", []string{"dynamic_active_clusters", "cluster"}},
	"lds":  {"listeners", "name", []string{"dynamic_listeners", "active_state", "listener"}},
	"rds":  {"routes", "name", []string{"dynamic_route_configs", "route_config"}},
	"eds":  {"endpoints", "cluster_name", []string{"dynamic_endpoint_configs", "endpoint_config"}},
	"ecds": {"ecds", "name", []string{"ecds_filters", "ecds_filter"}},
}

// Names are the names of the resources the proxy holds from xDS, per type ("cds", ...);
// a section the dump lacks gives none.
func (d *Dump) Names() map[string][]string {
	out := map[string][]string{}
	for typ, at := range dynamicNames {
		out[typ] = []string{}
		_, _ = d.rawAt(at.section, [][]string{at.path}, at.field, func(n string) bool {
			out[typ] = append(out[typ], n)
			return false
		})
	}
	return out
}

func dig(v json.RawMessage, path []string) json.RawMessage {
	for _, k := range path {
		var m map[string]json.RawMessage
		if json.Unmarshal(v, &m) != nil {
			return nil
		}
		v = m[k]
	}
	return v
}

// Versions are the config versions the proxy holds per type ("cds", "lds", "rds", "eds",
// "ecds"): CDS's and LDS's from their sections, and for the types of named resources the
// version of the one updated last (the last response the proxy applied). A type of which it
// holds nothing is absent.
func (d *Dump) Versions() map[string]string {
	out := map[string]string{}
	clusters, _ := sectionOf[adminv3.ClustersConfigDump](d, "clusters") // absent: nothing held
	listeners, _ := sectionOf[adminv3.ListenersConfigDump](d, "listeners")
	routes, _ := sectionOf[adminv3.RoutesConfigDump](d, "routes")
	endpoints, _ := sectionOf[adminv3.EndpointsConfigDump](d, "endpoints")
	ecdsDump, _ := sectionOf[adminv3.EcdsConfigDump](d, "ecds")
	if v := clusters.GetVersionInfo(); v != "" {
		out["cds"] = v
	}
	if v := listeners.GetVersionInfo(); v != "" {
		out["lds"] = v
	}
	type versioned interface {
		GetVersionInfo() string
		GetLastUpdated() *timestamppb.Timestamp
	}
	newest := func(typ string, items []versioned) {
		var best versioned
		for _, it := range items {
			if best == nil || it.GetLastUpdated().AsTime().After(best.GetLastUpdated().AsTime()) {
				best = it
			}
		}
		if best != nil && best.GetVersionInfo() != "" {
			out[typ] = best.GetVersionInfo()
		}
	}
	var rds, eds, ecds []versioned
	for _, r := range routes.GetDynamicRouteConfigs() {
		rds = append(rds, r)
	}
	for _, e := range endpoints.GetDynamicEndpointConfigs() {
		eds = append(eds, e)
	}
	for _, e := range ecdsDump.GetEcdsFilters() {
		ecds = append(ecds, e)
	}
	newest("rds", rds)
	newest("eds", eds)
	newest("ecds", ecds)
	return out
}

// WriteBootstrap prints the bootstrap's summary: the node, the versions (istioctl's -o
// short), the admin address and the xDS servers.
func (d *Dump) WriteBootstrap(w io.Writer) error {
	dump, err := sectionOf[adminv3.BootstrapConfigDump](d, "bootstrap")
	if err != nil {
		return err
	}
	b := dump.GetBootstrap()
	md := b.GetNode().GetMetadata().GetFields()
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	fmt.Fprintf(tw, "Node ID:\t%s\n", b.GetNode().GetId())
	fmt.Fprintf(tw, "Cluster:\t%s\n", b.GetNode().GetCluster())
	if v := md["ISTIO_VERSION"].GetStringValue(); v != "" {
		fmt.Fprintf(tw, "Istio Version:\t%s\n", v)
	}
	if v := b.GetNode().GetUserAgentName(); v != "" {
		ver := b.GetNode().GetUserAgentVersion()
		if bv := b.GetNode().GetUserAgentBuildVersion().GetVersion(); bv != nil {
			ver = fmt.Sprintf("%d.%d.%d", bv.GetMajorNumber(), bv.GetMinorNumber(), bv.GetPatch())
		}
		fmt.Fprintf(tw, "Proxy Version:\t%s %s\n", v, ver)
	}
	if a := b.GetAdmin().GetAddress().GetSocketAddress(); a != nil {
		fmt.Fprintf(tw, "Admin:\t%s:%d\n", a.GetAddress(), a.GetPortValue())
	}
	var xds []string
	for _, s := range b.GetDynamicResources().GetAdsConfig().GetGrpcServices() {
		xds = append(xds, s.GetEnvoyGrpc().GetClusterName()+s.GetGoogleGrpc().GetTargetUri())
	}
	sort.Strings(xds)
	if len(xds) > 0 {
		fmt.Fprintf(tw, "ADS:\t%s (%s)\n", strings.Join(xds, ", "), b.GetDynamicResources().GetAdsConfig().GetApiType())
	}
	fmt.Fprintf(tw, "Static clusters:\t%d\n", len(b.GetStaticResources().GetClusters()))
	fmt.Fprintf(tw, "Static listeners:\t%d\n", len(b.GetStaticResources().GetListeners()))
	if t := dump.GetLastUpdated(); t != nil {
		fmt.Fprintf(tw, "Last updated:\t%s\n", t.AsTime().UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}
