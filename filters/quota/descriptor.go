package main

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/wasmesh/wasmesh/filters/internal/ratelimit"
)

const (
	// keyPrefix starts every shared-data key of this filter.
	keyPrefix = "wasmesh.quota/"
	// maxBucketsPerDescriptor bounds the buckets a VM remembers per descriptor (their
	// keys, resolved override and tick refresh). Past it, a new value still gets its own
	// bucket but its key is built per request and the tick does not refresh it.
	maxBucketsPerDescriptor = 1024
	// maxValueInKey: longer values are hashed so that keys stay short.
	maxValueInKey = 64
)

// bucket is a resolved descriptor value: its key and the policy that applies to it.
type bucket struct {
	key    string
	policy *ratelimit.Policy
	shadow bool
}

type descriptorRuntime struct {
	prefix  string
	buckets map[string]*bucket // by key
	metrics struct {
		allowed, denied, shadowDenied, casExhausted, storeError proxywasm.MetricCounter
	}
	global globalMetrics // modes global and both
}

// start prepares the descriptor for requests: key prefix and metrics.
func (d *descriptor) start(scope string) {
	d.rt.prefix = keyPrefix + scope + "/" + d.name
	d.rt.buckets = make(map[string]*bucket)
	m := &d.rt.metrics
	m.allowed = proxywasm.DefineCounterMetric(requestsMetric(d.name, "allowed"))
	m.denied = proxywasm.DefineCounterMetric(requestsMetric(d.name, "denied"))
	m.shadowDenied = proxywasm.DefineCounterMetric(requestsMetric(d.name, "shadow_denied"))
	m.casExhausted = proxywasm.DefineCounterMetric(failOpenMetric(d.name, ratelimit.CASExhausted))
	m.storeError = proxywasm.DefineCounterMetric(failOpenMetric(d.name, ratelimit.StoreError))
}

// Metric names carry their tags Istio's way: "tag=.=value;.;" pairs before the name, so
// that a stats_tags regex per tag, (tag=\.=(.+?);\.;), extracts each and leaves the bare
// name.
func requestsMetric(descriptor, decision string) string {
	return taggedName("wasmesh_quota_requests_total", [2]string{"descriptor", descriptor}, [2]string{"decision", decision})
}

func failOpenMetric(descriptor string, why ratelimit.FailOpen) string {
	return taggedName("wasmesh_quota_fail_open_total", [2]string{"descriptor", descriptor}, [2]string{"reason", why.String()})
}

func taggedName(name string, tags ...[2]string) string {
	var b strings.Builder
	for _, t := range tags {
		b.WriteString(t[0])
		b.WriteString("=.=")
		b.WriteString(t[1])
		b.WriteString(";.;")
	}
	b.WriteString(name)
	return b.String()
}

// scratch is per-request working memory, reused: a VM runs one callback at a time.
type scratch struct {
	vals    []string // attribute values, by settings.attrs index
	read    []uint8  // attrUnread, attrPresent, attrAbsent
	entries []ratelimit.Entry
	key     []byte
	value   []byte // the attribute being read
	req     ratelimit.Request
}

const (
	attrUnread uint8 = iota
	attrPresent
	attrAbsent
)

func (s *scratch) init(cfg *settings) {
	s.vals = make([]string, len(cfg.attrs))
	s.read = make([]uint8, len(cfg.attrs))
	s.entries = make([]ratelimit.Entry, 0, maxEntries)
	s.key = make([]byte, 0, 256)
}

func (s *scratch) reset() {
	clear(s.read)
	clear(s.vals) // drop the previous request's strings
}

// bucketFor resolves the descriptor's bucket for the current request; false when the
// descriptor does not apply (an entry without value or default).
func (p *pluginContext) bucketFor(d *descriptor) (*bucket, bool) {
	s := &p.scratch
	s.entries = s.entries[:0]
	s.key = append(s.key[:0], d.rt.prefix...)
	for _, e := range d.entries {
		v, ok := p.attr(e.attr)
		if !ok {
			if e.def == nil {
				return nil, false
			}
			v = *e.def
		}
		s.entries = append(s.entries, ratelimit.Entry{Key: e.key, Value: v})
		s.key = appendKeyValue(s.key, v)
	}
	if b, ok := d.rt.buckets[string(s.key)]; ok { // the conversion does not allocate
		return b, true
	}
	b := &bucket{key: string(s.key), policy: d.policy, shadow: d.shadow}
	for i := range d.overrides {
		if o := &d.overrides[i]; o.matches(s.entries) {
			b.policy, b.shadow = o.policy, o.shadow
			break
		}
	}
	if len(d.rt.buckets) < maxBucketsPerDescriptor {
		d.rt.buckets[b.key] = b
	}
	return b, true
}

func (o *override) matches(entries []ratelimit.Entry) bool {
	for _, m := range o.match {
		if entries[m.entry].Value != m.value {
			return false
		}
	}
	return true
}

// appendKeyValue appends "/<len>:<value>": the length makes the key unambiguous
// whatever bytes the value holds. Long values become "/#<FNV-64a>".
func appendKeyValue(b []byte, v string) []byte {
	b = append(b, '/')
	if len(v) > maxValueInKey {
		b = append(b, '#')
		return strconv.AppendUint(b, fnv64a(v), 16)
	}
	b = strconv.AppendInt(b, int64(len(v)), 10)
	b = append(b, ':')
	return append(b, v...)
}

// fnv64a is FNV-1a, inline: hash/fnv's interface value would allocate per request.
func fnv64a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// attr returns the request attribute i, reading it from the host at most once per request.
func (p *pluginContext) attr(i int) (string, bool) {
	s := &p.scratch
	switch s.read[i] {
	case attrPresent:
		return s.vals[i], true
	case attrAbsent:
		return "", false
	}
	v, ok := p.readAttr(&p.cfg.attrs[i])
	if ok {
		s.read[i], s.vals[i] = attrPresent, v
	} else {
		s.read[i] = attrAbsent
	}
	return v, ok
}

// readAttr reads an attribute and returns its value, interned:
// the values that pick buckets repeat from request to request.
func (p *pluginContext) readAttr(a *attribute) (string, bool) {
	if a.source == sourceGenericKey {
		return a.value, true
	}
	var b []byte
	if a.path != nil {
		v, err := proxywasm.GetProperty(a.path)
		if err != nil || len(v) == 0 { // e.g. no peer certificate: no principal
			return "", false
		}
		b = v
	} else {
		v, err := proxywasm.GetHttpRequestHeader(a.header)
		if err != nil {
			return "", false
		}
		// Into the scratch buffer: the value is matched and interned as bytes.
		b = append(p.scratch.value[:0], v...)
		p.scratch.value = b[:0]
	}
	switch a.source {
	case sourcePathPrefix:
		for _, prefix := range a.prefixes {
			if len(b) >= len(prefix) && string(b[:len(prefix)]) == prefix {
				return prefix, true
			}
		}
		return "", false
	case sourceDestinationService:
		return p.strs.String(hostOnly(b)), true
	}
	return p.strs.String(b), true
}

// hostOnly strips a port from an authority: "svc:8080" → "svc", "[::1]:80" → "[::1]".
func hostOnly(authority []byte) []byte {
	i := bytes.LastIndexByte(authority, ':')
	if i < 0 || bytes.IndexByte(authority[i:], ']') >= 0 {
		return authority
	}
	for _, c := range authority[i+1:] {
		if c < '0' || c > '9' {
			return authority
		}
	}
	return authority[:i]
}

// uitoa formats a header number; the small ones, which limits, remaining counts and reset
// times mostly are, come from a table instead of an allocation per response.
func uitoa(n uint32) string {
	if n < uint32(len(smallNumbers)) {
		return smallNumbers[n]
	}
	return strconv.FormatUint(uint64(n), 10)
}

// smallNumbers holds the decimal strings of 0..1023. Read-only after initialisation.
var smallNumbers = func() (t [1024]string) {
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

// seconds renders a duration as whole seconds rounded up, as x-ratelimit-reset and
// retry-after want: rounding down would invite a retry that is still too early.
func seconds(d time.Duration) string {
	n := int64((d + time.Second - 1) / time.Second)
	if n >= 0 && n < int64(len(smallNumbers)) {
		return smallNumbers[n]
	}
	return strconv.FormatInt(n, 10)
}
