// Package filedir is a config source reading Istio YAML from a directory tree and watching it
// with fsnotify. A rejected document is reported (log, metric, status) and its last good
// version stays in force; every other document applies. What changes in force is published
// to a source.Sink (the configs added or changed, the keys gone); nothing reads it back.
package filedir

import (
	"log/slog"
	"slices"
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

// DocStatus is the outcome of the latest read of one document, for /debug/configz.
type DocStatus struct {
	File   string `json:"file"`
	Doc    int    `json:"document"`
	Config string `json:"config,omitempty"`
	// "applied", "rejected", "rejected (last good kept)"; /debug/configz also says when an
	// applied config is not in force ("ignored", "partly applied": registry.NotInForce).
	Status string `json:"status"`
	Error  string `json:"error,omitempty"` // why it is not (wholly) in force

	key *config.Key // Config, rendered when the status is read
	// cfg is what the document put in force: the config applied, or the last good kept.
	cfg *config.Config
}

// InForce is the config the document put in force (the one it applied, or the last good
// version kept for it), nil if none, so that who applies it can say when it is not in force
// after all.
func (st DocStatus) InForce() *config.Config { return st.cfg }

// Name is the source's name in events and debug output.
const Name = "configDir"

// Source reads and watches a config directory.
type Source struct {
	dir     string
	log     *slog.Logger
	metrics *metrics.Metrics

	// syncMu serializes whole reads: a read that started earlier must not be applied after
	// a later one (two callers racing a write would otherwise leave the stale state).
	// What follows changes only under syncMu and mu: a read reads it under syncMu alone,
	// and takes mu only to put its decision in force.
	syncMu sync.Mutex

	mu       sync.RWMutex
	current  map[config.Key]*config.Config
	sorted   []*config.Config // current, sorted, for List
	status   []DocStatus
	lastErrs map[string]bool // rejection messages already logged, so a rescan does not repeat them
	parsed   map[string]parsedFile
	// spare holds, for the next read to fill again instead of allocating, the maps and lists
	// of the read before last (no longer read) and those the last read used only while it ran.
	spare struct {
		buffers
		parsed map[string]parsedFile
		scope  scope
	}
	// unreadable: a file could not be read last time (its configs stay in force, it is not
	// in parsed); the next read walks the tree.
	unreadable bool
	// lastGood remembers the last applied version of every config while its file exists.
	lastGood memory
	// sink receives every change once Publish (or Run) has set it; synced says a read
	// happened, so Publish need not read again.
	sink   source.Sink
	synced bool
	// watching is closed once Run watches the tree.
	watching     chan struct{}
	watchingOnce sync.Once
}

// New returns a source for dir; call Sync (or Run) to read it.
func New(dir string, log *slog.Logger, m *metrics.Metrics) *Source {
	return &Source{dir: dir, log: log.With("scope", "filedir"), metrics: m, current: map[config.Key]*config.Config{}, lastErrs: map[string]bool{}, parsed: map[string]parsedFile{},
		lastGood: memory{}, watching: make(chan struct{})}
}

// Name implements source.Source.
func (s *Source) Name() string { return Name }

// Publish makes sink the receiver of every later change and publishes what is in force now
// (reading the directory first unless Sync already did), then says the source is synced.
func (s *Source) Publish(sink source.Sink) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if !s.synced {
		files, err := s.walk()
		if err != nil {
			return err
		}
		s.apply(files, nil)
	}
	s.mu.Lock()
	s.sink = sink
	all := slices.Clone(s.sorted)
	s.mu.Unlock()
	sink.Configs(Name, source.ConfigEvent{Updated: all})
	sink.Synced(Name)
	return nil
}

// InForce is the number of configs in force.
func (s *Source) InForce() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.current)
}

// Status returns the per-document status of the latest read.
func (s *Source) Status() []DocStatus {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := append([]DocStatus(nil), s.status...)
	for i := range out {
		if out[i].key != nil {
			out[i].Config, out[i].key = out[i].key.String(), nil
		}
	}
	return out
}

// Sync reads the whole directory, applies what is valid and publishes what changed.
// It returns an error only when the directory itself cannot be read.
func (s *Source) Sync() error { return s.sync(nil) }

// SyncPaths is Sync for a change the watcher saw at paths: only those files are read again,
// the others are known. What is not a plain config file of the tree as Sync walks it (a
// directory, a name that was one, a symlink farm's swap), or a directory with files that
// could not be read last time, is read whole.
func (s *Source) SyncPaths(paths map[string]struct{}) error { return s.sync(paths) }

// sync reads the files at paths again (nil: walks the tree and reads every file).
func (s *Source) sync(paths map[string]struct{}) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	var files []string
	var reread map[string]bool
	ok := false
	if paths != nil {
		s.mu.RLock()
		files, reread, ok = s.filesAfter(paths)
		s.mu.RUnlock()
	}
	if !ok {
		var err error
		if files, err = s.walk(); err != nil {
			return err
		}
		reread = nil
	}
	s.apply(files, reread)
	return nil
}

// apply reads files (only those in reread when it is not nil: the others hold the bytes
// read last time), decides what is in force and publishes what changed.
//
// A walk (reread nil) goes through every document. A read of named paths goes through the
// documents of its scope (scopeOf): those of the files whose bytes changed (or that came or
// went) and elsewhere only those that name a key those files name now or named before, so it
// costs what changed. The random-walk test holds the two to the same result.
//
// The caller holds syncMu: the state read here without mu changes only under both.
func (s *Source) apply(files []string, reread map[string]bool) {
	reads := s.read(files, reread)
	prev := previous{inForce: s.current, status: s.status, lastGood: s.lastGood}
	var sc *scope
	if reread != nil {
		sc = &s.spare.scope
		walk, unchanged := scopeOf(reads, &prev, s.parsed, sc)
		if unchanged {
			return
		}
		if walk {
			sc = nil
		}
	}
	s.put(reads, sc, decide(reads, prev, sc, s.spare.buffers))
}

// put puts a read's decision in force: it reports what the read rejected and changed,
// swaps the state under mu (a read of named paths changes the affected keys of the map in
// force in place), updates the memory and publishes the changes.
func (s *Source) put(reads []fileRead, sc *scope, dec decision) {
	parsed := s.spare.parsed
	clear(parsed)
	if parsed == nil {
		parsed = make(map[string]parsedFile, len(s.parsed))
	}
	unreadable := false
	for _, r := range reads {
		if r.err != nil {
			unreadable = true // not in parsed: the next read walks the tree
			continue
		}
		docs := r.docs
		if kept, ok := dec.docs[r.rel]; ok {
			docs = kept
		}
		parsed[r.rel] = parsedFile{data: r.data, docs: docs}
	}
	s.report(dec)

	s.mu.Lock()
	next := dec.inForce
	if sc == nil {
		s.spare.inForce = s.current
	} else {
		s.spare.decided, next = dec.inForce, s.current
		sc.merge(next, dec.inForce)
	}
	s.spare.status, s.spare.parsed, s.spare.changed = s.status, s.parsed, dec.changed
	s.current, s.status, s.lastErrs, s.parsed, s.unreadable = next, dec.status, dec.errs, parsed, unreadable
	s.sorted = config.UpdateSorted(s.sorted, next, dec.changed)
	s.lastGood.update(dec, parsed)
	s.synced = true
	sink := s.sink
	s.mu.Unlock()
	if len(dec.changed) > 0 {
		s.log.Info("config changed", "configs", len(dec.changed))
		if sink != nil {
			sink.Configs(Name, changeEvent(dec.changed, next))
		}
	}
}

// report logs and counts the documents a read rejected, each message once while it stays
// (a rescan does not repeat it), and counts the changes by kind; s.current is still what
// was in force before the read.
func (s *Source) report(dec decision) {
	for _, r := range dec.rejected {
		st := dec.status[r.status]
		if !s.lastErrs[st.Error] {
			s.log.Error("config rejected", "file", st.File, "document", st.Doc, "error", st.Error, "lastGoodKept", st.cfg != nil)
			s.metrics.ConfigRejects.WithLabelValues(r.kind).Inc()
		}
	}
	for k := range dec.changed {
		op := "delete"
		if dec.inForce[k] != nil {
			_, existed := s.current[k]
			op = eventName(existed)
		}
		s.metrics.ConfigEvents.WithLabelValues(string(k.Kind), op).Inc()
	}
}

// changeEvent is the event of the changed keys: the configs now in force for them, and the
// keys no longer in force.
func changeEvent(changed map[config.Key]struct{}, next map[config.Key]*config.Config) source.ConfigEvent {
	var ev source.ConfigEvent
	for k := range changed {
		if c := next[k]; c != nil {
			ev.Updated = append(ev.Updated, c)
		} else {
			ev.Deleted = append(ev.Deleted, k)
		}
	}
	return ev
}

func eventName(existed bool) string {
	if existed {
		return "update"
	}
	return "add"
}
