package wasmfetch

import (
	"sync"

	"google.golang.org/protobuf/proto"
	extensions "istio.io/api/extensions/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// ConfigStore lists configs (server.ConfigStore).
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

// List implements ConfigStore.
func (s *Store) List() []*config.Config {
	in := s.inner.List()
	out := make([]*config.Config, 0, len(in))
	live := map[config.Key]bool{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range in {
		wp, ok := c.Spec.(*extensions.WasmPlugin)
		if !ok {
			out = append(out, c)
			continue
		}
		u, fetched := needsFetch(wp)
		if !fetched {
			out = append(out, c)
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
			out = append(out, r.out)
			continue
		}
		if r := s.lastGood[c.Key()]; r != nil {
			out = append(out, r.out)
		}
	}
	for k := range s.lastGood {
		if !live[k] {
			delete(s.lastGood, k)
		}
	}
	s.f.forget(live)
	config.SortConfigs(out)
	return out
}
