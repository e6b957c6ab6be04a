package main

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// tagRule is a compiled stats_tags entry. Envoy compiles these with std::regex; rules
// that RE2 cannot compile (Envoy's lookahead defaults) are skipped here, which only loses
// labels on Envoy's own dotted names, not on filter-encoded ones.
type tagRule struct {
	name string
	re   *regexp.Regexp
}

func compileTags(doc *bootstrapDoc) []tagRule {
	var out []tagRule
	for _, t := range doc.StatsConfig.StatsTags {
		re, err := regexp.Compile(t.Regex)
		if err != nil {
			continue
		}
		out = append(out, tagRule{name: t.TagName, re: re})
	}
	return out
}

type label struct{ name, value string }

// stat is one counter or gauge; the Prometheus name and labels are extracted once, when
// the stat is created, as Envoy does.
type stat struct {
	name   string
	gauge  bool
	value  atomic.Int64
	used   atomic.Bool
	family string
	labels []label
}

func (s *stat) add(d int64) { s.value.Add(d); s.used.Store(true) }
func (s *stat) set(v int64) { s.value.Store(v); s.used.Store(true) }

type statStore struct {
	rules []tagRule
	mu    sync.Mutex
	stats map[string]*stat
}

func newStatStore(rules []tagRule) *statStore {
	return &statStore{rules: rules, stats: map[string]*stat{}}
}

func (st *statStore) get(name string, gauge bool) *stat {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s, ok := st.stats[name]; ok {
		return s
	}
	s := &stat{name: name, gauge: gauge}
	s.family, s.labels = st.extract(name)
	st.stats[name] = s
	return s
}

// extract applies the tag rules: the first matched capture group is cut from the name;
// the one after it (or itself, when there is none) is the value.
func (st *statStore) extract(name string) (string, []label) {
	var labels []label
	for _, r := range st.rules {
		m := r.re.FindStringSubmatchIndex(name)
		if m == nil {
			continue
		}
		for g := 1; g*2+1 < len(m); g++ {
			if m[2*g] < 0 {
				continue
			}
			cutFrom, cutTo := m[2*g], m[2*g+1]
			val := name[cutFrom:cutTo]
			if 2*(g+1)+1 < len(m) && m[2*(g+1)] >= 0 {
				val = name[m[2*(g+1)]:m[2*(g+1)+1]]
			}
			labels = append(labels, label{r.name, val})
			name = name[:cutFrom] + name[cutTo:]
			break
		}
	}
	prefix := "envoy_"
	if rest, ok := strings.CutPrefix(name, "wasmcustom."); ok {
		name, prefix = rest, ""
	}
	return prefix + sanitize(name), labels
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' && i > 0) {
			b[i] = '_'
		}
	}
	return string(b)
}

func (st *statStore) snapshot() []*stat {
	st.mu.Lock()
	out := make([]*stat, 0, len(st.stats))
	for _, s := range st.stats {
		out = append(out, s)
	}
	st.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// text renders GET /stats: "name: value" lines.
func (st *statStore) text(usedOnly bool, filter *regexp.Regexp) string {
	var b strings.Builder
	for _, s := range st.snapshot() {
		if usedOnly && !s.used.Load() {
			continue
		}
		if filter != nil && !filter.MatchString(s.name) {
			continue
		}
		fmt.Fprintf(&b, "%s: %d\n", s.name, s.value.Load())
	}
	return b.String()
}

// prometheus renders GET /stats/prometheus, one # TYPE line per family.
func (st *statStore) prometheus() []byte {
	byFamily := map[string][]*stat{}
	var families []string
	for _, s := range st.snapshot() {
		if _, ok := byFamily[s.family]; !ok {
			families = append(families, s.family)
		}
		byFamily[s.family] = append(byFamily[s.family], s)
	}
	sort.Strings(families)
	var b strings.Builder
	for _, f := range families {
		ss := byFamily[f]
		typ := "counter"
		if ss[0].gauge {
			typ = "gauge"
		}
		fmt.Fprintf(&b, "# TYPE %s %s\n", f, typ)
		for _, s := range ss {
			b.WriteString(f)
			if len(s.labels) > 0 {
				b.WriteByte('{')
				for i, l := range s.labels {
					if i > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, "%s=%q", sanitize(l.name), l.value)
				}
				b.WriteByte('}')
			}
			fmt.Fprintf(&b, " %d\n", s.value.Load())
		}
	}
	return []byte(b.String())
}
