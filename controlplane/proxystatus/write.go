package proxystatus

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Row is a proxy with its per-type states, what -o json and -o yaml print.
type Row struct {
	Proxy
	Status []TypeState `json:"status"`
	// ProxyVersions, for one pod, are the versions the proxy's own config_dump holds per
	// type (the newest resource's); Match says whether each equals the version acked.
	ProxyVersions map[string]string `json:"proxyVersions,omitempty"`
	Match         map[string]bool   `json:"match,omitempty"`
	// Resources, for one pod, compare per type the resources discovery generates for it
	// with those the proxy holds.
	Resources map[string]Diff `json:"resources,omitempty"`
}

// Rows are the proxies with their states.
func Rows(proxies []Proxy) []Row {
	out := make([]Row, 0, len(proxies))
	for _, p := range proxies {
		out = append(out, Row{Proxy: p, Status: p.States()})
	}
	return out
}

func newTabWriter(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 8, 3, ' ', 0) }

// cell is a type's column: its status, marked when the proxy NACKed the latest version.
func cell(s TypeState) string {
	if s.NackError != "" {
		return s.Status + " (NACK)"
	}
	return s.Status
}

// WriteTable prints istioctl proxy-status's table (NAME CLUSTER CDS LDS EDS RDS ECDS ISTIOD
// VERSION, with DISCOVERY for ISTIOD), then every NACK's error.
func WriteTable(w io.Writer, rows []Row) error {
	tw := newTabWriter(w)
	fmt.Fprintln(tw, "NAME\tCLUSTER\tCDS\tLDS\tEDS\tRDS\tECDS\tDISCOVERY\tVERSION")
	var nacks []string
	for _, r := range rows {
		cols := []string{r.Pod(), dash(r.ClusterID)}
		for _, s := range r.Status {
			cols = append(cols, cell(s))
			if s.NackError != "" {
				nacks = append(nacks, fmt.Sprintf("%s %s version %s: %s", r.Pod(), strings.ToUpper(s.Type), s.VersionSent, s.NackError))
			}
		}
		cols = append(cols, r.Replica(), dash(r.IstioVersion))
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeNacks(w, nacks)
}

func writeNacks(w io.Writer, nacks []string) error {
	if len(nacks) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(w, "\nRejected by the proxy (NACK); it keeps its last accepted config:\n  %s\n", strings.Join(nacks, "\n  "))
	return err
}

// WriteDetail prints one proxy: per type its status, the versions sent and acked, and, when
// the proxy's config_dump was read, the version it holds and whether that is the one acked.
func WriteDetail(w io.Writer, r Row) error {
	fmt.Fprintf(w, "Proxy %s (node %s), discovery %s at %s\n\n", r.Pod(), r.ProxyID, r.Replica(), r.DiscoveryAddress)
	tw := newTabWriter(w)
	header := "TYPE\tSTATUS\tSENT\tACKED"
	if r.ProxyVersions != nil {
		header += "\tPROXY\tPROXY VERSION"
	}
	if r.Resources != nil {
		header += "\tRESOURCES"
	}
	fmt.Fprintln(tw, header)
	var nacks []string
	for _, s := range r.Status {
		line := strings.Join([]string{strings.ToUpper(s.Type), cell(s), dash(s.VersionSent), dash(s.VersionAcked)}, "\t")
		if r.ProxyVersions != nil {
			v, held := r.ProxyVersions[s.Type]
			verdict := "-"
			switch {
			case !held && s.VersionAcked == "":
			case r.Match[s.Type]:
				verdict = "MATCHES ACKED"
			default:
				verdict = "DIFFERS"
			}
			line += "\t" + verdict + "\t" + dash(v)
		}
		if r.Resources != nil {
			line += "\t" + r.Resources[s.Type].String()
		}
		fmt.Fprintln(tw, line)
		if s.NackError != "" {
			nacks = append(nacks, fmt.Sprintf("%s version %s: %s", strings.ToUpper(s.Type), s.VersionSent, s.NackError))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if diffs := r.differences(); len(diffs) > 0 {
		fmt.Fprintf(w, "\nResources that differ:\n  %s\n", strings.Join(diffs, "\n  "))
	}
	return writeNacks(w, nacks)
}

// Compare fills the row's ProxyVersions and Match from the versions the proxy holds.
func (r *Row) Compare(held map[string]string) {
	r.ProxyVersions, r.Match = map[string]string{}, map[string]bool{}
	for _, s := range r.Status {
		v, ok := held[s.Type]
		if ok {
			r.ProxyVersions[s.Type] = v
		}
		r.Match[s.Type] = v == s.VersionAcked
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
