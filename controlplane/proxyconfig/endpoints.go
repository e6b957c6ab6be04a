package proxyconfig

import (
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
)

// ParseClusters reads the admin's /clusters?format=json.
func ParseClusters(body []byte) (*adminv3.Clusters, error) {
	c := &adminv3.Clusters{}
	if err := unmarshal.Unmarshal(body, c); err != nil {
		return nil, fmt.Errorf("/clusters?format=json: %w", err)
	}
	return c, nil
}

// Endpoint is one host of one cluster, as istioctl's endpoint table lists it.
type Endpoint struct {
	Address       string `json:"endpoint"`
	Status        string `json:"status"`
	FailedOutlier bool   `json:"failedOutlierCheck"`
	Cluster       string `json:"cluster"`
}

// EndpointFilter is istioctl's: --address, --port, --cluster, --status (HEALTHY, ...), each
// narrowing when set.
type EndpointFilter struct {
	Address, Cluster, Status string
	Port                     uint32
}

func (f EndpointFilter) keep(host string, port uint32, cluster, status string) bool {
	return (f.Address == "" || strings.EqualFold(host, f.Address)) && (f.Port == 0 || port == f.Port) &&
		(f.Cluster == "" || strings.EqualFold(cluster, f.Cluster)) && (f.Status == "" || strings.EqualFold(status, f.Status))
}

// Endpoints are the hosts of the clusters that pass f, sorted by address, port, cluster,
// as istioctl sorts them.
func Endpoints(c *adminv3.Clusters, f EndpointFilter) []Endpoint {
	type sortable struct {
		Endpoint
		host string
		port uint32
	}
	var eps []sortable
	for _, cs := range c.GetClusterStatuses() {
		for _, h := range cs.GetHostStatuses() {
			e := sortable{Endpoint: Endpoint{Cluster: cs.GetName(), Status: h.GetHealthStatus().GetEdsHealthStatus().String(),
				FailedOutlier: h.GetHealthStatus().GetFailedOutlierCheck()}}
			switch a := h.GetAddress(); {
			case a.GetSocketAddress() != nil:
				e.host, e.port = a.GetSocketAddress().GetAddress(), a.GetSocketAddress().GetPortValue()
				e.Address = net.JoinHostPort(e.host, strconv.Itoa(int(e.port)))
				if e.port == 0 {
					e.Address = e.host
				}
			case a.GetPipe() != nil:
				e.host = "unix://" + a.GetPipe().GetPath()
				e.Address = e.host
			default:
				e.host, e.Address = "unknown", "unknown"
			}
			if f.keep(e.host, e.port, e.Cluster, e.Status) {
				eps = append(eps, e)
			}
		}
	}
	sort.SliceStable(eps, func(i, j int) bool {
		a, b := eps[i], eps[j]
		switch {
		case a.host != b.host:
			return a.host < b.host
		case a.port != b.port:
			return a.port < b.port
		}
		return a.Cluster < b.Cluster
	})
	out := make([]Endpoint, len(eps))
	for i, e := range eps {
		out[i] = e.Endpoint
	}
	return out
}

// WriteEndpoints prints istioctl's endpoint table: ENDPOINT, STATUS, OUTLIER CHECK, CLUSTER.
func WriteEndpoints(w io.Writer, eps []Endpoint) error {
	tw := tabwriter.NewWriter(w, 0, 8, 5, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tSTATUS\tOUTLIER CHECK\tCLUSTER")
	for _, e := range eps {
		outlier := "OK"
		if e.FailedOutlier {
			outlier = "FAILED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Address, e.Status, outlier, e.Cluster)
	}
	return tw.Flush()
}
