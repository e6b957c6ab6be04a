// Package logging gives each proxy component (Envoy's logger names: admin, config,
// connection, http, router, upstream, wasm, main, hot_restart, ...) its own slog logger
// whose level can be changed at run time, as Envoy's -l, --component-log-level and the
// /logging admin endpoint do.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
)

// Components are the logger names listed by /logging.
var Components = []string{"admin", "config", "connection", "conn_handler", "http", "http2", "hot_restart",
	"main", "misc", "router", "runtime", "upstream", "wasm", "init", "pool", "filter"}

// LevelTrace and LevelCritical are Envoy levels slog has no name for.
const (
	LevelTrace    = slog.Level(-8)
	LevelCritical = slog.Level(12)
	LevelOff      = slog.Level(100)
)

// ParseLevel reads an Envoy level name.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "trace":
		return LevelTrace, nil
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	case "critical":
		return LevelCritical, nil
	case "off":
		return LevelOff, nil
	}
	return 0, fmt.Errorf("unknown log level %q (trace, debug, info, warning, error, critical, off)", s)
}

// LevelName is the Envoy name of a level.
func LevelName(l slog.Level) string {
	switch {
	case l <= LevelTrace:
		return "trace"
	case l <= slog.LevelDebug:
		return "debug"
	case l <= slog.LevelInfo:
		return "info"
	case l <= slog.LevelWarn:
		return "warning"
	case l <= slog.LevelError:
		return "error"
	case l <= LevelCritical:
		return "critical"
	}
	return "off"
}

// Loggers is the set of component loggers of one process.
type Loggers struct {
	mu     sync.Mutex
	levels map[string]*slog.LevelVar
	out    slog.Handler
}

// New returns loggers writing text to w, every component at level.
func New(w io.Writer, level slog.Level) *Loggers {
	l := &Loggers{levels: map[string]*slog.LevelVar{},
		out: slog.NewTextHandler(w, &slog.HandlerOptions{Level: LevelTrace})}
	for _, c := range Components {
		v := &slog.LevelVar{}
		v.Set(level)
		l.levels[c] = v
	}
	return l
}

// For returns the logger of a component (created on first use).
func (l *Loggers) For(component string) *slog.Logger {
	l.mu.Lock()
	v := l.levels[component]
	if v == nil {
		v = &slog.LevelVar{}
		v.Set(l.levels["main"].Level())
		l.levels[component] = v
	}
	l.mu.Unlock()
	return slog.New(&handler{next: l.out.WithAttrs([]slog.Attr{slog.String("component", component)}), level: v})
}

// SetAll sets every component's level.
func (l *Loggers) SetAll(level slog.Level) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range l.levels {
		v.Set(level)
	}
}

// Set sets one component's level; unknown components are an error, as in Envoy.
func (l *Loggers) Set(component string, level slog.Level) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.levels[component]
	if v == nil {
		return fmt.Errorf("unknown logger %q", component)
	}
	v.Set(level)
	return nil
}

// SetComponents applies --component-log-level ("upstream:debug,connection:trace").
func (l *Loggers) SetComponents(spec string) error {
	if spec == "" {
		return nil
	}
	for _, part := range strings.Split(spec, ",") {
		name, lvl, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return fmt.Errorf("component log level %q: want <component>:<level>", part)
		}
		level, err := ParseLevel(lvl)
		if err != nil {
			return fmt.Errorf("component log level %q: %w", part, err)
		}
		if err := l.Set(name, level); err != nil {
			return err
		}
	}
	return nil
}

// Levels lists the components and their levels, sorted.
func (l *Loggers) Levels() [][2]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([][2]string, 0, len(l.levels))
	for n, v := range l.levels {
		out = append(out, [2]string{n, LevelName(v.Level())})
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}

type handler struct {
	next  slog.Handler
	level *slog.LevelVar
}

func (h *handler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }
func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	return h.next.Handle(ctx, r)
}
func (h *handler) WithAttrs(a []slog.Attr) slog.Handler {
	return &handler{next: h.next.WithAttrs(a), level: h.level}
}
func (h *handler) WithGroup(n string) slog.Handler {
	return &handler{next: h.next.WithGroup(n), level: h.level}
}
