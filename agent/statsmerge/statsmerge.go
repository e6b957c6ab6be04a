// Package statsmerge builds the agent's one Prometheus scrape: the proxy's page, the
// application's metrics and the agent's own, as valid text exposition with each metric
// family once.
package statsmerge

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ProxyFamilies lists the metric families a text page declares (# TYPE and # HELP
// lines). The proxy's page is copied as it is, so its families are known by scanning,
// not parsing: parsing the proxy's tens of thousands of series would cost far more than
// the scrape itself.
func ProxyFamilies(page []byte) map[string]bool {
	out := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(page))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) < 8 || line[0] != '#' {
			continue
		}
		rest, ok := bytes.CutPrefix(line, []byte("# TYPE "))
		if !ok {
			rest, ok = bytes.CutPrefix(line, []byte("# HELP "))
		}
		if !ok {
			continue
		}
		if name, _, _ := bytes.Cut(rest, []byte(" ")); len(name) > 0 {
			out[string(name)] = true
		}
	}
	return out
}

// ParseText parses a text exposition page (an application's /metrics).
func ParseText(r io.Reader) ([]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	m, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	out := make([]*dto.MetricFamily, 0, len(m))
	for _, mf := range m {
		out = append(out, mf)
	}
	return out, nil
}

// Result tells what the merge left out.
type Result struct {
	// DroppedFamilies are families of a later source whose name an earlier source
	// already declared with another type, or that the proxy page already has.
	DroppedFamilies []string
	// DroppedSeries counts series whose name and labels an earlier source already had.
	DroppedSeries int
}

// Write writes the proxy page unchanged, then the families of each source in order.
// A family the proxy page declares is dropped from the sources; between sources the
// first one wins: a family of the same type gets only the series it lacks, one of
// another type is dropped.
func Write(w io.Writer, proxyPage []byte, sources ...[]*dto.MetricFamily) (Result, error) {
	var res Result
	if _, err := w.Write(proxyPage); err != nil {
		return res, err
	}
	if len(proxyPage) > 0 && proxyPage[len(proxyPage)-1] != '\n' {
		if _, err := io.WriteString(w, "\n"); err != nil {
			return res, err
		}
	}
	taken := ProxyFamilies(proxyPage)
	merged := map[string]*dto.MetricFamily{}
	seen := map[string]map[string]bool{} // family → label signatures
	var order []string
	for _, src := range sources {
		for _, mf := range src {
			name := mf.GetName()
			if taken[name] {
				res.DroppedFamilies = append(res.DroppedFamilies, name)
				continue
			}
			have, ok := merged[name]
			if !ok {
				cp := &dto.MetricFamily{Name: mf.Name, Help: mf.Help, Type: mf.Type, Unit: mf.Unit}
				merged[name] = cp
				seen[name] = map[string]bool{}
				order = append(order, name)
				have = cp
			} else if have.GetType() != mf.GetType() {
				res.DroppedFamilies = append(res.DroppedFamilies, name)
				continue
			}
			for _, m := range mf.GetMetric() {
				sig := signature(m.GetLabel())
				if seen[name][sig] {
					res.DroppedSeries++
					continue
				}
				seen[name][sig] = true
				have.Metric = append(have.Metric, m)
			}
		}
	}
	sort.Strings(order)
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, name := range order {
		if err := enc.Encode(merged[name]); err != nil {
			return res, fmt.Errorf("family %s: %w", name, err)
		}
	}
	return res, nil
}

func signature(labels []*dto.LabelPair) string {
	parts := make([]string, 0, len(labels))
	for _, l := range labels {
		parts = append(parts, l.GetName()+"\xff"+l.GetValue())
	}
	sort.Strings(parts)
	return strings.Join(parts, "\xfe")
}
