package proxyconfig

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
)

// Routes are the dump's route configurations (dynamic, then static) named name ("": all),
// numeric names (outbound ports) in order first.
func (d *Dump) Routes(name string) ([]*routev3.RouteConfiguration, error) {
	out, err := typed(d, "routes", "route configuration", func(rc *routev3.RouteConfiguration) bool { return name == "" || rc.GetName() == name })
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, errA := strconv.Atoi(out[i].GetName())
		b, errB := strconv.Atoi(out[j].GetName())
		switch {
		case errA == nil && errB == nil:
			return a < b
		case errA == nil || errB == nil:
			return errA == nil
		}
		return out[i].GetName() < out[j].GetName()
	})
	return out, nil
}

// WriteRoutes prints istioctl's route table: NAME, VHOST NAME, DOMAINS, MATCH, VIRTUAL
// SERVICE, a line per route (routes to the PassthroughCluster left out, a virtual host
// without routes as /* 404).
func WriteRoutes(w io.Writer, routes []*routev3.RouteConfiguration) error {
	tw := tabwriter.NewWriter(w, 0, 8, 5, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVHOST NAME\tDOMAINS\tMATCH\tVIRTUAL SERVICE")
	for _, rc := range routes {
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if r.GetRoute().GetCluster() == "PassthroughCluster" {
					continue
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", rc.GetName(), vh.GetName(), routeDomains(vh.GetDomains()),
					routeMatch(r.GetMatch()), describeManagement(r.GetMetadata()))
			}
			if len(vh.GetRoutes()) == 0 {
				fmt.Fprintf(tw, "%s\t%s\t%s\t/*\t404\n", rc.GetName(), vh.GetName(), routeDomains(vh.GetDomains()))
			}
		}
	}
	return tw.Flush()
}

// routeDomains is istioctl's short form of a virtual host's domains: the names without a
// port, the longer forms of a name dropped when its short form is there, two at most and a
// count of the rest.
func routeDomains(domains []string) string {
	if len(domains) <= 1 {
		return strings.Join(domains, "")
	}
	var noPort []string
	for _, d := range domains {
		if !strings.Contains(d, ":") || (strings.Count(d, ":") > 2 && strings.HasSuffix(d, "]")) {
			noPort = append(noPort, d)
		}
	}
	has := map[string]bool{}
	for _, d := range noPort {
		has[d] = true
	}
	var short []string
	for _, d := range noPort {
		if s := strings.TrimSuffix(d, ".svc.cluster.local"); s != d && has[s] {
			continue
		}
		if s := strings.TrimSuffix(d, ".svc"); s != d && has[s] {
			continue
		}
		short = append(short, d)
	}
	if len(short) > 2 {
		return fmt.Sprintf("%s + %d more...", strings.Join(short[:2], ", "), len(short)-2)
	}
	return strings.Join(short, ", ")
}

// routeMatch is istioctl's description of a route's path match (headers left out).
func routeMatch(m *routev3.RouteMatch) string {
	var c []string
	if p := m.GetPrefix(); p != "" {
		c = append(c, p+"*")
	}
	if p := m.GetPathSeparatedPrefix(); p != "" {
		c = append(c, "PathPrefix:"+p)
	}
	if p := m.GetPath(); p != "" {
		c = append(c, p)
	}
	if r := m.GetSafeRegex(); r != nil {
		c = append(c, "regex "+r.GetRegex())
	}
	return strings.Join(c, " ")
}
