// Package logging gives discovery Istio-style log scopes on log/slog: every component logs
// with a "scope" attribute, --log_output_level sets per-scope levels ("default:info,ads:debug"),
// and the levels can be changed at run time over HTTP.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
)

// Levels holds the level of each scope; "default" applies to scopes without their own.
type Levels struct {
	mu     sync.RWMutex
	levels map[string]slog.Level
}

// ParseLevels reads Istio's --log_output_level syntax: "scope:level" pairs separated by
// commas; a bare level sets the default.
func ParseLevels(spec string) (*Levels, error) {
	l := &Levels{levels: map[string]slog.Level{"default": slog.LevelInfo}}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		scope, lvl, ok := strings.Cut(part, ":")
		if !ok {
			scope, lvl = "default", part
		}
		level, err := parseLevel(lvl)
		if err != nil {
			return nil, fmt.Errorf("log_output_level %q: %w", part, err)
		}
		l.levels[scope] = level
	}
	return l, nil
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error", "fatal":
		return slog.LevelError, nil
	case "none":
		return slog.LevelError + 100, nil
	}
	return 0, fmt.Errorf("unknown level %q (want debug, info, warn, error or none)", s)
}

// Level returns the level in force for scope.
func (l *Levels) Level(scope string) slog.Level {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if lvl, ok := l.levels[scope]; ok {
		return lvl
	}
	return l.levels["default"]
}

// Set changes a scope's level.
func (l *Levels) Set(scope string, level slog.Level) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.levels[scope] = level
}

// String renders the levels in the flag's syntax.
func (l *Levels) String() string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var parts []string
	for s, lvl := range l.levels {
		parts = append(parts, s+":"+strings.ToLower(lvl.String()))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// New returns a text logger to w filtered by levels.
func New(w io.Writer, levels *Levels) *slog.Logger {
	return slog.New(&handler{inner: slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}), levels: levels, scope: "default"})
}

type handler struct {
	inner  slog.Handler
	levels *Levels
	scope  string
}

func (h *handler) Enabled(_ context.Context, level slog.Level) bool {
	return level >= h.levels.Level(h.scope)
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error { return h.inner.Handle(ctx, r) }

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := &handler{inner: h.inner.WithAttrs(attrs), levels: h.levels, scope: h.scope}
	for _, a := range attrs {
		if a.Key == "scope" {
			n.scope = a.Value.String()
		}
	}
	return n
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{inner: h.inner.WithGroup(name), levels: h.levels, scope: h.scope}
}

// Handler serves GET (the levels) and PUT/POST ?scope=S&level=L (change one) on
// /debug/logging.
func (l *Levels) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut || r.Method == http.MethodPost {
			scope := r.URL.Query().Get("scope")
			lvl, err := parseLevel(r.URL.Query().Get("level"))
			if scope == "" || err != nil {
				http.Error(w, "want ?scope=<scope>&level=<debug|info|warn|error|none>", http.StatusBadRequest)
				return
			}
			l.Set(scope, lvl)
		}
		_, _ = fmt.Fprintln(w, l.String())
	})
}
