package stats

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// Tag is one extracted tag.
type Tag struct{ Name, Value string }

type tagRule struct {
	name string
	re   submatcher
}

// submatcher finds the leftmost match of a tag regex, as FindStringSubmatchIndex reports it.
type submatcher interface {
	FindStringSubmatchIndex(s string) []int
}

// compileTagRegex compiles a stats_tags regex. Envoy evaluates them with std::regex
// (ECMAScript), and Istio's bootstrap uses its look-aheads, which RE2 lacks: a regex RE2
// accepts runs on RE2 (same leftmost-first result, much faster), any other on an
// ECMAScript engine.
func compileTagRegex(expr string) (submatcher, int, error) {
	if re, err := regexp.Compile(expr); err == nil {
		return re, re.NumSubexp(), nil
	}
	// std::regex's ECMAScript grammar has POSIX classes inside brackets; regexp2's has not.
	re, err := regexp2.Compile(posixClasses.Replace(expr), regexp2.ECMAScript)
	if err != nil {
		return nil, 0, err
	}
	re.MatchTimeout = time.Second // a pathological regex cannot hang the stats page
	return ecmaRegex{re}, len(re.GetGroupNumbers()) - 1, nil
}

var posixClasses = strings.NewReplacer("[:digit:]", "0-9", "[:alpha:]", "a-zA-Z", "[:alnum:]", "a-zA-Z0-9",
	"[:upper:]", "A-Z", "[:lower:]", "a-z", "[:space:]", `\s`, "[:xdigit:]", "0-9a-fA-F")

type ecmaRegex struct{ re *regexp2.Regexp }

// FindStringSubmatchIndex converts regexp2's rune offsets into byte offsets.
func (e ecmaRegex) FindStringSubmatchIndex(s string) []int {
	m, err := e.re.FindStringMatch(s)
	if err != nil || m == nil {
		return nil
	}
	groups := m.Groups()
	idx := make([]int, 2*len(groups))
	for i, g := range groups {
		if len(g.Captures) == 0 {
			idx[2*i], idx[2*i+1] = -1, -1
			continue
		}
		from := byteOffset(s, g.Index)
		idx[2*i], idx[2*i+1] = from, from+len(string([]rune(s[from:])[:g.Length]))
	}
	return idx
}

func byteOffset(s string, runes int) int {
	off := 0
	for i := 0; i < runes && off < len(s); i++ {
		_, n := utf8.DecodeRuneInString(s[off:])
		off += n
	}
	return off
}

// TagExtractor turns a stat name into a tag-extracted name and tags, Envoy's way: every
// rule is matched against the full name; the first capture group is removed from the name
// and the second (or the first, when there is only one) is the tag value. A tag name is
// extracted at most once, by the first rule that matches.
type TagExtractor struct {
	rules []tagRule
	fixed []Tag
}

// defaultTagRules are the Envoy default tag extractors the mesh's stats meet, with the
// look-aheads of Envoy's std::regex versions rewritten for RE2.
var defaultTagRules = [][2]string{
	{"envoy.response_code", `_rq(_(\d{3}))$`},
	{"envoy.response_code_class", `_rq_(\d)xx$`},
	{"envoy.http_user_agent", `^http\..*?\.user_agent\.((.*?)\.)\w+?$`},
	{"envoy.virtual_cluster", `^vhost\..*?\.vcluster\.((.*?)\.)\w+?$`},
	{"envoy.fault_downstream_cluster", `^http\..*?\.fault\.((.*?)\.)\w+?$`},
	{"envoy.tcp_prefix", `^tcp\.((.*?)\.)\w+?$`},
	{"envoy.cluster_name", `^cluster\.(([^\.]+)\.).*`},
	{"envoy.http_conn_manager_prefix", `^listener\..*?\.http\.((.*?)\.)`},
	{"envoy.http_conn_manager_prefix", `^http\.((.*?)\.)`},
	{"envoy.listener_address", `^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`},
	{"envoy.virtual_host", `^vhost\.((.*?)\.)`},
	{"envoy.rds_route_config", `^http\..*?\.rds\.((.*?)\.)\w+?$`},
	{"envoy.worker_id", `^listener_manager\.((worker_\d+)\.)`},
}

// DefaultTagExtractor is Envoy's default (use_all_default_tags, no custom tags).
func DefaultTagExtractor() *TagExtractor {
	t, err := NewTagExtractor(nil)
	if err != nil {
		panic(err) // the default rules are constants
	}
	return t
}

// NewTagExtractor builds the extractor of a bootstrap's stats_config: its stats_tags first
// (a custom rule replaces the default of the same name), then Envoy's defaults unless
// use_all_default_tags is false.
func NewTagExtractor(cfg *metricsv3.StatsConfig) (*TagExtractor, error) {
	t := &TagExtractor{}
	custom := map[string]bool{}
	for i, st := range cfg.GetStatsTags() {
		name := st.GetTagName()
		if name == "" {
			return nil, fmt.Errorf("stats_config.stats_tags[%d]: tag_name is empty", i)
		}
		switch v := st.GetTagValue().(type) {
		case *metricsv3.TagSpecifier_FixedValue:
			t.fixed = append(t.fixed, Tag{Name: name, Value: v.FixedValue})
		case *metricsv3.TagSpecifier_Regex:
			re, groups, err := compileTagRegex(v.Regex)
			if err != nil {
				return nil, fmt.Errorf("stats_config.stats_tags[%d] (%s): regex: %w", i, name, err)
			}
			if groups < 1 {
				return nil, fmt.Errorf("stats_config.stats_tags[%d] (%s): regex %q has no capture group", i, name, v.Regex)
			}
			t.rules = append(t.rules, tagRule{name: name, re: re})
		default:
			return nil, fmt.Errorf("stats_config.stats_tags[%d] (%s): neither regex nor fixed_value", i, name)
		}
		custom[name] = true
	}
	if cfg.GetUseAllDefaultTags() == nil || cfg.GetUseAllDefaultTags().GetValue() {
		for _, d := range defaultTagRules {
			if custom[d[0]] {
				continue
			}
			t.rules = append(t.rules, tagRule{name: d[0], re: regexp.MustCompile(d[1])})
		}
	}
	return t, nil
}

// Extract returns the tag-extracted name and the tags of name.
func (t *TagExtractor) Extract(name string) (string, []Tag) {
	type span struct{ from, to int }
	var removed []span
	var tags []Tag
	seen := map[string]bool{}
	for _, r := range t.rules {
		if seen[r.name] {
			continue
		}
		m := r.re.FindStringSubmatchIndex(name)
		if m == nil || m[2] < 0 {
			continue
		}
		value := name[m[2]:m[3]]
		if len(m) >= 6 && m[4] >= 0 {
			value = name[m[4]:m[5]]
		}
		seen[r.name] = true
		tags = append(tags, Tag{Name: r.name, Value: value})
		removed = append(removed, span{m[2], m[3]})
	}
	tags = append(tags, t.fixed...)
	if len(removed) == 0 {
		return name, tags
	}
	sort.Slice(removed, func(i, j int) bool { return removed[i].from < removed[j].from })
	var b strings.Builder
	at := 0
	for _, s := range removed {
		if s.from > at {
			b.WriteString(name[at:s.from])
		}
		if s.to > at {
			at = s.to
		}
	}
	b.WriteString(name[at:])
	return b.String(), tags
}

// Matcher is the stats matcher: which stats are instantiated.
type Matcher struct {
	rejectAll bool
	inclusion []*matcherv3.StringMatcher
	exclusion []*matcherv3.StringMatcher
}

// NewMatcher compiles a bootstrap's stats_matcher (nil accepts everything).
func NewMatcher(m *metricsv3.StatsMatcher) (*Matcher, error) {
	if m == nil {
		return nil, nil
	}
	out := &Matcher{rejectAll: m.GetRejectAll()}
	out.inclusion = m.GetInclusionList().GetPatterns()
	out.exclusion = m.GetExclusionList().GetPatterns()
	for _, p := range append(append([]*matcherv3.StringMatcher(nil), out.inclusion...), out.exclusion...) {
		if r := p.GetSafeRegex(); r != nil {
			if _, err := regexp.Compile(r.GetRegex()); err != nil {
				return nil, fmt.Errorf("stats_config.stats_matcher: regex %q: %w", r.GetRegex(), err)
			}
		}
	}
	return out, nil
}

// Accepts reports whether a stat of that name is instantiated.
func (m *Matcher) Accepts(name string) bool {
	if m == nil {
		return true
	}
	if m.rejectAll {
		return false
	}
	if len(m.inclusion) > 0 {
		return matchAny(m.inclusion, name)
	}
	if len(m.exclusion) > 0 {
		return !matchAny(m.exclusion, name)
	}
	return true
}

func matchAny(ms []*matcherv3.StringMatcher, s string) bool {
	for _, m := range ms {
		if MatchString(m, s) {
			return true
		}
	}
	return false
}

// MatchString evaluates an Envoy StringMatcher.
func MatchString(m *matcherv3.StringMatcher, s string) bool {
	v := s
	if m.GetIgnoreCase() {
		v = strings.ToLower(s)
	}
	low := func(p string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(p)
		}
		return p
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return v == low(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(v, low(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(v, low(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(v, low(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := regexp.Compile("^(?:" + p.SafeRegex.GetRegex() + ")$")
		return err == nil && re.MatchString(s)
	}
	return false
}
