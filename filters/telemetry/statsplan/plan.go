// Package statsplan works out what an Istio stats plugin configuration means for a
// telemetry filter: which metrics it reports, their types and values, their tags in order
// and where each tag's value comes from (one of Istio's standard labels or a configured
// dimension expression), and the Envoy and Istio attributes those expressions read. It is
// the configuration side of filters/telemetry, in pure Go: a filter loads a [Plan] once
// when it is configured ([Load]) and follows it per request; [Plan.Describe] prints it.
//
// The configuration is Istio's stats plugin configuration ([Config]: the JSON field names
// of istio/proxy extensions/stats/config.proto) and is applied in Istio's order; anything
// this package cannot honour is refused with an error naming it. Expressions are compiled
// with package expr against the attributes in [LookupAttribute].
package statsplan

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/wasmesh/wasmesh/filters/telemetry/expr"
)

// Kind is a metric's type.
type Kind uint8

const (
	Counter Kind = iota
	Gauge
	Histogram
)

func (k Kind) String() string {
	switch k {
	case Gauge:
		return "GAUGE"
	case Histogram:
		return "HISTOGRAM"
	}
	return "COUNTER"
}

// ValueSource says what a metric records per request.
type ValueSource uint8

const (
	ValueOne           ValueSource = iota // 1 per request (requests_total)
	ValueDurationMs                       // request duration in milliseconds
	ValueRequestBytes                     // request.total_size
	ValueResponseBytes                    // response.total_size
	ValueExpr                             // the metric's int expression, Metric.ValueExpr

	// The TCP metrics' values, per connection report (Metric.TCP).
	ValueConnectionOpened // 1 in a connection's first report
	ValueConnectionClosed // 1 in its report at close
	ValueReceivedBytes    // bytes from the downstream since the last report
	ValueSentBytes        // bytes to the downstream since the last report
)

// Tag is one tag of a metric: its name and the index of its value in a request's label
// values (the standard labels at their Label* index, then dimension i at
// NumStandardLabels+i).
type Tag struct {
	Name  string
	Index int
}

// Metric is a metric the plan reports.
type Metric struct {
	Name      string // as configured: requests_total
	FullName  string // as reported: istio_requests_total
	Kind      Kind
	Value     ValueSource
	ValueExpr *expr.Expr // ValueExpr: the value expression, an int
	Tags      []Tag      // in the order they are encoded in the name
	Group     int        // index into Plan.Groups
	// TCP marks the metrics of TCP connections (istio_tcp_*), reported by a network
	// filter's connections; the others are reported per HTTP request. A group holds
	// metrics of one kind only.
	TCP bool
}

// Plan is what a configuration means, worked out once at configure time: which metrics
// exist, their tags in order and where each tag's value comes from, the expressions to
// evaluate and the attributes they read. A request path only follows it. A Plan is not
// changed once built.
type Plan struct {
	Metrics []Metric
	// Groups lists the indices of metrics with identical tag lists, which can share one
	// encoding of a request's labels.
	Groups [][]int
	// Dimensions are the configured tag expressions, one per distinct expression text
	// (shared by every metric that uses it, as in Istio); dimension i is label value
	// NumStandardLabels+i.
	Dimensions []*expr.Expr
	// Attributes are the attributes the expressions read, by the slot their
	// expr.Reader is asked for.
	Attributes []*Attribute

	// UsedLabels marks the standard labels some metric reports, so a request path
	// reads only the properties those need; NeedDuration says some metric records
	// ValueDurationMs.
	UsedLabels   [NumStandardLabels]bool
	NeedDuration bool

	Reporter      string // "", ReporterSource or ReporterDestination
	UseHostHeader bool   // destination_service falls back to the :authority (Istio's default)
	MaxLabelSets  int    // distinct label sets per metric
	MaxPeerCache  int    // decoded peers kept; negative: no cache
	// TCPReportingDuration is how often an open connection reports (tcp_reporting_duration).
	TCPReportingDuration time.Duration
	// Network: the plugin is a network filter, reporting TCP connections.
	Network bool

	// The attribute slots of header sources, captured in the header callbacks.
	RequestHeaderSlots, ResponseHeaderSlots, ResponseTrailerSlots []int
}

// factory is a metric while the configuration is being applied, before removed tags are
// dropped. index maps a tag to its value index, -1 once removed (a later override may
// bring it back in its original position, as in Istio).
type factory struct {
	name      string
	kind      Kind
	value     ValueSource
	valueExpr *expr.Expr
	tcp       bool
	tags      []string
	index     map[string]int
	dropped   bool
}

func newFactory(name string, kind Kind, v ValueSource) *factory {
	f := &factory{name: name, kind: kind, value: v, index: map[string]int{}}
	for i, n := range StandardLabelNames {
		f.tags = append(f.tags, n)
		f.index[n] = i
	}
	return f
}

// newTCPFactory is one of Istio's TCP metrics, all counters with the standard labels.
func newTCPFactory(name string, v ValueSource) *factory {
	f := newFactory(name, Counter, v)
	f.tcp = true
	return f
}

// Load parses a plugin configuration ([ParseConfig]) and works out its plan ([Build]),
// reading node attributes with node.
func Load(data []byte, node NodeReader) (*Plan, error) {
	cfg, err := ParseConfig(data)
	if err == nil {
		var pl *Plan
		if pl, err = Build(cfg, node); err == nil {
			return pl, nil
		}
	}
	return nil, fmt.Errorf("plugin configuration: %w", err)
}

// Build applies cfg in Istio's order: the standard metrics, then definitions (new
// metrics get the standard labels), then the metric overrides in order, each removing
// tags before adding dimensions.
func Build(cfg Config, node NodeReader) (*Plan, error) {
	b := &planBuilder{
		pl: &Plan{
			Reporter:      cfg.Reporter,
			UseHostHeader: !cfg.DisableHostHeaderFallback,
			MaxLabelSets:  cfg.MaxLabelSetsPerMetric,
			MaxPeerCache:  cfg.MaxPeerCacheSize,

			TCPReportingDuration: cfg.TCPReportingDuration,
			Network:              cfg.Network,
		},
		attrs: NewResolver(node),
		factories: []*factory{
			newFactory("requests_total", Counter, ValueOne),
			newFactory("request_duration_milliseconds", Histogram, ValueDurationMs),
			newFactory("request_bytes", Histogram, ValueRequestBytes),
			newFactory("response_bytes", Histogram, ValueResponseBytes),
			newTCPFactory("tcp_sent_bytes_total", ValueSentBytes),
			newTCPFactory("tcp_received_bytes_total", ValueReceivedBytes),
			newTCPFactory("tcp_connections_opened_total", ValueConnectionOpened),
			newTCPFactory("tcp_connections_closed_total", ValueConnectionClosed),
		},
		dimIndex: map[string]int{},
	}
	for i, d := range cfg.Definitions {
		if err := b.define(i, d); err != nil {
			return nil, err
		}
	}
	// A tag name anywhere in the configuration, to tell a typo in tags_to_remove from a
	// tag that some other override adds.
	knownTags := map[string]bool{}
	for _, n := range StandardLabelNames {
		knownTags[n] = true
	}
	for _, m := range cfg.Metrics {
		for t := range m.Dimensions {
			knownTags[t] = true
		}
	}
	for i, m := range cfg.Metrics {
		if err := b.override(i, m, knownTags); err != nil {
			return nil, err
		}
	}
	b.metricPlans(cfg.StatPrefix)
	b.pl.Attributes = b.attrs.Attributes()
	b.headerSlots()
	return b.pl, nil
}

// planBuilder is Build's work in progress.
type planBuilder struct {
	pl        *Plan
	attrs     *Resolver
	factories []*factory
	dimIndex  map[string]int // dimensions by expression source
}

func (b *planBuilder) byName(name string) *factory {
	for _, f := range b.factories {
		if f.name == name {
			return f
		}
	}
	return nil
}

// define applies definitions[i]: a new metric, or a new type and value for a standard one.
func (b *planBuilder) define(i int, d MetricDefinition) error {
	where := fmt.Sprintf("definitions[%d]", i)
	if d.Name != "" {
		where += fmt.Sprintf(" (%s)", d.Name)
	}
	if !expr.IsIdentifier(d.Name) {
		return fmt.Errorf("%s: name %q must be letters, digits and underscores", where, d.Name)
	}
	var kind Kind
	switch d.Type {
	case "", "COUNTER": // Istio's default
	case "GAUGE":
		kind = Gauge
	case "HISTOGRAM":
		kind = Histogram
	default:
		return fmt.Errorf("%s: type %q must be COUNTER, GAUGE or HISTOGRAM", where, d.Type)
	}
	if strings.TrimSpace(d.Value) == "" {
		return fmt.Errorf("%s: value expression is empty", where)
	}
	e, err := expr.Compile(d.Value, b.attrs.Resolve)
	if err != nil {
		return fmt.Errorf("%s: value expression %q: %w", where, d.Value, err)
	}
	if e.Type() != expr.Int {
		return fmt.Errorf("%s: value expression %q is a %s, a metric value must be an int", where, d.Value, e.Type())
	}
	f := b.byName(d.Name)
	if f == nil {
		f = newFactory(d.Name, kind, ValueExpr)
		b.factories = append(b.factories, f)
	}
	f.kind, f.value, f.valueExpr = kind, ValueExpr, e
	return nil
}

// override applies metrics[i] to the metric it names (every metric when none): tags
// removed, then dimensions added (sorted, as Istio sorts them), or the metric dropped.
func (b *planBuilder) override(i int, m MetricConfig, knownTags map[string]bool) error {
	where := fmt.Sprintf("metrics[%d]", i)
	if m.Name != "" {
		where += fmt.Sprintf(" (%s)", m.Name)
		if b.byName(m.Name) == nil {
			names := make([]string, len(b.factories))
			for j, f := range b.factories {
				names[j] = f.name
			}
			return fmt.Errorf("%s: unknown metric %q (metrics are %s)", where, m.Name, strings.Join(names, ", "))
		}
	}
	for _, t := range m.TagsToRemove {
		if !knownTags[t] {
			return fmt.Errorf("%s: tags_to_remove: unknown tag %q", where, t)
		}
	}
	dims := make([]string, 0, len(m.Dimensions))
	for t := range m.Dimensions {
		dims = append(dims, t)
	}
	sort.Strings(dims)
	dimValue := make(map[string]int, len(dims))
	for _, t := range dims {
		idx, err := b.dimension(where, t, m.Dimensions[t])
		if err != nil {
			return err
		}
		dimValue[t] = NumStandardLabels + idx
	}
	for _, f := range b.factories {
		if m.Name != "" && m.Name != f.name {
			continue
		}
		for _, t := range m.TagsToRemove {
			if _, ok := f.index[t]; ok {
				f.index[t] = -1
			}
		}
		for _, t := range dims {
			if _, ok := f.index[t]; !ok {
				f.tags = append(f.tags, t)
			}
			f.index[t] = dimValue[t]
		}
		if m.Drop {
			f.dropped = true
		}
	}
	return nil
}

// dimension returns the index of the dimension whose expression is src, compiling it the
// first time.
func (b *planBuilder) dimension(where, tag, src string) (int, error) {
	if !expr.IsIdentifier(tag) {
		return 0, fmt.Errorf("%s: dimension name %q must be letters, digits and underscores", where, tag)
	}
	if idx, ok := b.dimIndex[src]; ok {
		return idx, nil
	}
	if strings.TrimSpace(src) == "" {
		return 0, fmt.Errorf("%s: dimension %q: expression is empty", where, tag)
	}
	e, err := expr.Compile(src, b.attrs.Resolve)
	if err != nil {
		return 0, fmt.Errorf("%s: dimension %q: expression %q: %w", where, tag, src, err)
	}
	idx := len(b.pl.Dimensions)
	b.dimIndex[src] = idx
	b.pl.Dimensions = append(b.pl.Dimensions, e)
	return idx, nil
}

// metricPlans turns the metrics left (not dropped) into the plan's metrics, grouping those
// that share a tag list.
func (b *planBuilder) metricPlans(statPrefix string) {
	pl := b.pl
	groupOf := map[string]int{}
	for _, f := range b.factories {
		if f.dropped {
			continue
		}
		mp := Metric{Name: f.name, FullName: f.name, Kind: f.kind, Value: f.value, ValueExpr: f.valueExpr, TCP: f.tcp}
		if statPrefix != "" {
			mp.FullName = statPrefix + "_" + f.name
		}
		var sig strings.Builder
		if f.tcp {
			sig.WriteString("tcp;")
		}
		for _, t := range f.tags {
			idx := f.index[t]
			if idx < 0 {
				continue
			}
			mp.Tags = append(mp.Tags, Tag{Name: t, Index: idx})
			if idx < NumStandardLabels {
				pl.UsedLabels[idx] = true
			}
			fmt.Fprintf(&sig, "%s=%d;", t, idx)
		}
		if f.value == ValueDurationMs {
			pl.NeedDuration = true
		}
		g, ok := groupOf[sig.String()]
		if !ok {
			g = len(pl.Groups)
			groupOf[sig.String()] = g
			pl.Groups = append(pl.Groups, nil)
		}
		mp.Group = g
		pl.Groups[g] = append(pl.Groups[g], len(pl.Metrics))
		pl.Metrics = append(pl.Metrics, mp)
	}
}

// headerSlots lists the attribute slots read from headers and trailers.
func (b *planBuilder) headerSlots() {
	pl := b.pl
	for s, a := range pl.Attributes {
		switch a.Source {
		case SourceRequestHeader:
			pl.RequestHeaderSlots = append(pl.RequestHeaderSlots, s)
		case SourceResponseHeader:
			pl.ResponseHeaderSlots = append(pl.ResponseHeaderSlots, s)
		case SourceResponseTrailer:
			pl.ResponseTrailerSlots = append(pl.ResponseTrailerSlots, s)
		}
	}
}

// Describe renders the plan for people, golden tests and debug logs: the reporter and
// limits, the metrics with their types and values, then each group of metrics sharing a
// tag list, with the tags in the order they are encoded, where each value comes from
// (a standard label under its own name or another, or a dimension expression), and the
// encoded name ([Metric.NameTemplate]).
func (pl *Plan) Describe() string {
	var b strings.Builder
	if pl.Reporter == "" {
		b.WriteString("reporter: from listener_direction\n")
	} else {
		fmt.Fprintf(&b, "reporter: %s\n", pl.Reporter)
	}
	fmt.Fprintf(&b, "host header fallback: %t\nmax label sets per metric: %d\nmax peer cache size: %d\n",
		pl.UseHostHeader, pl.MaxLabelSets, pl.MaxPeerCache)
	if pl.Network {
		fmt.Fprintf(&b, "network filter: TCP connections, reported every %v\n", pl.TCPReportingDuration)
	}
	b.WriteString("\nmetrics:\n")
	for _, m := range pl.Metrics {
		fmt.Fprintf(&b, "  %s %s = ", m.FullName, m.Kind)
		switch m.Value {
		case ValueOne:
			b.WriteString("1")
		case ValueDurationMs:
			b.WriteString("request duration in ms")
		case ValueRequestBytes:
			b.WriteString("request.total_size")
		case ValueResponseBytes:
			b.WriteString("response.total_size")
		case ValueExpr:
			b.WriteString(m.ValueExpr.String())
		case ValueConnectionOpened:
			b.WriteString("1 per connection opened")
		case ValueConnectionClosed:
			b.WriteString("1 per connection closed")
		case ValueReceivedBytes:
			b.WriteString("bytes received from the downstream")
		case ValueSentBytes:
			b.WriteString("bytes sent to the downstream")
		}
		fmt.Fprintf(&b, " (group %d)\n", m.Group)
	}
	for g, ms := range pl.Groups {
		fmt.Fprintf(&b, "\ngroup %d tags:\n", g)
		m := &pl.Metrics[ms[0]]
		for _, t := range m.Tags {
			switch {
			case t.Index >= NumStandardLabels:
				fmt.Fprintf(&b, "  %s = %s\n", t.Name, pl.Dimensions[t.Index-NumStandardLabels])
			case t.Name != StandardLabelNames[t.Index]:
				fmt.Fprintf(&b, "  %s = standard %s\n", t.Name, StandardLabelNames[t.Index])
			default:
				fmt.Fprintf(&b, "  %s\n", t.Name)
			}
		}
		fmt.Fprintf(&b, "group %d name: %s\n", g, m.NameTemplate("{metric}"))
	}
	return b.String()
}

// NameTemplate is the metric's encoded name with {tag} placeholders for the values and
// metric in place of the metric's own name (FullName, as the filter defines it).
func (m *Metric) NameTemplate(metric string) string {
	var b strings.Builder
	for _, t := range m.Tags {
		fmt.Fprintf(&b, "%s%s{%s}%s", t.Name, ValueSeparator, t.Name, FieldSeparator)
	}
	b.WriteString(metric)
	return b.String()
}
