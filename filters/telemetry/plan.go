package main

import (
	"fmt"
	"sort"
	"strings"
)

// A plan is what a configuration means, worked out once at configure time: which metrics
// exist, their tags in order and where each tag's value comes from, the expressions to
// evaluate and the attributes they read. The request path only follows it.

type metricKind uint8

const (
	kindCounter metricKind = iota
	kindGauge
	kindHistogram
)

func (k metricKind) String() string {
	switch k {
	case kindGauge:
		return "GAUGE"
	case kindHistogram:
		return "HISTOGRAM"
	}
	return "COUNTER"
}

// valueSource says what a metric records per request.
type valueSource uint8

const (
	valueOne           valueSource = iota // 1 per request (requests_total)
	valueDurationMs                       // request duration in milliseconds
	valueRequestBytes                     // request.total_size
	valueResponseBytes                    // response.total_size
	valueExpr                             // a configured int expression
)

// tagPlan is one tag of a metric: its name and the index of its value in the request's
// value vector (standard labels first, then the configured dimensions).
type tagPlan struct {
	name  string
	index int
}

type metricPlan struct {
	name      string // as configured: requests_total
	fullName  string // as reported: istio_requests_total
	kind      metricKind
	value     valueSource
	valueSrc  string // the value expression, for valueExpr
	valueExpr expression
	tags      []tagPlan
	group     int // metrics with identical tags share a group, see registry.go
}

// dimension is a configured tag expression, shared by every metric that uses the same
// expression text (as Istio does).
type dimension struct {
	src  string
	expr expression
}

type plan struct {
	metrics []metricPlan
	groups  [][]int // metric indices with identical tag lists
	dims    []dimension
	attrs   []*attribute // expression attributes by slot

	// usedLabels marks the standard labels some metric reports, so the request path
	// reads only the properties those need.
	usedLabels                                        [numStandardLabels]bool
	needDuration, needRequestBytes, needResponseBytes bool

	reporter      string // "", reporterSource or reporterDest
	useHostHeader bool
	maxLabelSets  int
	maxPeerCache  int

	// Slots captured in the header callbacks.
	requestHeaderSlots, responseHeaderSlots, responseTrailerSlots []int
}

// factory is a metric while the configuration is being applied, before removed tags are
// dropped. index maps a tag to its value index, -1 once removed (a later override may
// bring it back in its original position, as in Istio).
type factory struct {
	name      string
	kind      metricKind
	value     valueSource
	valueSrc  string
	valueExpr expression
	tags      []string
	index     map[string]int
	dropped   bool
}

func newFactory(name string, kind metricKind, v valueSource) *factory {
	f := &factory{name: name, kind: kind, value: v, index: map[string]int{}}
	for i, n := range standardLabelNames {
		f.tags = append(f.tags, n)
		f.index[n] = i
	}
	return f
}

// loadPlan parses a plugin configuration and works out its plan.
func loadPlan(data []byte, node nodeReader) (*plan, error) {
	cfg, err := parseConfig(data)
	if err == nil {
		var pl *plan
		if pl, err = buildPlan(cfg, node); err == nil {
			return pl, nil
		}
	}
	return nil, fmt.Errorf("plugin configuration: %w", err)
}

// buildPlan applies cfg in Istio's order: the standard metrics, then definitions (new
// metrics get the standard labels), then the metric overrides in order, each removing
// tags before adding dimensions.
func buildPlan(cfg config, node nodeReader) (*plan, error) {
	b := &planBuilder{
		pl: &plan{
			reporter:      cfg.Reporter,
			useHostHeader: !cfg.DisableHostHeaderFallback,
			maxLabelSets:  cfg.MaxLabelSetsPerMetric,
			maxPeerCache:  cfg.MaxPeerCacheSize,
		},
		node:  node,
		slots: map[string]int{},
		factories: []*factory{
			newFactory("requests_total", kindCounter, valueOne),
			newFactory("request_duration_milliseconds", kindHistogram, valueDurationMs),
			newFactory("request_bytes", kindHistogram, valueRequestBytes),
			newFactory("response_bytes", kindHistogram, valueResponseBytes),
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
	for _, n := range standardLabelNames {
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
	b.headerSlots()
	return b.pl, nil
}

// planBuilder is buildPlan's work in progress.
type planBuilder struct {
	pl        *plan
	node      nodeReader
	slots     map[string]int // attribute slots by name
	factories []*factory
	dimIndex  map[string]int // dimensions by expression source
}

// resolve gives an attribute path its slot (one per attribute, shared by expressions).
func (b *planBuilder) resolve(path []string) (int, valType, error) {
	a, err := lookupAttribute(path, b.node)
	if err != nil {
		return 0, 0, err
	}
	if s, ok := b.slots[a.name]; ok {
		return s, a.typ, nil
	}
	s := len(b.pl.attrs)
	b.slots[a.name] = s
	b.pl.attrs = append(b.pl.attrs, a)
	return s, a.typ, nil
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
func (b *planBuilder) define(i int, d metricDefinition) error {
	where := fmt.Sprintf("definitions[%d]", i)
	if d.Name != "" {
		where += fmt.Sprintf(" (%s)", d.Name)
	}
	if !isIdentifier(d.Name) {
		return fmt.Errorf("%s: name %q must be letters, digits and underscores", where, d.Name)
	}
	var kind metricKind
	switch d.Type {
	case "", "COUNTER": // Istio's default
	case "GAUGE":
		kind = kindGauge
	case "HISTOGRAM":
		kind = kindHistogram
	default:
		return fmt.Errorf("%s: type %q must be COUNTER, GAUGE or HISTOGRAM", where, d.Type)
	}
	if strings.TrimSpace(d.Value) == "" {
		return fmt.Errorf("%s: value expression is empty", where)
	}
	e, err := compileExpr(d.Value, b.resolve)
	if err != nil {
		return fmt.Errorf("%s: value expression %q: %w", where, d.Value, err)
	}
	if e.typ() != typeInt {
		return fmt.Errorf("%s: value expression %q is a %s, a metric value must be an int", where, d.Value, e.typ())
	}
	f := b.byName(d.Name)
	if f == nil {
		f = newFactory(d.Name, kind, valueExpr)
		b.factories = append(b.factories, f)
	}
	f.kind, f.value, f.valueSrc, f.valueExpr = kind, valueExpr, d.Value, e
	return nil
}

// override applies metrics[i] to the metric it names (every metric when none): tags
// removed, then dimensions added (sorted, as Istio sorts them), or the metric dropped.
func (b *planBuilder) override(i int, m metricConfig, knownTags map[string]bool) error {
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
		dimValue[t] = numStandardLabels + idx
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
	if !isIdentifier(tag) {
		return 0, fmt.Errorf("%s: dimension name %q must be letters, digits and underscores", where, tag)
	}
	if idx, ok := b.dimIndex[src]; ok {
		return idx, nil
	}
	if strings.TrimSpace(src) == "" {
		return 0, fmt.Errorf("%s: dimension %q: expression is empty", where, tag)
	}
	e, err := compileExpr(src, b.resolve)
	if err != nil {
		return 0, fmt.Errorf("%s: dimension %q: expression %q: %w", where, tag, src, err)
	}
	idx := len(b.pl.dims)
	b.dimIndex[src] = idx
	b.pl.dims = append(b.pl.dims, dimension{src: src, expr: e})
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
		mp := metricPlan{
			name: f.name, fullName: f.name, kind: f.kind,
			value: f.value, valueSrc: f.valueSrc, valueExpr: f.valueExpr,
		}
		if statPrefix != "" {
			mp.fullName = statPrefix + "_" + f.name
		}
		var sig strings.Builder
		for _, t := range f.tags {
			idx := f.index[t]
			if idx < 0 {
				continue
			}
			mp.tags = append(mp.tags, tagPlan{name: t, index: idx})
			if idx < numStandardLabels {
				pl.usedLabels[idx] = true
			}
			fmt.Fprintf(&sig, "%s=%d;", t, idx)
		}
		switch f.value {
		case valueDurationMs:
			pl.needDuration = true
		case valueRequestBytes:
			pl.needRequestBytes = true
		case valueResponseBytes:
			pl.needResponseBytes = true
		}
		g, ok := groupOf[sig.String()]
		if !ok {
			g = len(pl.groups)
			groupOf[sig.String()] = g
			pl.groups = append(pl.groups, nil)
		}
		mp.group = g
		pl.groups[g] = append(pl.groups[g], len(pl.metrics))
		pl.metrics = append(pl.metrics, mp)
	}
}

// headerSlots lists the attribute slots read from headers and trailers.
func (b *planBuilder) headerSlots() {
	pl := b.pl
	for s, a := range pl.attrs {
		switch a.src {
		case srcRequestHeader:
			pl.requestHeaderSlots = append(pl.requestHeaderSlots, s)
		case srcResponseHeader:
			pl.responseHeaderSlots = append(pl.responseHeaderSlots, s)
		case srcResponseTrailer:
			pl.responseTrailerSlots = append(pl.responseTrailerSlots, s)
		}
	}
}

// describe renders the plan for golden tests and debug logs: the metrics with their
// types and values, then each group of metrics sharing a tag list, with the tags in name
// order, where each value comes from, and the encoded name.
func (pl *plan) describe() string {
	var b strings.Builder
	if pl.reporter == "" {
		b.WriteString("reporter: from listener_direction\n")
	} else {
		fmt.Fprintf(&b, "reporter: %s\n", pl.reporter)
	}
	fmt.Fprintf(&b, "host header fallback: %t\nmax label sets per metric: %d\nmax peer cache size: %d\n\nmetrics:\n",
		pl.useHostHeader, pl.maxLabelSets, pl.maxPeerCache)
	for _, m := range pl.metrics {
		fmt.Fprintf(&b, "  %s %s = ", m.fullName, m.kind)
		switch m.value {
		case valueOne:
			b.WriteString("1")
		case valueDurationMs:
			b.WriteString("request duration in ms")
		case valueRequestBytes:
			b.WriteString("request.total_size")
		case valueResponseBytes:
			b.WriteString("response.total_size")
		case valueExpr:
			b.WriteString(m.valueSrc)
		}
		fmt.Fprintf(&b, " (group %d)\n", m.group)
	}
	for g, ms := range pl.groups {
		fmt.Fprintf(&b, "\ngroup %d tags:\n", g)
		m := &pl.metrics[ms[0]]
		for _, t := range m.tags {
			switch {
			case t.index >= numStandardLabels:
				fmt.Fprintf(&b, "  %s = %s\n", t.name, pl.dims[t.index-numStandardLabels].src)
			case t.name != standardLabelNames[t.index]:
				fmt.Fprintf(&b, "  %s = standard %s\n", t.name, standardLabelNames[t.index])
			default:
				fmt.Fprintf(&b, "  %s\n", t.name)
			}
		}
		fmt.Fprintf(&b, "group %d name: %s\n", g, m.nameTemplate("{metric}"))
	}
	return b.String()
}

// nameTemplate is the encoded metric name with {tag} placeholders for the values and
// metric for the metric's own name.
func (m *metricPlan) nameTemplate(metric string) string {
	var b strings.Builder
	for _, t := range m.tags {
		fmt.Fprintf(&b, "%s%s{%s}%s", t.name, valueSeparator, t.name, fieldSeparator)
	}
	b.WriteString(metric)
	return b.String()
}
