// Package wasmfetch gets the Wasm modules WasmPlugins name: an http(s) module is fetched once
// by discovery, verified against its sha256 and kept in a cache directory under its digest; a
// file:// module with a sha256 is verified where it is. The Store it provides wraps the config
// store the push snapshot reads, handing the generators each WasmPlugin with its module's
// local path, or, while the module is missing or bad, the plugin's last good version (or
// nothing): a plugin whose module failed is reported and not applied.
package wasmfetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	extensions "istio.io/api/extensions/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// Options configure a Fetcher.
type Options struct {
	// Dir is the cache directory; modules are stored as <sha256>.wasm.
	Dir string
	// Timeout bounds one download (default 30s, Istio's).
	Timeout time.Duration
	// MaxSize bounds a module (default DefaultMaxSize).
	MaxSize int64
	// RetryMin and RetryMax bound the back-off between attempts at a module that failed
	// (default 1s and 5m).
	RetryMin, RetryMax time.Duration
	// Client fetches modules (default a client with Timeout).
	Client *http.Client
}

// DefaultMaxSize bounds a module when Options.MaxSize does not (256 MiB).
const DefaultMaxSize = 256 << 20

// State of a module.
const (
	StatePending = "pending"
	StateReady   = "ready"
	StateFailed  = "failed"
)

// Status is one module as /debug/configz shows it.
type Status struct {
	URL       string    `json:"url"`
	SHA256    string    `json:"sha256"`
	State     string    `json:"state"`
	Path      string    `json:"path,omitempty"`
	Error     string    `json:"error,omitempty"`
	Attempts  int       `json:"attempts"`
	UsedBy    []string  `json:"usedBy"` // "WasmPlugin <namespace>/<name>"
	FetchedAt time.Time `json:"fetchedAt,omitzero"`
}

type module struct {
	url, sha string
	local    bool // file:// verified in place
	path     string
	err      error
	attempts int
	next     time.Time
	fetching bool
	users    map[config.Key]bool
	fetched  time.Time
}

// Fetcher downloads and verifies modules in the background. Create with New, then Run.
type Fetcher struct {
	opts     Options
	log      *slog.Logger
	fetches  *prometheus.CounterVec
	entries  prometheus.Gauge
	onChange func(keys []config.Key)

	mu      sync.Mutex
	modules map[string]*module // by url + sha256
	wake    chan struct{}
}

// New returns a fetcher storing modules in opts.Dir. onChange is called (from Run's goroutine)
// with the WasmPlugins whose module became usable or failed, so they can be pushed again.
// Metrics are registered on reg when it is not nil.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer, onChange func(keys []config.Key)) (*Fetcher, error) {
	if opts.Dir == "" {
		return nil, errors.New("wasm module cache: a directory is required")
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("wasm module cache: %w", err)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.MaxSize <= 0 {
		opts.MaxSize = DefaultMaxSize
	}
	if opts.RetryMin <= 0 {
		opts.RetryMin = time.Second
	}
	if opts.RetryMax <= 0 {
		opts.RetryMax = 5 * time.Minute
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: opts.Timeout}
	}
	f := &Fetcher{
		opts: opts, log: log, onChange: onChange, modules: map[string]*module{}, wake: make(chan struct{}, 1),
		// Istio's agent metric names; results: success, download_failure, checksum_mismatched.
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "wasm_remote_fetch_count", Help: "Wasm module fetches by discovery, by result."}, []string{"result"}),
		entries: prometheus.NewGauge(prometheus.GaugeOpts{Name: "wasm_cache_entries", Help: "Wasm modules verified and ready in discovery's cache."}),
	}
	if reg != nil {
		if err := reg.Register(f.fetches); err != nil {
			return nil, err
		}
		if err := reg.Register(f.entries); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// needsFetch reports whether a WasmPlugin's module goes through the fetcher: http(s) modules
// always, file:// modules when they name a sha256 to verify.
func needsFetch(wp *extensions.WasmPlugin) (*url.URL, bool) {
	u, err := url.Parse(wp.GetUrl())
	if err != nil {
		return nil, false
	}
	switch u.Scheme {
	case "http", "https":
		return u, true
	case "file":
		return u, wp.GetSha256() != ""
	}
	return nil, false
}

// resolve returns the local path of a plugin's module, or the reason it has none yet (a nil
// error with an empty path: still pending). It registers the plugin as a user and wakes the
// worker for modules not fetched yet.
func (f *Fetcher) resolve(key config.Key, u *url.URL, sha string) (string, error) {
	id := u.String() + "\x00" + sha
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.modules[id]
	if m == nil {
		m = &module{url: u.String(), sha: sha, local: u.Scheme == "file", users: map[config.Key]bool{}}
		f.modules[id] = m
		f.signal()
	}
	m.users[key] = true
	return m.path, m.err
}

// forget drops users that no longer exist, and modules nobody uses.
func (f *Fetcher) forget(live map[config.Key]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, m := range f.modules {
		for k := range m.users {
			if !live[k] {
				delete(m.users, k)
			}
		}
		if len(m.users) == 0 && !m.fetching {
			delete(f.modules, id)
		}
	}
	f.entries.Set(float64(f.ready()))
}

func (f *Fetcher) ready() int {
	n := 0
	for _, m := range f.modules {
		if m.path != "" {
			n++
		}
	}
	return n
}

func (f *Fetcher) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Run fetches modules until ctx ends.
func (f *Fetcher) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		m, wait := f.nextDue()
		if m != nil {
			changed := f.fetch(ctx, m)
			if len(changed) > 0 && f.onChange != nil {
				f.onChange(changed)
			}
			continue
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-f.wake:
		case <-timer.C:
		}
	}
}

// nextDue picks a module to fetch now, or says how long until one is due.
func (f *Fetcher) nextDue() (*module, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	wait := time.Hour
	for _, m := range f.modules {
		if m.path != "" || m.fetching || len(m.users) == 0 {
			continue
		}
		if !m.next.After(now) {
			m.fetching = true
			return m, 0
		}
		wait = min(wait, m.next.Sub(now))
	}
	return nil, wait
}

// fetch makes one attempt and returns the users to push again when the outcome changed what
// they get.
func (f *Fetcher) fetch(ctx context.Context, m *module) []config.Key {
	path, result, err := f.get(ctx, m)
	f.mu.Lock()
	defer f.mu.Unlock()
	m.fetching = false
	m.attempts++
	prevErr := m.err
	if err == nil {
		m.path, m.err, m.fetched = path, nil, time.Now()
		f.entries.Set(float64(f.ready()))
		f.log.Info("wasm module ready", "url", m.url, "sha256", m.sha, "path", path)
	} else {
		m.err = err
		backoff := f.opts.RetryMin << min(m.attempts-1, 20)
		m.next = time.Now().Add(min(backoff, f.opts.RetryMax))
		f.log.Warn("wasm module not available: WasmPlugins using it are not applied", "url", m.url, "sha256", m.sha,
			"error", err, "attempt", m.attempts, "retryIn", time.Until(m.next).Round(time.Millisecond))
	}
	if !m.local && result != "" {
		f.fetches.WithLabelValues(result).Inc()
	}
	if err != nil && prevErr != nil {
		return nil // still failing: nothing changed for the users
	}
	keys := make([]config.Key, 0, len(m.users))
	for k := range m.users {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return config.KeyLess(keys[i], keys[j]) })
	return keys
}

// errMismatch marks a module whose digest differs from the one configured.
var errMismatch = errors.New("sha256 mismatch")

// get returns a verified local copy of the module: the cached file when it is there and
// intact, else a fresh download.
func (f *Fetcher) get(ctx context.Context, m *module) (string, string, error) {
	u, err := url.Parse(m.url)
	if err != nil {
		return "", "download_failure", err
	}
	if m.local {
		got, err := hashFile(u.Path, f.opts.MaxSize)
		if err != nil {
			return "", "download_failure", err
		}
		if got != m.sha {
			return "", "checksum_mismatched", fmt.Errorf("%w: %s has sha256 %s, WasmPlugin says %s", errMismatch, u.Path, got, m.sha)
		}
		return u.Path, "success", nil
	}
	dst := filepath.Join(f.opts.Dir, m.sha+".wasm")
	if got, err := hashFile(dst, f.opts.MaxSize); err == nil && got == m.sha {
		return dst, "", nil // cached by an earlier run: no fetch
	}
	ctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	defer cancel()
	body, err := Open(ctx, f.opts.Client, u)
	if err != nil {
		return "", "download_failure", err
	}
	defer body.Close()
	tmp, err := os.CreateTemp(f.opts.Dir, m.sha+".*.tmp")
	if err != nil {
		return "", "download_failure", err
	}
	defer os.Remove(tmp.Name())
	got, err := Digest(tmp, body, f.opts.MaxSize)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", "download_failure", fmt.Errorf("GET %s: %w", m.url, err)
	}
	if got != m.sha {
		return "", "checksum_mismatched", fmt.Errorf("%w: %s has sha256 %s, WasmPlugin says %s", errMismatch, m.url, got, m.sha)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", "download_failure", err
	}
	return dst, "success", nil
}

// Open opens a module's bytes: a file:// path, or the body of an http(s) GET that answered
// 200 OK. Other schemes (an oci:// image) are an error.
func Open(ctx context.Context, client *http.Client, u *url.URL) (io.ReadCloser, error) {
	switch u.Scheme {
	case "file":
		return os.Open(u.Path)
	case "http", "https":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
		}
		return resp.Body, nil
	}
	return nil, fmt.Errorf("module URL %s: scheme %q is not read here (file, http and https are)", u, u.Scheme)
}

// Digest copies r to its end into w (nil: nowhere) and returns its sha256 in hex; more than
// limit bytes is an error.
func Digest(w io.Writer, r io.Reader, limit int64) (string, error) {
	h := sha256.New()
	var dst io.Writer = h
	if w != nil {
		dst = io.MultiWriter(w, h)
	}
	n, err := io.Copy(dst, io.LimitReader(r, limit+1))
	if err != nil {
		return "", err
	}
	if n > limit {
		return "", fmt.Errorf("module larger than %d bytes", limit)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashFile is the sha256 of a module on disk.
func hashFile(path string, limit int64) (string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	return Digest(nil, fh, limit)
}

// Status lists the modules in use, for /debug/configz.
func (f *Fetcher) Status() []Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Status, 0, len(f.modules))
	for _, m := range f.modules {
		s := Status{URL: m.url, SHA256: m.sha, Path: m.path, Attempts: m.attempts, FetchedAt: m.fetched}
		switch {
		case m.path != "":
			s.State = StateReady
		case m.err != nil:
			s.State, s.Error = StateFailed, m.err.Error()
		default:
			s.State = StatePending
		}
		for k := range m.users {
			s.UsedBy = append(s.UsedBy, k.String())
		}
		sort.Strings(s.UsedBy)
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].URL+out[i].SHA256 < out[j].URL+out[j].SHA256 })
	return out
}
