// Package filedir is a config source reading Istio YAML from a directory tree and watching it
// with fsnotify. A rejected document is reported (log, metric, status) and its last good
// version stays in force; every other document applies. What changes in force is published
// to a source.Sink (the configs added or changed, the keys gone); nothing reads it back.
package filedir

import (
	"bytes"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
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
	syncMu sync.Mutex

	mu       sync.RWMutex
	current  map[config.Key]*config.Config
	sorted   []*config.Config // current, sorted, for List
	status   []DocStatus
	lastErrs map[string]bool // rejection messages already logged, so a rescan does not repeat them
	parsed   map[string]parsedFile
	// spare holds the maps and list of the read before last, for the next read to reuse.
	spare struct {
		current map[config.Key]*config.Config
		status  []DocStatus
		parsed  map[string]parsedFile
	}
	// unreadable: a file could not be read last time (its configs stay in force, it is not
	// in parsed); the next read walks the tree.
	unreadable bool
	// lastGood remembers the last applied version of every config (by key, and by document
	// position for documents too broken to name) while its file exists, so a rejected
	// document falls back to it even if a read in between saw the file empty (an editor
	// truncating before it writes).
	lastGood map[string]lastGood // by file
	// sink receives every change once Publish (or Run) has set it; synced says a read
	// happened, so Publish need not read again.
	sink   source.Sink
	synced bool
	// watching is closed once Run watches the tree.
	watching     chan struct{}
	watchingOnce sync.Once
}

// lastGood is the last applied version of a file's configs, by key and by source.
type lastGood struct {
	byKey    map[config.Key]*config.Config
	bySource map[string]*config.Config
}

// sourceFile is the file part of a config's source (config.DocumentSource).
func sourceFile(src string) string {
	file, _, _ := strings.Cut(src, "#")
	return file
}

// New returns a source for dir; call Sync (or Run) to read it.
func New(dir string, log *slog.Logger, m *metrics.Metrics) *Source {
	return &Source{dir: dir, log: log.With("scope", "filedir"), metrics: m, current: map[config.Key]*config.Config{}, lastErrs: map[string]bool{}, parsed: map[string]parsedFile{},
		lastGood: map[string]lastGood{}, watching: make(chan struct{})}
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
// read last time), applies what is valid and publishes what changed.
//
// A walk (reread nil) goes through every document. A read of named paths goes through the
// documents of the files whose bytes changed (or that came or went) and, elsewhere, only the
// documents that name a key those files name now or named before (affected): which config
// holds a key depends only on the documents that name it, in walk order, so every other key
// keeps its config and every other document its status. The random-walk test holds the two
// to the same result.
func (s *Source) apply(files []string, reread map[string]bool) {
	s.mu.Lock()
	old := s.current
	// What each document position put in force last time (applied, or last good kept), built
	// when a document too broken to name its config needs it.
	var bySource map[string]*config.Config
	oldBySource := func(src string) *config.Config {
		if bySource == nil {
			bySource = map[string]*config.Config{}
			for _, st := range s.status {
				if st.cfg != nil {
					bySource[config.DocumentSource(st.File, st.Doc)] = st.cfg
				}
			}
		}
		return bySource[src]
	}
	// fallback is what a rejected document keeps: for a named config, the one in force from
	// this file, else the file's last good; for a document too broken to name one, what its
	// position held.
	fallback := func(rel string, d config.Document, inForce func(config.Key) *config.Config) *config.Config {
		if d.Key != nil {
			if c := inForce(*d.Key); c != nil && sourceFile(c.Source) == rel {
				return c
			}
			return s.lastGood[rel].byKey[*d.Key]
		}
		src := config.DocumentSource(rel, d.Index)
		if kept := oldBySource(src); kept != nil {
			return kept
		}
		return s.lastGood[rel].bySource[src]
	}

	// Read (and parse what changed) first: a read of named paths needs to know what changed
	// before it goes through the documents.
	type fileRead struct {
		rel      string
		data     []byte
		docs     []config.Document
		err      error
		reparsed bool
	}
	reads := make([]fileRead, len(files))
	for i, file := range files {
		rel, _ := filepath.Rel(s.dir, file)
		r := fileRead{rel: rel, data: s.parsed[rel].data, docs: s.parsed[rel].docs}
		if reread == nil || reread[rel] {
			r.data, r.err = readChanged(file, r.data)
		}
		if p, ok := s.parsed[rel]; r.err == nil && (!ok || !bytes.Equal(p.data, r.data)) {
			// Only files whose bytes changed are parsed again: a change to one file of a
			// large directory costs that file.
			r.docs, r.reparsed = config.ParseFile(rel, r.data), true
		}
		reads[i] = r
	}
	// A read of named paths: the statuses of last read by file, the files whose documents
	// are all gone through (redo), and the keys affected.
	var (
		prevStatus map[string][]DocStatus
		redo       map[string]bool
		affected   map[config.Key]bool
		oldVals    map[config.Key]*config.Config // of the affected keys, before
	)
	if reread != nil {
		prevStatus = map[string][]DocStatus{}
		for i := 0; i < len(s.status); {
			j := i + 1
			for j < len(s.status) && s.status[j].File == s.status[i].File {
				j++
			}
			prevStatus[s.status[i].File] = s.status[i:j]
			i = j
		}
		redo, affected = map[string]bool{}, map[config.Key]bool{}
		named := func(sts []DocStatus) {
			for _, st := range sts {
				if st.key != nil {
					affected[*st.key] = true
				}
				if st.cfg != nil {
					affected[st.cfg.Key()] = true
				}
			}
		}
		// A rejected document's fallback reads what was in force before the read, which a
		// read can change without touching its file: every key a rejected document names is
		// gone through again (rejections are few).
		for i := range s.status {
			if s.status[i].Error != "" {
				named(s.status[i : i+1])
			}
		}
		listed := make(map[string]bool, len(reads))
		for _, r := range reads {
			listed[r.rel] = true
			if r.err == nil && !r.reparsed {
				if len(prevStatus[r.rel]) != len(r.docs) {
					reread = nil // not as last read left it: go through everything
				}
				continue
			}
			redo[r.rel] = true
			named(prevStatus[r.rel])
			for _, d := range r.docs {
				if d.Key != nil {
					affected[*d.Key] = true
				} else if kept := fallback(r.rel, d, func(k config.Key) *config.Config { return old[k] }); kept != nil {
					affected[kept.Key()] = true
				}
			}
			if r.err != nil {
				for _, c := range old {
					if sourceFile(c.Source) == r.rel {
						affected[c.Key()] = true
					}
				}
			}
		}
		gone := false
		for rel := range s.parsed {
			if !listed[rel] {
				gone = true
				named(prevStatus[rel])
			}
		}
		if reread == nil {
			redo, affected = nil, nil // going through everything after all
		} else if len(redo) == 0 && len(affected) == 0 && !gone {
			s.mu.Unlock()
			return // nothing changed
		}
	}

	// The configs in force: a walk fills the map of the read before last anew; a read of
	// named paths changes the affected keys of the current one in place (apply holds the lock).
	var next map[config.Key]*config.Config
	inForceBefore := func(k config.Key) *config.Config { return old[k] }
	if reread == nil {
		next = s.spare.current
		clear(next)
		if next == nil {
			next = make(map[config.Key]*config.Config, len(old))
		}
	} else {
		next, oldVals = old, make(map[config.Key]*config.Config, len(affected))
		for k := range affected {
			if c, ok := old[k]; ok {
				oldVals[k] = c
				delete(next, k)
			}
		}
		inForceBefore = func(k config.Key) *config.Config {
			if affected[k] {
				return oldVals[k]
			}
			return old[k]
		}
	}
	status := s.spare.status[:0]
	errs := map[string]bool{}
	parsed := s.spare.parsed
	clear(parsed)
	if parsed == nil {
		parsed = make(map[string]parsedFile, len(s.parsed))
	}
	var fresh []*config.Config // configs in force from files read anew
	keptNow := map[*config.Config]bool{}
	reject := func(st DocStatus, kind string, msg string, kept *config.Config) {
		st.Error = msg
		st.Status = "rejected"
		if kept != nil {
			st.Status, st.cfg = "rejected (last good kept)", kept
			if _, dup := next[kept.Key()]; !dup {
				next[kept.Key()] = kept
				keptNow[kept] = true
			}
		}
		status = append(status, st)
		errs[msg] = true
		if !s.lastErrs[msg] {
			s.log.Error("config rejected", "file", st.File, "document", st.Doc, "error", msg, "lastGoodKept", kept != nil)
			s.metrics.ConfigRejects.WithLabelValues(kind).Inc()
		}
	}
	// document goes through one document of a file.
	document := func(rel string, docs []config.Document, i int, reparsed bool) {
		d := docs[i]
		st := DocStatus{File: rel, Doc: d.Index, key: d.Key}
		if d.Err != nil {
			kind := ""
			if d.Key != nil {
				kind = string(d.Key.Kind)
			}
			kept := fallback(rel, d, inForceBefore)
			reject(st, kind, d.Err.Error(), kept)
			if reparsed && kept != nil {
				fresh = append(fresh, kept)
			}
			return
		}
		c := d.Config
		if prev, dup := next[c.Key()]; dup {
			reject(st, string(c.Kind), fmt.Sprintf("%s: document %d (%s): already defined in %s", rel, d.Index, c.Key(), prev.Source), nil)
			return
		}
		// A document parsed anew that equals the config in force keeps the old pointer,
		// here and in the parsed document, so unchanged configs compare cheaply
		// downstream and on the next read (a document not parsed anew has it already).
		if reparsed {
			if o := inForceBefore(c.Key()); o != nil && o != c && o.Source == c.Source && o.Equal(c) {
				c, docs[i].Config = o, o
			}
		}
		next[c.Key()] = c
		if reparsed {
			fresh = append(fresh, c)
		}
		st.Status, st.cfg = "applied", c
		status = append(status, st)
	}
	unreadable := false
	for _, r := range reads {
		if r.err != nil {
			unreadable = true
			// Unreadable now (e.g. mid-rename): keep everything the file provided before.
			for k := range affected {
				if c := oldVals[k]; c != nil && sourceFile(c.Source) == r.rel {
					next[k] = c
				}
			}
			for _, c := range old {
				if sourceFile(c.Source) == r.rel && !affected[c.Key()] {
					next[c.Key()] = c
				}
			}
			reject(DocStatus{File: r.rel}, "", fmt.Sprintf("%s: %v", r.rel, r.err), nil)
			continue
		}
		parsed[r.rel] = parsedFile{data: r.data, docs: r.docs}
		if reread == nil || redo[r.rel] {
			for i := range r.docs {
				document(r.rel, r.docs, i, r.reparsed)
			}
			continue
		}
		for i, st := range prevStatus[r.rel] {
			d := r.docs[i]
			if (d.Key != nil && affected[*d.Key]) || (d.Key == nil && st.cfg != nil && affected[st.cfg.Key()]) {
				document(r.rel, r.docs, i, false)
				continue
			}
			status = append(status, st) // as last read: nothing it names changed
			if st.Error != "" {
				errs[st.Error] = true
			}
		}
	}
	changed := map[config.Key]struct{}{}
	event := func(k config.Key, o, c *config.Config, existed bool) {
		switch {
		case c == nil:
			changed[k] = struct{}{}
			s.metrics.ConfigEvents.WithLabelValues(string(k.Kind), "delete").Inc()
		case !existed || (o != c && (o.Source != c.Source || !o.Equal(c))):
			// A config that moved to another file or document changed its source.
			changed[k] = struct{}{}
			s.metrics.ConfigEvents.WithLabelValues(string(k.Kind), eventName(existed)).Inc()
		}
	}
	if reread == nil {
		remaining := 0 // keys of old still in force
		for k, c := range next {
			o, ok := old[k]
			if ok {
				remaining++
			}
			event(k, o, c, ok)
		}
		if remaining < len(old) { // some were removed
			for k, o := range old {
				if _, ok := next[k]; !ok {
					event(k, o, nil, true)
				}
			}
		}
		s.spare.current = old
	} else {
		for k := range affected {
			o, existed := oldVals[k]
			if c, ok := next[k]; ok || existed {
				event(k, o, c, existed)
			}
		}
	}
	s.spare.status, s.spare.parsed = s.status, s.parsed
	s.current, s.status, s.lastErrs, s.parsed, s.unreadable = next, status, errs, parsed, unreadable
	s.sorted = config.UpdateSorted(s.sorted, next, changed)
	// Remember the last good version of what is in force, by file: what files read anew
	// provide and what changed (the rest is remembered already). A file that is gone (or
	// unreadable) takes its last good versions with it.
	for k := range changed {
		if c := next[k]; c != nil {
			fresh = append(fresh, c)
		}
	}
	for _, c := range fresh {
		if next[c.Key()] != c {
			continue // a duplicate's fallback, not in force
		}
		file := sourceFile(c.Source)
		lg := s.lastGood[file]
		if lg.byKey == nil {
			lg = lastGood{byKey: map[config.Key]*config.Config{}, bySource: map[string]*config.Config{}}
			s.lastGood[file] = lg
		}
		lg.byKey[c.Key()] = c
		if !keptNow[c] {
			// Only a config applied at its position speaks for it: a kept one still
			// carries the position it was applied from, which another may hold now.
			lg.bySource[c.Source] = c
		}
	}
	for file := range s.lastGood {
		if parsed[file].data == nil {
			delete(s.lastGood, file)
		}
	}
	s.synced = true
	sink := s.sink
	s.mu.Unlock()
	if len(changed) > 0 {
		s.log.Info("config changed", "configs", len(changed))
		if sink != nil {
			sink.Configs(Name, changeEvent(changed, next))
		}
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
