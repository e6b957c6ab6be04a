package proxystatus

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
)

// Diff compares the names of one type's resources discovery generates for a proxy with
// those the proxy holds (istioctl proxy-status <pod> diffs the two configs; this compares
// which resources there are, the versions say whether their content is the one acked).
type Diff struct {
	Same int `json:"same"`
	// Missing are discovery's resources the proxy does not hold; Extra the proxy's that
	// discovery would not send.
	Missing []string `json:"missing,omitempty"`
	Extra   []string `json:"extra,omitempty"`
}

func (d Diff) String() string {
	if len(d.Missing) == 0 && len(d.Extra) == 0 {
		return fmt.Sprintf("%d same", d.Same)
	}
	return fmt.Sprintf("%d same, %d missing, %d extra", d.Same, len(d.Missing), len(d.Extra))
}

// DiscoveryNames are the names of the resources discovery generates for the proxy now, per
// type, from its /debug/config_dump?proxyID=.
func DiscoveryNames(ctx context.Context, c *http.Client, p Proxy) (map[string][]string, error) {
	base, err := BaseURL(p.DiscoveryAddress)
	if err != nil {
		return nil, err
	}
	var dump map[string]json.RawMessage
	if err := GetJSON(ctx, c, base+"/debug/config_dump?proxyID="+url.QueryEscape(p.ProxyID), &dump); err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, typ := range Types {
		var list []struct {
			Name        string `json:"name"`
			ClusterName string `json:"clusterName"` // EDS's ClusterLoadAssignment
		}
		if err := json.Unmarshal(dump[typ], &list); err != nil && dump[typ] != nil {
			return nil, fmt.Errorf("discovery's config_dump of %s: %s: %w", p.ProxyID, typ, err)
		}
		out[typ] = []string{}
		for _, r := range list {
			out[typ] = append(out[typ], r.Name+r.ClusterName)
		}
	}
	return out, nil
}

// CompareResources fills the row's Resources from what discovery generates (sent) and what
// the proxy holds (held), per type.
func (r *Row) CompareResources(sent, held map[string][]string) {
	r.Resources = map[string]Diff{}
	for _, typ := range Types {
		has := map[string]bool{}
		for _, n := range held[typ] {
			has[n] = true
		}
		var d Diff
		for _, n := range sent[typ] {
			if has[n] {
				d.Same++
				delete(has, n)
			} else {
				d.Missing = append(d.Missing, n)
			}
		}
		for n := range has {
			d.Extra = append(d.Extra, n)
		}
		sort.Strings(d.Missing)
		sort.Strings(d.Extra)
		r.Resources[typ] = d
	}
}

// differences lists, per type, the resources that differ.
func (r *Row) differences() []string {
	var out []string
	for _, typ := range Types {
		d := r.Resources[typ]
		if len(d.Missing) > 0 {
			out = append(out, fmt.Sprintf("%s the proxy lacks: %s", strings.ToUpper(typ), strings.Join(d.Missing, ", ")))
		}
		if len(d.Extra) > 0 {
			out = append(out, fmt.Sprintf("%s the proxy has that discovery would not send: %s", strings.ToUpper(typ), strings.Join(d.Extra, ", ")))
		}
	}
	return out
}
