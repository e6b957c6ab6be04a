package wasmfetch

import (
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	extensions "istio.io/api/extensions/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// ConfigStore lists configs sorted by key (server.ConfigStore).
type ConfigStore interface {
	List() []*config.Config
}

// Store is a ConfigStore whose WasmPlugins name modules the proxy can read: an http(s)
// module's URL is replaced by file://<cached file> once fetched and verified. Until then, or
// when the module cannot be had, the plugin's last good version is listed instead (a plugin
// never applied before is left out), as a bad config document never replaces a good one.
type Store struct {
	inner ConfigStore
	f     *Fetcher

	mu       sync.Mutex
	lastGood map[config.Key]*resolved
}

type resolved struct {
	src *config.Config // the config as written, to notice changes
	out *config.Config // as listed
}

// NewStore wraps inner.
func NewStore(inner ConfigStore, f *Fetcher) *Store {
	return &Store{inner: inner, f: f, lastGood: map[config.Key]*resolved{}}
}

// List implements ConfigStore. The inner list is sorted by key, so the WasmPlugins are one
// run of it: only they are examined, and the list is returned as it is when none of them
// changes (a push of a mesh with thousands of configs does not copy them here).
func (s *Store) List() []*config.Config {
	in := s.inner.List()
	from, _ := slices.BinarySearchFunc(in, config.WasmPlugin, func(c *config.Config, k config.Kind) int { return strings.Compare(string(c.Kind), string(k)) })
	to := from
	for to < len(in) && in[to].Kind == config.WasmPlugin {
		to++
	}
	plugins := make([]*config.Config, 0, to-from)
	live := map[config.Key]bool{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range in[from:to] {
		wp := c.Spec.(*extensions.WasmPlugin)
		u, fetched := needsFetch(wp)
		if !fetched {
			plugins = append(plugins, c)
			continue
		}
		live[c.Key()] = true
		path, err := s.f.resolve(c.Key(), u, wp.GetSha256())
		if path != "" && err == nil {
			r := s.lastGood[c.Key()]
			if r == nil || r.src != c || r.out.Spec.(*extensions.WasmPlugin).GetUrl() != "file://"+path {
				spec := proto.Clone(wp).(*extensions.WasmPlugin)
				spec.Url = "file://" + path
				cc := *c
				cc.Spec = spec
				r = &resolved{src: c, out: &cc}
				s.lastGood[c.Key()] = r
			}
			plugins = append(plugins, r.out)
			continue
		}
		if r := s.lastGood[c.Key()]; r != nil {
			plugins = append(plugins, r.out)
		}
	}
	for k := range s.lastGood {
		if !live[k] {
			delete(s.lastGood, k)
		}
	}
	s.f.forget(live)
	if slices.Equal(plugins, in[from:to]) {
		return in
	}
	return slices.Concat(in[:from], plugins, in[to:])
}
