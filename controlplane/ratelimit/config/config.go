// Package config reads the rate-limit service's configuration: YAML files in the format of
// Envoy's reference rate-limit service (github.com/envoyproxy/ratelimit), one domain per
// file, and finds the limit that applies to a request's descriptor with that service's
// matching rules.
package config

import (
	"fmt"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Unit is a limit's window.
type Unit = rlv3.RateLimitResponse_RateLimit_Unit

// units are the windows a file may name (fixed lengths only: a month or a year has none).
var units = map[string]Unit{
	"second": rlv3.RateLimitResponse_RateLimit_SECOND,
	"minute": rlv3.RateLimitResponse_RateLimit_MINUTE,
	"hour":   rlv3.RateLimitResponse_RateLimit_HOUR,
	"day":    rlv3.RateLimitResponse_RateLimit_DAY,
}

// Window is the length of a unit's fixed window (0 for a unit without a fixed length).
func Window(u Unit) time.Duration {
	switch u {
	case rlv3.RateLimitResponse_RateLimit_SECOND:
		return time.Second
	case rlv3.RateLimitResponse_RateLimit_MINUTE:
		return time.Minute
	case rlv3.RateLimitResponse_RateLimit_HOUR:
		return time.Hour
	case rlv3.RateLimitResponse_RateLimit_DAY:
		return 24 * time.Hour
	}
	return 0
}

// Config is every domain of a configuration directory. It is immutable once built.
type Config struct {
	Domains map[string]*Domain
}

// Domain is one file's domain.
type Domain struct {
	Name string
	File string
	// FailureModeDeny answers OVER_LIMIT for this domain's limited descriptors when Redis
	// fails or is slower than the timeout; false (the default) answers OK (fail open).
	FailureModeDeny bool
	root            node
}

// node is one level of nested descriptors: children by "key_value" (a value-specific
// descriptor) or "key" (the key-only default).
type node struct {
	children map[string]*descriptor
	// wildcards are the children whose value holds a '*' (any run of characters), tried in
	// the file's order after the exact key_value and before the key-only child.
	wildcards []wildcard
}

type wildcard struct {
	key   string
	parts []string // the value split at '*'
	d     *descriptor
}

// match reports whether value has the pattern's parts in order, the first at its start and
// the last at its end.
func (w *wildcard) match(value string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if !strings.HasPrefix(value, first) {
		return false
	}
	rest := value[len(first):]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return strings.HasSuffix(rest, last)
}

// child is the descriptor an entry leads to: key_value, then a wildcard value, then key.
func (n *node) child(e Entry) *descriptor {
	if d := n.children[e.Key+"_"+e.Value]; d != nil {
		return d
	}
	for i := range n.wildcards {
		if w := &n.wildcards[i]; w.key == e.Key && w.match(e.Value) {
			return w.d
		}
	}
	return n.children[e.Key]
}

type descriptor struct {
	limit *Limit
	node
}

// Limit is the limit of one configured descriptor.
type Limit struct {
	RequestsPerUnit uint32
	Unit            Unit
	Unlimited       bool
	ShadowMode      bool
	DetailedMetric  bool
	// Name is the limit's name in the file (rate_limit.name), if any.
	Name string
	// Key names the limit in metrics: the domain and the configured path,
	// "domain.key_value.key". A detailed_metric limit is reported under the request's
	// values instead (see Match).
	Key string
}

// Match is the limit a request descriptor falls under.
type Match struct {
	*Limit
	// MetricKey names the descriptor in metrics: Limit.Key, or with detailed_metric the
	// request's own entries ("domain.key_value.key_value").
	MetricKey string
}

// Entry is one key/value of a request descriptor.
type Entry struct{ Key, Value string }

// Find returns the limit for a request descriptor of domain, or nil when none applies (an
// unknown domain, or no configured descriptor at exactly the request's depth). Matching
// follows Envoy's reference service: at each level a descriptor naming the entry's key and
// value wins, then one whose value has wildcards ('*', in the file's order), then the
// key-only one; each value matched by a wildcard keeps its own counter; the limit is the one of the descriptor reached by the
// request's last entry.
func (c *Config) Find(domain string, entries []Entry) *Match {
	d := c.Domains[domain]
	if d == nil || len(entries) == 0 {
		return nil
	}
	level := &d.root
	for i, e := range entries {
		next := level.child(e)
		if next == nil {
			return nil
		}
		if i == len(entries)-1 {
			if next.limit == nil {
				return nil
			}
			m := &Match{Limit: next.limit, MetricKey: next.limit.Key}
			if next.limit.DetailedMetric {
				m.MetricKey = requestKey(domain, entries)
			}
			return m
		}
		level = &next.node
	}
	return nil
}

func requestKey(domain string, entries []Entry) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range entries {
		b.WriteByte('.')
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}

// Error is a rejected file: which file, where in its document, and why.
type Error struct {
	File string
	// Path locates the offending field in the document, e.g. "descriptors[0].rate_limit.unit".
	Path string
	Err  error
}

func (e *Error) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("%s: %v", e.File, e.Err)
	}
	return fmt.Sprintf("%s: %s: %v", e.File, e.Path, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }
