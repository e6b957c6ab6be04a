package proxyconfig

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// ClusterFilter is istioctl's: --fqdn, --port, --subset, --direction each narrow by the
// cluster name's part (a cluster name outbound|<port>|<subset>|<fqdn>).
type ClusterFilter struct {
	FQDN      string
	Port      int
	Subset    string
	Direction string // inbound or outbound
}

// Validate says what is wrong with the filter.
func (f ClusterFilter) Validate() error {
	switch f.Direction {
	case "", "inbound", "outbound":
	default:
		return fmt.Errorf("--direction %q: want inbound or outbound", f.Direction)
	}
	if f.Port < 0 || f.Port > 65535 {
		return fmt.Errorf("--port %d: want 1 to 65535", f.Port)
	}
	return nil
}

// Keep says whether the cluster name passes the filter (istioctl matches substrings).
func (f ClusterFilter) Keep(name string) bool {
	switch {
	case f.FQDN != "" && !strings.Contains(name, f.FQDN),
		f.Direction != "" && !strings.Contains(name, f.Direction),
		f.Subset != "" && !strings.Contains(name, f.Subset),
		f.Port != 0 && !strings.Contains(name, "|"+strconv.Itoa(f.Port)+"|"):
		return false
	}
	return true
}

// clusterKey is Istio's cluster name: direction|port|subset|fqdn.
type clusterKey struct {
	direction, port, subset, fqdn string
}

func parseClusterName(name string) (clusterKey, bool) {
	parts := strings.Split(name, "|")
	if len(parts) < 4 {
		return clusterKey{fqdn: name}, false
	}
	return clusterKey{direction: parts[0], port: parts[1], subset: parts[2], fqdn: parts[3]}, true
}

func portNumber(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// Clusters are the dump's clusters (dynamic active, then static) that pass the filter,
// sorted as istioctl sorts them: by FQDN, subset, port, direction.
func (d *Dump) Clusters(f ClusterFilter) ([]*clusterv3.Cluster, error) {
	out, err := typed(d, "clusters", "cluster", func(c *clusterv3.Cluster) bool { return f.Keep(c.GetName()) })
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, _ := parseClusterName(out[i].GetName())
		b, _ := parseClusterName(out[j].GetName())
		switch {
		case a.fqdn != b.fqdn:
			return a.fqdn < b.fqdn
		case a.subset != b.subset:
			return a.subset < b.subset
		case a.port != b.port:
			return portNumber(a.port) < portNumber(b.port)
		}
		return a.direction < b.direction
	})
	return out, nil
}

// typed are a section's resources (as RawResources finds them) read as Ts, those keep
// accepts.
func typed[T any, PT interface {
	*T
	proto.Message
}](d *Dump, section, what string, keep func(PT) bool) ([]PT, error) {
	raws, err := d.RawResources(section, nil)
	if err != nil {
		return nil, err
	}
	var out []PT
	for _, raw := range raws {
		m := PT(new(T))
		if err := unmarshal.Unmarshal(stripType(raw), m); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if keep(m) {
			out = append(out, m)
		}
	}
	return out, nil
}

// unpack reads an Any of a dump into m (nil is an empty m).
func unpack(a *anypb.Any, m proto.Message) error {
	if a == nil {
		return nil
	}
	return proto.Unmarshal(a.GetValue(), m)
}

// WriteClusters prints istioctl's cluster table: SERVICE FQDN, PORT, SUBSET, DIRECTION,
// TYPE, DESTINATION RULE.
func WriteClusters(w io.Writer, clusters []*clusterv3.Cluster) error {
	tw := tabwriter.NewWriter(w, 0, 8, 5, ' ', 0)
	fmt.Fprintln(tw, "SERVICE FQDN\tPORT\tSUBSET\tDIRECTION\tTYPE\tDESTINATION RULE")
	for _, c := range clusters {
		k, istio := parseClusterName(c.GetName())
		typ := c.GetType().String()
		if c.GetClusterType() != nil {
			typ = c.GetClusterType().GetName()
		}
		if !istio {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t%s\t%s\n", c.GetName(), typ, describeManagement(c.GetMetadata()))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.fqdn, k.port, dash(k.subset), k.direction, typ, describeManagement(c.GetMetadata()))
	}
	return tw.Flush()
}

// describeManagement names the Istio config that made a resource, from its
// filter_metadata.istio.config (/apis/networking.istio.io/<v>/namespaces/<ns>/<kind>/<name>):
// <name>.<namespace>, as istioctl prints it.
func describeManagement(md *corev3.Metadata) string {
	path := md.GetFilterMetadata()["istio"].GetFields()["config"].GetStringValue()
	if path == "" {
		return ""
	}
	if !strings.HasPrefix(path, "/apis/networking.istio.io/") {
		return "<unknown>"
	}
	p := strings.Split(path, "/")
	if len(p) != 8 {
		return ""
	}
	return p[7] + "." + p[5]
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
