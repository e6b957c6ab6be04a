package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/wasmesh/wasmesh/filters/internal/jsonconf"
	"github.com/wasmesh/wasmesh/filters/internal/ratelimit"
)

// config is the plugin configuration as written (JSON); parseConfig validates it into
// settings. The package documentation has an example and the meaning of every field.
type config struct {
	Name             string             `json:"name"`
	Shadow           bool               `json:"shadow"`
	RateLimitHeaders *bool              `json:"rate_limit_headers"`
	CASRetries       *int64             `json:"cas_retries"`
	TickPeriod       string             `json:"tick_period"`
	RateLimitService *serviceConfig     `json:"rate_limit_service"`
	Descriptors      []descriptorConfig `json:"descriptors"`
}

type descriptorConfig struct {
	Name        string             `json:"name"`
	Mode        string             `json:"mode"`
	Entries     []entryConfig      `json:"entries"`
	TokenBucket *tokenBucketConfig `json:"token_bucket"`
	Quota       *quotaConfig       `json:"quota"`
	Shadow      *bool              `json:"shadow"`
	Overrides   []overrideConfig   `json:"overrides"`
}

type entryConfig struct {
	Key      string   `json:"key"`
	Source   string   `json:"source"`
	Header   string   `json:"header"`
	Prefixes []string `json:"prefixes"`
	Path     []string `json:"path"`
	Value    *string  `json:"value"`
	Default  *string  `json:"default"`
}

// Numbers are int64 and durations strings so that validation, not the JSON decoder, reports
// a negative count or a bad duration, with the field's full path.
type tokenBucketConfig struct {
	MaxTokens     *int64 `json:"max_tokens"`
	TokensPerFill *int64 `json:"tokens_per_fill"`
	FillInterval  string `json:"fill_interval"`
}

type quotaConfig struct {
	MaxAmount      *int64 `json:"max_amount"`
	ValidDuration  string `json:"valid_duration"`
	RollingWindow  bool   `json:"rolling_window"`
	BucketDuration string `json:"bucket_duration"`
}

type overrideConfig struct {
	Match       map[string]string  `json:"match"`
	TokenBucket *tokenBucketConfig `json:"token_bucket"`
	Quota       *quotaConfig       `json:"quota"`
	Shadow      *bool              `json:"shadow"`
}

// Defaults and bounds.
const (
	defaultCASRetries  = 5
	maxCASRetries      = 100
	defaultRollingSlot = 10 // slots per rolling window when bucket_duration is not set
	minDuration        = time.Millisecond
	minTickPeriod      = 100 * time.Millisecond
	maxTickPeriod      = time.Minute
	maxDescriptors     = 64
	maxEntries         = 16
)

// sourceKind is where an entry's value comes from.
type sourceKind uint8

const (
	sourceHeader sourceKind = iota + 1
	sourcePathPrefix
	sourceMethod
	sourceAuthority
	sourceDestinationService
	sourceSourcePrincipal
	sourceSourceWorkload
	sourceProperty
	sourceGenericKey
)

var sourceNames = map[string]sourceKind{
	"header":              sourceHeader,
	"path_prefix":         sourcePathPrefix,
	"method":              sourceMethod,
	"authority":           sourceAuthority,
	"destination_service": sourceDestinationService,
	"source_principal":    sourceSourcePrincipal,
	"source_workload":     sourceSourceWorkload,
	"property":            sourceProperty,
	"generic_key":         sourceGenericKey,
}

// Fixed property paths of the named sources. source_principal is the peer certificate's
// URI SAN (the SPIFFE identity under Istio mTLS); source_workload is the workload name in
// the downstream peer metadata that Istio's peer metadata filter publishes.
var (
	principalProperty = []string{"connection", "uri_san_peer_certificate"}
	workloadProperty  = []string{"downstream_peer", "workload"}
)

// settings is a validated configuration.
type settings struct {
	name        string // empty: the plugin_name property names the key scope
	headers     bool
	casRetries  int
	tickPeriod  time.Duration
	service     *service    // nil: no descriptor is global
	attrs       []attribute // distinct request attributes, each read at most once per request
	descriptors []*descriptor
}

// attribute is one request attribute an entry reads.
type attribute struct {
	source   sourceKind
	header   string   // header: the header; the pseudo-header for method, authority, ...
	prefixes []string // path_prefix: longest first, so the first match is the longest
	path     []string // property, source_principal, source_workload
	value    string   // generic_key
}

// id identifies an attribute so that entries reading the same thing share one read.
func (a *attribute) id() string {
	return fmt.Sprintf("%d|%s|%q|%q|%q", a.source, a.header, a.prefixes, a.path, a.value)
}

type entry struct {
	key  string
	attr int // index into settings.attrs
	def  *string
}

// descriptor is a validated descriptor; the plugin adds its run-time state (keys,
// metrics) when it starts.
type descriptor struct {
	name      string
	mode      mode
	entries   []entry
	policy    *ratelimit.Policy // nil in mode global
	shadow    bool
	overrides []override
	rt        descriptorRuntime
}

type override struct {
	match  []matchValue // all must hold
	policy *ratelimit.Policy
	shadow bool
}

type matchValue struct {
	entry int
	value string
}

// parseConfig decodes and validates the plugin configuration; errors name the field.
func parseConfig(data []byte) (*settings, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New(`plugin configuration: empty; at least one entry in "descriptors" is required`)
	}
	var c config
	if err := jsonconf.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("plugin configuration: %w", err)
	}
	s, err := c.validate()
	if err != nil {
		return nil, fmt.Errorf("plugin configuration: %w", err)
	}
	return s, nil
}

// fieldError is a validation error about one field.
func fieldError(path, format string, args ...any) error {
	return fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...))
}

func (c *config) validate() (*settings, error) {
	s := &settings{name: c.Name, casRetries: defaultCASRetries}
	if c.Name != "" && !validName(c.Name) {
		return nil, fieldError("name", "%q must be letters, digits, '_', '-' or '.'", c.Name)
	}
	if c.RateLimitHeaders != nil {
		s.headers = *c.RateLimitHeaders
	}
	if c.CASRetries != nil {
		if n := *c.CASRetries; n < 0 || n > maxCASRetries {
			return nil, fieldError("cas_retries", "must be between 0 and %d, got %d", maxCASRetries, n)
		}
		s.casRetries = int(*c.CASRetries)
	}
	if c.TickPeriod != "" {
		d, err := parseDuration("tick_period", c.TickPeriod)
		if err != nil {
			return nil, err
		}
		if d > time.Duration(math.MaxUint32)*time.Millisecond {
			return nil, fieldError("tick_period", "%q is too long", c.TickPeriod)
		}
		s.tickPeriod = d
	}
	if len(c.Descriptors) == 0 {
		return nil, fieldError("descriptors", "at least one descriptor is required")
	}
	if len(c.Descriptors) > maxDescriptors {
		return nil, fieldError("descriptors", "at most %d descriptors, got %d", maxDescriptors, len(c.Descriptors))
	}
	attrIDs := map[string]int{}
	names := map[string]bool{}
	for i := range c.Descriptors {
		path := fmt.Sprintf("descriptors[%d]", i)
		d, err := c.Descriptors[i].validate(path, c.Shadow, s, attrIDs)
		if err != nil {
			return nil, err
		}
		if names[d.name] {
			return nil, fieldError(path+".name", "%q is used by an earlier descriptor", d.name)
		}
		names[d.name] = true
		s.descriptors = append(s.descriptors, d)
	}
	if err := c.validateService(s); err != nil {
		return nil, err
	}
	if s.tickPeriod == 0 {
		s.tickPeriod = defaultTickPeriod(s.descriptors)
	}
	return s, nil
}

// defaultTickPeriod refreshes as often as the fastest-changing bucket changes, within
// bounds: decisions never depend on the tick, so a slow tick only delays how soon shared
// data shows refills.
func defaultTickPeriod(ds []*descriptor) time.Duration {
	period := maxTickPeriod
	for _, d := range ds {
		if d.mode == modeGlobal { // no local state
			continue
		}
		period = min(period, d.policy.Period())
		for _, o := range d.overrides {
			period = min(period, o.policy.Period())
		}
	}
	return max(period, minTickPeriod)
}

func (dc *descriptorConfig) validate(path string, globalShadow bool, s *settings, attrIDs map[string]int) (*descriptor, error) {
	if dc.Name == "" {
		return nil, fieldError(path+".name", "required")
	}
	if !validName(dc.Name) {
		return nil, fieldError(path+".name", "%q must be letters, digits, '_', '-' or '.'", dc.Name)
	}
	d := &descriptor{name: dc.Name, shadow: globalShadow}
	var err error
	if d.mode, err = parseMode(path+".mode", dc.Mode); err != nil {
		return nil, err
	}
	if dc.Shadow != nil {
		d.shadow = *dc.Shadow
	}
	if len(dc.Entries) > maxEntries {
		return nil, fieldError(path+".entries", "at most %d entries, got %d", maxEntries, len(dc.Entries))
	}
	keys := map[string]int{}
	for i := range dc.Entries {
		ep := fmt.Sprintf("%s.entries[%d]", path, i)
		e, err := dc.Entries[i].validate(ep, s, attrIDs)
		if err != nil {
			return nil, err
		}
		if _, dup := keys[e.key]; dup {
			return nil, fieldError(ep+".key", "%q is used by an earlier entry", e.key)
		}
		keys[e.key] = i
		d.entries = append(d.entries, e)
	}
	p, err := validatePolicy(path, dc.TokenBucket, dc.Quota)
	if err != nil {
		return nil, err
	}
	if err := d.checkMode(path, p); err != nil {
		return nil, err
	}
	d.policy = p
	for i := range dc.Overrides {
		op := fmt.Sprintf("%s.overrides[%d]", path, i)
		o, err := dc.Overrides[i].validate(op, d, keys)
		if err != nil {
			return nil, err
		}
		d.overrides = append(d.overrides, o)
	}
	return d, nil
}

func (ec *entryConfig) validate(path string, s *settings, attrIDs map[string]int) (entry, error) {
	if ec.Key == "" {
		return entry{}, fieldError(path+".key", "required")
	}
	if !validName(ec.Key) {
		return entry{}, fieldError(path+".key", "%q must be letters, digits, '_', '-' or '.'", ec.Key)
	}
	if ec.Source == "" {
		return entry{}, fieldError(path+".source", "required; one of %s", sourceList())
	}
	kind, ok := sourceNames[ec.Source]
	if !ok {
		return entry{}, fieldError(path+".source", "unknown source %q; one of %s", ec.Source, sourceList())
	}
	// A field the source ignores is a mistake in the configuration, not a no-op.
	uses := map[string]bool{"header": kind == sourceHeader, "prefixes": kind == sourcePathPrefix, "path": kind == sourceProperty,
		"value": kind == sourceGenericKey}
	set := map[string]bool{"header": ec.Header != "", "prefixes": ec.Prefixes != nil, "path": ec.Path != nil, "value": ec.Value != nil}
	for _, f := range []string{"header", "prefixes", "path", "value"} {
		if set[f] && !uses[f] {
			return entry{}, fieldError(path+"."+f, "not used by source %q", ec.Source)
		}
		if uses[f] && !set[f] {
			return entry{}, fieldError(path+"."+f, "required by source %q", ec.Source)
		}
	}
	a := attribute{source: kind}
	switch kind {
	case sourceHeader:
		if !validHeaderName(ec.Header) {
			return entry{}, fieldError(path+".header", "%q must be a lower-case header name", ec.Header)
		}
		a.header = ec.Header
	case sourcePathPrefix:
		if len(ec.Prefixes) == 0 {
			return entry{}, fieldError(path+".prefixes", "must not be empty")
		}
		for i, p := range ec.Prefixes {
			if !strings.HasPrefix(p, "/") {
				return entry{}, fieldError(fmt.Sprintf("%s.prefixes[%d]", path, i), "%q must start with '/'", p)
			}
		}
		a.header = ":path"
		a.prefixes = slices.Clone(ec.Prefixes)
		slices.SortStableFunc(a.prefixes, func(x, y string) int { return len(y) - len(x) })
	case sourceMethod:
		a.header = ":method"
	case sourceAuthority, sourceDestinationService:
		a.header = ":authority"
	case sourceSourcePrincipal:
		a.path = principalProperty
	case sourceSourceWorkload:
		a.path = workloadProperty
	case sourceProperty:
		if len(ec.Path) == 0 || slices.Contains(ec.Path, "") {
			return entry{}, fieldError(path+".path", "must be a non-empty list of non-empty segments")
		}
		a.path = slices.Clone(ec.Path)
	case sourceGenericKey:
		if *ec.Value == "" {
			return entry{}, fieldError(path+".value", "must not be empty")
		}
		if ec.Default != nil {
			return entry{}, fieldError(path+".default", `not used by source "generic_key": its value is always present`)
		}
		a.value = *ec.Value
	}
	id := a.id()
	idx, ok := attrIDs[id]
	if !ok {
		idx = len(s.attrs)
		attrIDs[id] = idx
		s.attrs = append(s.attrs, a)
	}
	return entry{key: ec.Key, attr: idx, def: ec.Default}, nil
}

func sourceList() string {
	return `"header", "path_prefix", "method", "authority", "destination_service", "source_principal", "source_workload", "property", "generic_key"`
}

func (oc *overrideConfig) validate(path string, d *descriptor, keys map[string]int) (override, error) {
	if len(oc.Match) == 0 {
		return override{}, fieldError(path+".match", "must name at least one entry key")
	}
	o := override{policy: d.policy, shadow: d.shadow}
	for _, k := range slices.Sorted(maps.Keys(oc.Match)) {
		i, ok := keys[k]
		if !ok {
			return override{}, fieldError(path+".match."+k, "the descriptor has no entry with key %q", k)
		}
		o.match = append(o.match, matchValue{entry: i, value: oc.Match[k]})
	}
	p, err := validatePolicy(path, oc.TokenBucket, oc.Quota)
	if err != nil {
		return override{}, err
	}
	if p != nil && d.mode == modeGlobal {
		return override{}, fieldError(path, `a limit is not used in mode "global": the rate-limit service holds it; an override may set "shadow"`)
	}
	if p == nil && oc.Shadow == nil {
		return override{}, fieldError(path, `sets nothing; give "token_bucket", "quota" or "shadow"`)
	}
	if p != nil {
		o.policy = p
	}
	if oc.Shadow != nil {
		o.shadow = *oc.Shadow
	}
	return o, nil
}

// validatePolicy returns the policy of whichever of tb and q is set, nil if neither.
func validatePolicy(path string, tb *tokenBucketConfig, q *quotaConfig) (*ratelimit.Policy, error) {
	switch {
	case tb != nil && q != nil:
		return nil, fieldError(path, `set only one of "token_bucket" and "quota"`)
	case tb != nil:
		return tb.validate(path + ".token_bucket")
	case q != nil:
		return q.validate(path + ".quota")
	}
	return nil, nil
}

func (tc *tokenBucketConfig) validate(path string) (*ratelimit.Policy, error) {
	p := &ratelimit.Policy{Algorithm: ratelimit.TokenBucket, TokensPerFill: 1}
	if tc.MaxTokens == nil {
		return nil, fieldError(path+".max_tokens", "required")
	}
	n, err := count(path+".max_tokens", *tc.MaxTokens, 0)
	if err != nil {
		return nil, err
	}
	p.MaxTokens = n
	if tc.TokensPerFill != nil {
		if p.TokensPerFill, err = count(path+".tokens_per_fill", *tc.TokensPerFill, 1); err != nil {
			return nil, err
		}
	}
	if tc.FillInterval == "" {
		return nil, fieldError(path+".fill_interval", "required")
	}
	if p.FillInterval, err = parseDuration(path+".fill_interval", tc.FillInterval); err != nil {
		return nil, err
	}
	return p, nil
}

func (qc *quotaConfig) validate(path string) (*ratelimit.Policy, error) {
	p := &ratelimit.Policy{Algorithm: ratelimit.FixedWindow}
	if qc.MaxAmount == nil {
		return nil, fieldError(path+".max_amount", "required")
	}
	n, err := count(path+".max_amount", *qc.MaxAmount, 0)
	if err != nil {
		return nil, err
	}
	p.MaxAmount = n
	if qc.ValidDuration == "" {
		return nil, fieldError(path+".valid_duration", "required")
	}
	if p.ValidDuration, err = parseDuration(path+".valid_duration", qc.ValidDuration); err != nil {
		return nil, err
	}
	if !qc.RollingWindow {
		if qc.BucketDuration != "" {
			return nil, fieldError(path+".bucket_duration", `only used with "rolling_window": true`)
		}
		return p, nil
	}
	p.Algorithm = ratelimit.RollingWindow
	if qc.BucketDuration == "" {
		if p.ValidDuration%defaultRollingSlot != 0 || p.ValidDuration/defaultRollingSlot < minDuration {
			return nil, fieldError(path+".bucket_duration", "required: valid_duration %v does not split into %d slots of at least %v",
				p.ValidDuration, defaultRollingSlot, minDuration)
		}
		p.BucketDuration = p.ValidDuration / defaultRollingSlot
		return p, nil
	}
	if p.BucketDuration, err = parseDuration(path+".bucket_duration", qc.BucketDuration); err != nil {
		return nil, err
	}
	if p.ValidDuration%p.BucketDuration != 0 {
		return nil, fieldError(path+".bucket_duration", "%v must divide valid_duration %v", p.BucketDuration, p.ValidDuration)
	}
	if slots := p.ValidDuration / p.BucketDuration; slots > ratelimit.MaxSlots {
		return nil, fieldError(path+".bucket_duration", "%v makes %d slots of valid_duration %v; at most %d",
			p.BucketDuration, slots, p.ValidDuration, ratelimit.MaxSlots)
	}
	return p, nil
}

// count checks that n is a uint32 no smaller than least.
func count(path string, n, least int64) (uint32, error) {
	switch {
	case n < 0:
		return 0, fieldError(path, "must not be negative, got %d", n)
	case n < least:
		return 0, fieldError(path, "must be at least %d, got %d", least, n)
	case n > math.MaxUint32:
		return 0, fieldError(path, "must be at most %d, got %d", uint32(math.MaxUint32), n)
	}
	return uint32(n), nil
}

// parseDuration accepts Go durations ("1s", "250ms", "1m30s"), which include the
// protobuf JSON form of a Duration ("1.5s").
func parseDuration(path, s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fieldError(path, "%q is not a duration such as \"1s\" or \"250ms\"", s)
	}
	if d < minDuration {
		return 0, fieldError(path, "%q must be at least %v", s, minDuration)
	}
	return d, nil
}

// validName keeps names safe inside shared-data keys ('/' separates their parts) and
// metric names (Envoy-style tags use ";.;" and "=.=").
func validName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// validHeaderName accepts lower-case HTTP token names: HTTP/2 and Envoy require lower
// case, so an upper-case name in the configuration would never match.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
