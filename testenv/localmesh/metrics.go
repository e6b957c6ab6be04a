package localmesh

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/wasmesh/wasmesh/testenv/meshview"
	"github.com/wasmesh/wasmesh/testenv/promserver"
)

// Metrics is a parsed Prometheus page.
type Metrics map[string]*dto.MetricFamily

// ParseMetrics parses a Prometheus text page; a page with a family declared twice or a
// malformed line is an error, as for a Prometheus server.
func ParseMetrics(page []byte) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return Metrics(fams), nil
}

// Metrics scrapes and parses the pod's merged metrics.
func (p *Pod) Metrics(ctx context.Context) (Metrics, error) {
	b, err := p.Scrape(ctx)
	if err != nil {
		return nil, err
	}
	return ParseMetrics(b)
}

// Series is one labelled series of a family.
type Series struct {
	Labels map[string]string
	// Value is a counter's or gauge's value, a histogram's sample count.
	Value float64
	// Sum is a histogram's sample sum.
	Sum float64
	// Buckets are a histogram's cumulative bucket counts by upper bound.
	Buckets map[float64]uint64
}

// Series returns the series of family name whose labels include match.
func (m Metrics) Series(name string, match map[string]string) []Series {
	f := m[name]
	if f == nil {
		return nil
	}
	var out []Series
	for _, mt := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range mt.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range match {
			if labels[k] != v {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		s := Series{Labels: labels}
		switch {
		case mt.Counter != nil:
			s.Value = mt.GetCounter().GetValue()
		case mt.Gauge != nil:
			s.Value = mt.GetGauge().GetValue()
		case mt.Untyped != nil:
			s.Value = mt.GetUntyped().GetValue()
		case mt.Histogram != nil:
			h := mt.GetHistogram()
			s.Value, s.Sum = float64(h.GetSampleCount()), h.GetSampleSum()
			s.Buckets = map[float64]uint64{}
			for _, b := range h.GetBucket() {
				s.Buckets[b.GetUpperBound()] = b.GetCumulativeCount()
			}
		}
		out = append(out, s)
	}
	return out
}

// Sum adds the values of the series of name whose labels include match.
func (m Metrics) Sum(name string, match map[string]string) float64 {
	t := 0.0
	for _, s := range m.Series(name, match) {
		t += s.Value
	}
	return t
}

// Describe formats labels as {k="v",...} in key order, for messages.
func Describe(labels map[string]string, keys ...string) string {
	if len(keys) == 0 {
		for k := range labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
	}
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%q", k, labels[k]))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// ScrapeTargets are the running pods' merged metrics pages, as a Prometheus scrapes them.
func (m *Mesh) ScrapeTargets() []promserver.Target {
	var out []promserver.Target
	for _, p := range m.Pods() {
		if !p.Running() {
			continue
		}
		out = append(out, promserver.Target{Address: net.JoinHostPort(p.IP, strconv.Itoa(statusPort)),
			Namespace: p.Spec.Namespace, Pod: p.Spec.Name, Labels: p.Spec.Labels})
	}
	return out
}

// PrometheusOptions configure a Prometheus for this mesh (promserver.Start): under the
// mesh's directory, scraping discovery, its process marked as the mesh's.
func (m *Mesh) PrometheusOptions() promserver.Options {
	return promserver.Options{Dir: filepath.Join(m.opts.Dir, "prometheus"), Discovery: m.httpAddr,
		Env: []string{EnvMeshDir + "=" + m.opts.Dir}}
}

// ViewSources are what the mesh page (package meshview) reads of this mesh: its running
// workloads, discovery's sync state and rejected config, and prom's metrics.
func (m *Mesh) ViewSources(prom *promserver.Server) meshview.Sources {
	return meshview.Sources{
		Prometheus: prom,
		Discovery:  []string{m.httpAddr},
		Workloads: func() []meshview.Workload {
			count := map[[2]string]int{}
			for _, p := range m.Pods() {
				if p.Running() {
					count[[2]string{p.Workload(), p.Spec.Namespace}]++
				}
			}
			out := make([]meshview.Workload, 0, len(count))
			for k, n := range count {
				out = append(out, meshview.Workload{Name: k[0], Namespace: k[1], Pods: n})
			}
			return out
		},
		Rejected: m.ConfigProblems,
	}
}
