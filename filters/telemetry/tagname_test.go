package main

import (
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// extractTags does what Envoy does with the stats_tags rules (NAME=\.=(.*?);\.;) the
// agent writes for this filter: every rule is matched against the full name, its first
// group is cut out and its second group is the tag value.
func extractTags(t testing.TB, name string, tagNames []string) (string, map[string]string) {
	t.Helper()
	type cut struct{ from, to int }
	var cuts []cut
	tags := map[string]string{}
	for _, tn := range tagNames {
		re := regexp.MustCompile(`(` + regexp.QuoteMeta(tn) + `=\.=(.*?);\.;)`)
		m := re.FindStringSubmatchIndex(name)
		if m == nil {
			continue
		}
		_, dup := tags[tn]
		require.False(t, dup, "tag %s extracted twice", tn)
		tags[tn] = name[m[4]:m[5]]
		cuts = append(cuts, cut{m[2], m[3]})
	}
	sort.Slice(cuts, func(i, j int) bool { return cuts[i].from < cuts[j].from })
	var rest strings.Builder
	at := 0
	for _, c := range cuts {
		require.GreaterOrEqual(t, c.from, at, "overlapping tag matches in %q", name)
		rest.WriteString(name[at:c.from])
		at = c.to
	}
	rest.WriteString(name[at:])
	return rest.String(), tags
}

func TestSanitizeTagValue(t *testing.T) {
	long := strings.Repeat("a", maxTagValueLen-1) + "é" // the é straddles the limit
	for _, tc := range []struct{ in, want string }{
		{"productpage.default.svc.cluster.local", "productpage.default.svc.cluster.local"},
		{"", ""},
		{".", "."},
		{"a;.;b", "a;_;b"},
		{"a=.=b", "a=_=b"},
		{";.;.;", ";_;_;"},
		{"x;.", "x;_"}, // would end early: x;. + ;.; contains ;.;
		{".=x", "_=x"}, // would start a tag: =.= + .=x contains =.=
		{"x;", "x;"},   // x; + ;.; is x;;.; which still ends at the right place
		{"=.", "=."},   // followed by ';', not '='
		{"1.5;.x", "1.5;.x"},
		{long, strings.Repeat("a", maxTagValueLen-1)},
		{strings.Repeat("b", 300), strings.Repeat("b", maxTagValueLen)},
	} {
		assert.Equal(t, tc.want, sanitizeTagValue(tc.in), "value %q", tc.in)
	}
}

// TestEncodedNamesSurviveTagExtraction feeds hostile values through the encoding and
// Envoy's extraction: every tag must come back as its sanitized value and the name must
// be the bare metric name.
func TestEncodedNamesSurviveTagExtraction(t *testing.T) {
	names := []string{"reporter", "source_workload", "request_host", "user", "destination_service", "destination_service_name"}
	hostile := []string{
		"", ".", ";", "=", ";.;", "=.=", "x;.", ".=x", "user=.=evil;.;", "reporter=.=source",
		";.;reporter=.=source;.;", "a=.;.;", "=.=.=.=", "é;.;ü", "destination_service=.=x",
		strings.Repeat(";.", 200), "x=", "x=.", ".;", "..;..=..",
	}
	for _, v := range hostile {
		for pos := range names {
			var buf []byte
			want := map[string]string{}
			for i, n := range names {
				val := "plain"
				if i == pos {
					val = v
				}
				buf = appendTag(buf, n, val)
				want[n] = sanitizeTagValue(val)
			}
			name := "wasmcustom." + string(buf) + "istio_requests_total"
			rest, got := extractTags(t, name, names)
			assert.Equal(t, "wasmcustom.istio_requests_total", rest, "value %q in tag %s", v, names[pos])
			assert.Equal(t, want, got, "value %q in tag %s", v, names[pos])
		}
	}
}

func TestOverflowNameExtractsMetricTag(t *testing.T) {
	name := overflowName("istio_requests_total")
	assert.Equal(t, "metric=.=istio_requests_total;.;wasmesh_telemetry_overflow_total", name)
	re := regexp.MustCompile(`(metric=\.=(.*?);\.;)wasmesh_telemetry_overflow_total$`)
	m := re.FindStringSubmatch("wasmcustom." + name)
	require.NotNil(t, m)
	assert.Equal(t, "istio_requests_total", m[2])
}
