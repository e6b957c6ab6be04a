package stats

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Query selects stats for the admin pages (Envoy's usedonly, filter and type parameters).
type Query struct {
	UsedOnly bool
	// Filter is matched anywhere in the name (Envoy's regex search); nil selects all.
	Filter *regexp.Regexp
	// Type is "", "Counters", "Gauges" or "Histograms".
	Type string
}

func (q Query) keep(s Sample) bool {
	if q.UsedOnly && !s.Used {
		return false
	}
	if q.Filter != nil && !q.Filter.MatchString(s.Name) {
		return false
	}
	switch q.Type {
	case "Counters":
		return s.Kind == KindCounter
	case "Gauges":
		return s.Kind == KindGauge
	case "Histograms":
		return s.Kind == KindHistogram
	}
	return true
}

// Select returns the samples q keeps.
func (s *Store) Select(q Query) []Sample {
	var out []Sample
	for _, smp := range s.Snapshot() {
		if q.keep(smp) {
			out = append(out, smp)
		}
	}
	return out
}

// Quantiles are the quantiles Envoy's /stats prints for histograms.
var Quantiles = []float64{0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 1}

// WriteText writes Envoy's /stats text: "name: value" for counters and gauges, then the
// histograms with their quantiles.
func (s *Store) WriteText(w io.Writer, q Query) error {
	samples := s.Select(q)
	var hists []Sample
	for _, smp := range samples {
		if smp.Kind == KindHistogram {
			hists = append(hists, smp)
			continue
		}
		if _, err := fmt.Fprintf(w, "%s: %d\n", smp.Name, smp.Value); err != nil {
			return err
		}
	}
	for _, h := range hists {
		parts := make([]string, 0, len(Quantiles))
		for _, qq := range Quantiles {
			parts = append(parts, fmt.Sprintf("P%s(nan,%s)", formatQuantileName(qq), formatFloat(h.Histogram.Quantile(qq))))
		}
		if _, err := fmt.Fprintf(w, "%s: %s\n", h.Name, strings.Join(parts, " ")); err != nil {
			return err
		}
	}
	return nil
}

func formatQuantileName(q float64) string { return strconv.FormatFloat(q*100, 'f', -1, 64) }

func formatFloat(v float64) string {
	if math.IsNaN(v) {
		return "nan"
	}
	return strconv.FormatFloat(v, 'g', 6, 64)
}

// WriteJSON writes Envoy's /stats?format=json.
func (s *Store) WriteJSON(w io.Writer, q Query) error {
	type stat struct {
		Name  string `json:"name"`
		Value int64  `json:"value"`
	}
	type qv struct {
		Interval   *float64 `json:"interval"`
		Cumulative *float64 `json:"cumulative"`
	}
	type computed struct {
		Name   string `json:"name"`
		Values []qv   `json:"values"`
	}
	var entries []any
	var comp []computed
	for _, smp := range s.Select(q) {
		if smp.Kind != KindHistogram {
			entries = append(entries, stat{Name: smp.Name, Value: smp.Value})
			continue
		}
		c := computed{Name: smp.Name}
		for _, qq := range Quantiles {
			v := smp.Histogram.Quantile(qq)
			var p *float64
			if !math.IsNaN(v) {
				p = &v
			}
			c.Values = append(c.Values, qv{Cumulative: p})
		}
		comp = append(comp, c)
	}
	if comp != nil || q.Type == "Histograms" {
		supported := make([]float64, len(Quantiles))
		for i, qq := range Quantiles {
			supported[i] = qq * 100
		}
		entries = append(entries, map[string]any{"histograms": map[string]any{
			"supported_quantiles": supported, "computed_quantiles": comp}})
	}
	if entries == nil {
		entries = []any{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(map[string]any{"stats": entries})
}

var invalidPromChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// PrometheusName sanitizes a tag-extracted name: Envoy's own stats get the envoy_ prefix,
// external (Wasm) stats lose their custom namespace and get no prefix, as Envoy does.
func PrometheusName(extracted string, external bool) string {
	if external {
		extracted = strings.TrimPrefix(extracted, CustomNamespace)
	}
	n := invalidPromChars.ReplaceAllString(extracted, "_")
	if external {
		if n != "" && n[0] >= '0' && n[0] <= '9' {
			n = "_" + n
		}
		return n
	}
	return "envoy_" + n
}

type promSeries struct {
	labels string
	smp    Sample
}

type promFamily struct {
	name   string
	kind   Kind
	series []promSeries
}

// WritePrometheus writes /stats/prometheus: tags become labels, one TYPE line per family,
// histograms as cumulative _bucket/_sum/_count with Envoy's default bounds.
func (s *Store) WritePrometheus(w io.Writer, q Query) error {
	families := map[string]*promFamily{}
	for _, smp := range s.Select(q) {
		extracted, tags := s.tags.Extract(smp.Name)
		name := PrometheusName(extracted, smp.External)
		f := families[name]
		if f == nil {
			f = &promFamily{name: name, kind: smp.Kind}
			families[name] = f
		}
		if f.kind != smp.Kind {
			continue // Prometheus allows one type per family; Envoy keeps the first too.
		}
		f.series = append(f.series, promSeries{labels: formatLabels(tags), smp: smp})
	}
	names := make([]string, 0, len(families))
	for n := range families {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		f := families[n]
		typ := map[Kind]string{KindCounter: "counter", KindGauge: "gauge", KindHistogram: "histogram"}[f.kind]
		fmt.Fprintf(&b, "# TYPE %s %s\n", n, typ)
		sort.SliceStable(f.series, func(i, j int) bool { return f.series[i].labels < f.series[j].labels })
		for _, se := range f.series {
			if f.kind != KindHistogram {
				fmt.Fprintf(&b, "%s%s %d\n", n, braces(se.labels), se.smp.Value)
				continue
			}
			h := se.smp.Histogram
			for i, bound := range DefaultBuckets {
				fmt.Fprintf(&b, "%s_bucket%s %d\n", n, braces(joinLabels(se.labels, `le="`+strconv.FormatFloat(bound, 'g', -1, 64)+`"`)), h.Cumulative[i])
			}
			fmt.Fprintf(&b, "%s_bucket%s %d\n", n, braces(joinLabels(se.labels, `le="+Inf"`)), h.Count)
			fmt.Fprintf(&b, "%s_sum%s %s\n", n, braces(se.labels), strconv.FormatFloat(h.Sum, 'g', -1, 64))
			fmt.Fprintf(&b, "%s_count%s %d\n", n, braces(se.labels), h.Count)
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func formatLabels(tags []Tag) string {
	parts := make([]string, 0, len(tags))
	for _, t := range tags {
		v := strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`).Replace(t.Value)
		parts = append(parts, invalidPromChars.ReplaceAllString(t.Name, "_")+`="`+v+`"`)
	}
	return strings.Join(parts, ",")
}

func joinLabels(a, b string) string {
	if a == "" {
		return b
	}
	return a + "," + b
}

func braces(labels string) string {
	if labels == "" {
		return ""
	}
	return "{" + labels + "}"
}
