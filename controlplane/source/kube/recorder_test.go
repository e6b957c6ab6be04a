package kube

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

// event is one call a source made to the recorder.
type event struct {
	call      string // "configs", "services", "endpoints", "workloads", "synced"
	configs   source.ConfigEvent
	services  source.ServiceEvent
	endpoints source.EndpointEvent
	workloads source.WorkloadEvent
}

func (e event) String() string {
	switch e.call {
	case "configs":
		var keys []string
		for _, c := range e.configs.Updated {
			keys = append(keys, "+"+c.Key().String())
		}
		for _, k := range e.configs.Deleted {
			keys = append(keys, "-"+k.String())
		}
		return "configs " + strings.Join(keys, ",")
	case "services":
		var hosts []string
		for _, s := range e.services.Updated {
			hosts = append(hosts, "+"+s.Hostname)
		}
		for _, h := range e.services.Deleted {
			hosts = append(hosts, "-"+h)
		}
		return "services " + strings.Join(hosts, ",")
	case "endpoints":
		return fmt.Sprintf("endpoints %s (%d)", e.endpoints.Host, len(e.endpoints.Endpoints))
	case "workloads":
		var keys []string
		for _, w := range e.workloads.Updated {
			keys = append(keys, "+"+w.Key())
		}
		for _, k := range e.workloads.Deleted {
			keys = append(keys, "-"+k)
		}
		return "workloads " + strings.Join(keys, ",")
	}
	return e.call
}

// recorder is a source.Sink that records every call and keeps the state they add up to;
// tests wait on it for a condition, woken by each call (no sleeping).
type recorder struct {
	mu        sync.Mutex
	events    []event
	synced    bool
	configs   map[config.Key]*config.Config
	services  map[string]*model.Service
	endpoints map[string][]*model.Endpoint
	workloads map[string]*model.Workload
	changed   chan struct{} // closed at the next call
}

func newRecorder() *recorder {
	return &recorder{configs: map[config.Key]*config.Config{}, services: map[string]*model.Service{},
		endpoints: map[string][]*model.Endpoint{}, workloads: map[string]*model.Workload{}, changed: make(chan struct{})}
}

func (r *recorder) record(e event, apply func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	apply()
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) Configs(from string, ev source.ConfigEvent) {
	r.record(event{call: "configs", configs: ev}, func() {
		for _, c := range ev.Updated {
			r.configs[c.Key()] = c
		}
		for _, k := range ev.Deleted {
			delete(r.configs, k)
		}
	})
}

func (r *recorder) Services(from string, ev source.ServiceEvent) {
	r.record(event{call: "services", services: ev}, func() {
		for _, s := range ev.Updated {
			r.services[s.Hostname] = s
		}
		for _, h := range ev.Deleted {
			delete(r.services, h)
		}
	})
}

func (r *recorder) Endpoints(from string, ev source.EndpointEvent) {
	r.record(event{call: "endpoints", endpoints: ev}, func() {
		if len(ev.Endpoints) == 0 {
			delete(r.endpoints, ev.Host)
		} else {
			r.endpoints[ev.Host] = ev.Endpoints
		}
	})
}

func (r *recorder) Workloads(from string, ev source.WorkloadEvent) {
	r.record(event{call: "workloads", workloads: ev}, func() {
		for _, w := range ev.Updated {
			r.workloads[w.Key()] = w
		}
		for _, k := range ev.Deleted {
			delete(r.workloads, k)
		}
	})
}

func (r *recorder) Synced(from string) { r.record(event{call: "synced"}, func() { r.synced = true }) }

// wait returns once cond (called with the recorder locked) holds, failing the test after
// timeout with what was recorded.
func (r *recorder) wait(t testing.TB, timeout time.Duration, what string, cond func(r *recorder) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := cond(r)
		ch := r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("%s: not within %s; recorded:\n%s", what, timeout, r.summary())
		}
	}
}

// mark is the number of events so far, for since.
func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// since returns the events recorded after mark.
func (r *recorder) since(mark int) []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events[mark:])
}

func (r *recorder) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for i, e := range r.events {
		if i >= 200 {
			fmt.Fprintf(&b, "... %d more\n", len(r.events)-i)
			break
		}
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}

func (r *recorder) endpointsOf(host string) []*model.Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.endpoints[host]
}

func (r *recorder) serviceOf(host string) *model.Service {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.services[host]
}

func (r *recorder) configOf(k config.Key) *config.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.configs[k]
}

func (r *recorder) isSynced() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced
}

// logs is a slog.Handler recording every record with its attributes flattened, woken
// waits as the recorder's.
type logs struct {
	mu      *sync.Mutex
	records *[]logRecord
	changed *chan struct{}
	attrs   []slog.Attr
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (r logRecord) String() string { return fmt.Sprintf("%s %s %v", r.level, r.msg, r.attrs) }

func newLogs() *logs {
	ch := make(chan struct{})
	return &logs{mu: &sync.Mutex{}, records: &[]logRecord{}, changed: &ch}
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }

func (l *logs) Handle(_ context.Context, rec slog.Record) error {
	attrs := map[string]string{}
	for _, a := range l.attrs {
		attrs[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.records = append(*l.records, logRecord{level: rec.Level, msg: rec.Message, attrs: attrs})
	close(*l.changed)
	*l.changed = make(chan struct{})
	return nil
}

func (l *logs) WithAttrs(as []slog.Attr) slog.Handler {
	c := *l
	c.attrs = append(slices.Clone(l.attrs), as...)
	return &c
}

func (l *logs) WithGroup(string) slog.Handler { return l }

// waitFor returns the first record match accepts, failing the test after timeout.
func (l *logs) waitFor(t testing.TB, timeout time.Duration, what string, match func(logRecord) bool) logRecord {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		for _, r := range *l.records {
			if match(r) {
				l.mu.Unlock()
				return r
			}
		}
		ch := *l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("%s: no such log record within %s; logged:\n%s", what, timeout, l.dump())
		}
	}
}

func (l *logs) count(match func(logRecord) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range *l.records {
		if match(r) {
			n++
		}
	}
	return n
}

func (l *logs) dump() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range *l.records {
		b.WriteString(r.String())
		b.WriteByte('\n')
	}
	return b.String()
}
