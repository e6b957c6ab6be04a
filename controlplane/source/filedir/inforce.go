package filedir

import (
	"fmt"
	"slices"
	"strings"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// Which configs a read puts in force is decided here from what the read found and what the
// read before left, with no file system, lock, log or metric: the Source reads the files
// (files.go), decides (decide), then puts the decision in force and publishes it (apply).

// The statuses of a document (DocStatus.Status).
const (
	statusApplied  = "applied"
	statusRejected = "rejected"
	statusKept     = "rejected (last good kept)"
)

// fileRead is one config file of a read, in walk order: its bytes and documents (as last
// read when it is not parsed anew), or why it could not be read (then docs are those of the
// last read, if any).
type fileRead struct {
	rel      string // path relative to the directory
	data     []byte
	docs     []config.Document
	err      error
	reparsed bool // docs are parsed anew: the file is new or its bytes changed
}

// lastGood is the last applied version of a file's configs, by key and by source.
type lastGood struct {
	byKey    map[config.Key]*config.Config
	bySource map[string]*config.Config
}

// memory remembers the last applied version of every config (by key, and by document
// position for documents too broken to name) while its file exists, so a rejected document
// falls back to it even if a read in between saw the file empty (an editor truncating
// before it writes).
type memory map[string]lastGood // by file

// sourceFile is the file part of a config's source (config.DocumentSource).
func sourceFile(src string) string {
	file, _, _ := strings.Cut(src, "#")
	return file
}

// previous is what the read before left, that a read decides from; a read does not change
// it (but for bySource, a memo).
type previous struct {
	inForce  map[config.Key]*config.Config
	status   []DocStatus
	lastGood memory
	// bySource is what each document position put in force (applied, or last good kept),
	// built from status when a document too broken to name its config needs it.
	bySource map[string]*config.Config
}

// keeps is what a rejected document of file rel keeps: for a named config, the one in force
// from this file, else the file's last good; for a document too broken to name one, what its
// position held, else the last good applied there.
func (p *previous) keeps(rel string, d config.Document) *config.Config {
	if d.Key != nil {
		if c := p.inForce[*d.Key]; c != nil && sourceFile(c.Source) == rel {
			return c
		}
		return p.lastGood[rel].byKey[*d.Key]
	}
	if p.bySource == nil {
		p.bySource = map[string]*config.Config{}
		for _, st := range p.status {
			if st.cfg != nil {
				p.bySource[config.DocumentSource(st.File, st.Doc)] = st.cfg
			}
		}
	}
	src := config.DocumentSource(rel, d.Index)
	if kept := p.bySource[src]; kept != nil {
		return kept
	}
	return p.lastGood[rel].bySource[src]
}

// scope is what a read of named paths goes through: every document of the files in redo
// (their bytes changed, they are unreadable), and elsewhere only the documents that name an
// affected key, or that kept an affected key's config without naming one. Which config holds
// a key depends only on the documents that name it, in walk order, so every other key keeps
// its config and every other document its status (prev, by file).
type scope struct {
	prev     map[string][]DocStatus
	redo     map[string]bool
	affected map[config.Key]bool
}

// scopeOf fills sc (reusing its maps) with the scope of a read of named paths: reads are
// every file of the tree, those not read again as last read, and files are those the last
// read parsed. The affected keys are those the files in redo name now or named before, those
// a file gone named, and those the rejected documents name (a rejected document's fallback
// reads what was in force before the read, which a read can change without touching its
// file; rejections are few). walk says only going through every document can tell (a file
// as last read holds another number of documents than its statuses say), unchanged that
// nothing changed at all.
func scopeOf(reads []fileRead, p *previous, files map[string]parsedFile, sc *scope) (walk, unchanged bool) {
	clear(sc.prev) // as many as files, which a read goes through anyway
	if sc.prev == nil {
		sc.prev = map[string][]DocStatus{}
	}
	sc.redo, sc.affected = emptied(sc.redo), emptied(sc.affected)
	for i := 0; i < len(p.status); {
		j := i + 1
		for j < len(p.status) && p.status[j].File == p.status[i].File {
			j++
		}
		sc.prev[p.status[i].File] = p.status[i:j]
		i = j
	}
	for i := range p.status {
		if p.status[i].Error != "" {
			sc.name(p.status[i : i+1])
		}
	}
	listed := make(map[string]bool, len(reads))
	for _, r := range reads {
		listed[r.rel] = true
		if r.err == nil && !r.reparsed {
			if len(sc.prev[r.rel]) != len(r.docs) {
				return true, false // not as last read left it
			}
			continue
		}
		sc.redo[r.rel] = true
		sc.name(sc.prev[r.rel])
		for _, d := range r.docs {
			if d.Key != nil {
				sc.affected[*d.Key] = true
			} else if kept := p.keeps(r.rel, d); kept != nil {
				sc.affected[kept.Key()] = true
			}
		}
		if r.err != nil {
			for _, c := range p.inForce {
				if sourceFile(c.Source) == r.rel {
					sc.affected[c.Key()] = true
				}
			}
		}
	}
	gone := false
	for rel := range files {
		if !listed[rel] {
			gone = true
			sc.name(sc.prev[rel])
		}
	}
	return false, len(sc.redo) == 0 && len(sc.affected) == 0 && !gone
}

// emptied is m cleared to be filled again, or a new map when m is nil or held many entries:
// clearing costs all a map once held, and a small change after a large one must cost little.
func emptied[M ~map[K]V, K comparable, V any](m M) M {
	if m == nil || len(m) > 64 {
		return M{}
	}
	clear(m)
	return m
}

// merge puts the decision of a read of the scope into inForce, what was in force before
// (in place): the affected keys take the configs decided for them, or go.
func (sc *scope) merge(inForce, decided map[config.Key]*config.Config) {
	for k := range sc.affected {
		if c, ok := decided[k]; ok {
			inForce[k] = c
		} else {
			delete(inForce, k)
		}
	}
}

// name marks the keys the statuses name, and those of the configs they put in force.
func (sc *scope) name(sts []DocStatus) {
	for _, st := range sts {
		if st.key != nil {
			sc.affected[*st.key] = true
		}
		if st.cfg != nil {
			sc.affected[st.cfg.Key()] = true
		}
	}
}

// decision is what a read puts in force.
type decision struct {
	// inForce is the configs in force after the read: every one after a read of the whole
	// tree (no scope); after a read of a scope, those of its affected keys (an affected key
	// absent is in force no more; every other key keeps its config).
	inForce map[config.Key]*config.Config
	status  []DocStatus // of every document, in walk order
	changed map[config.Key]struct{}
	errs    map[string]bool // the rejections' messages
	// rejected is the documents rejected by this read (the others' statuses are the last
	// read's), for who applies the decision to report.
	rejected []rejection
	// remember is what the memory learns: the configs in force that files read anew
	// provide, and those that changed. A config a rejected document kept (kept) is
	// remembered by key alone: it still carries the position it was applied from, which
	// another may hold now.
	remember []*config.Config
	kept     map[*config.Config]bool // nil if none
	// docs are, for files parsed anew, their documents with each config that equals the one
	// in force before from the same document replaced by that one, to keep for the next read.
	docs map[string][]config.Document
}

// rejection is a document rejected by a read: its index in decision.status and its kind.
type rejection struct {
	status int
	kind   string
}

// decide decides which configs are in force after a read, each document's status, the keys
// that changed and what the memory learns, from the files of the read in walk order and what
// the read before left (p), going through only the scope's documents when it is not nil.
// A document applies unless it is rejected: invalid (it keeps its fallback, previous.keeps),
// or naming a key an earlier document in walk order holds. An unreadable file keeps what it
// provided before. A config that is equal to the one in force before from the same document
// keeps that one's pointer, so unchanged configs compare cheaply downstream; a config that
// moved to another document is a change of its source.
//
// decide fills the maps and list of buf anew instead of allocating them (a zero buf
// allocates), and writes nothing else it is given.
func decide(reads []fileRead, p previous, sc *scope, buf buffers) decision {
	d := decider{prev: p, sc: sc}
	d.out.status, d.out.errs, d.out.changed = buf.status[:0], map[string]bool{}, emptied(buf.changed)
	if sc == nil {
		clear(buf.inForce)
		if buf.inForce == nil {
			buf.inForce = make(map[config.Key]*config.Config, len(p.inForce))
		}
		d.out.inForce = buf.inForce
	} else {
		d.out.inForce = emptied(buf.decided)
	}
	for _, r := range reads {
		d.file(r)
	}
	d.changes()
	d.learn()
	return d.out
}

// buffers are what decide fills instead of allocating: the map and list of what the read
// before last put in force and its statuses (no longer read), and the maps the last read
// used only while it ran.
type buffers struct {
	inForce map[config.Key]*config.Config // for a read of the whole tree
	status  []DocStatus
	decided map[config.Key]*config.Config // for a read of a scope
	changed map[config.Key]struct{}
}

// decider is one decision under way.
type decider struct {
	prev    previous
	sc      *scope
	out     decision
	fresh   []*config.Config        // configs in force from files parsed anew
	keptNow map[*config.Config]bool // last good versions rejected documents put in force (nil: none)
}

// file goes through the documents of one file.
func (d *decider) file(r fileRead) {
	if r.err != nil {
		// Unreadable now (e.g. mid-rename): keep everything the file provided before.
		for k, c := range d.prev.inForce {
			if sourceFile(c.Source) == r.rel {
				d.out.inForce[k] = c
			}
		}
		d.reject(DocStatus{File: r.rel}, "", fmt.Sprintf("%s: %v", r.rel, r.err), nil)
		return
	}
	if d.sc == nil || d.sc.redo[r.rel] {
		for i := range r.docs {
			d.document(r, i, r.reparsed)
		}
		return
	}
	for i, st := range d.sc.prev[r.rel] {
		doc := r.docs[i]
		if (doc.Key != nil && d.sc.affected[*doc.Key]) || (doc.Key == nil && st.cfg != nil && d.sc.affected[st.cfg.Key()]) {
			d.document(r, i, false)
			continue
		}
		d.out.status = append(d.out.status, st) // as last read: nothing it names changed
		if st.Error != "" {
			d.out.errs[st.Error] = true
		}
	}
}

// document goes through document i of a file.
func (d *decider) document(r fileRead, i int, reparsed bool) {
	doc := r.docs[i]
	st := DocStatus{File: r.rel, Doc: doc.Index, key: doc.Key}
	if doc.Err != nil {
		kind := ""
		if doc.Key != nil {
			kind = string(doc.Key.Kind)
		}
		kept := d.prev.keeps(r.rel, doc)
		d.reject(st, kind, doc.Err.Error(), kept)
		if reparsed && kept != nil {
			d.fresh = append(d.fresh, kept)
		}
		return
	}
	c := doc.Config
	if prev, dup := d.out.inForce[c.Key()]; dup {
		d.reject(st, string(c.Kind), fmt.Sprintf("%s: document %d (%s): already defined in %s", r.rel, doc.Index, c.Key(), prev.Source), nil)
		return
	}
	if reparsed {
		if o := d.prev.inForce[c.Key()]; o != nil && o != c && o.Source == c.Source && o.Equal(c) {
			c = o
			d.keepPointer(r, i, o)
		}
	}
	d.out.inForce[c.Key()] = c
	if reparsed {
		d.fresh = append(d.fresh, c)
	}
	st.Status, st.cfg = statusApplied, c
	d.out.status = append(d.out.status, st)
}

// keepPointer makes document i of a file parsed anew hold o, the equal config in force
// before, in the documents kept for the next read (a copy: decide writes nothing it is given).
func (d *decider) keepPointer(r fileRead, i int, o *config.Config) {
	docs, ok := d.out.docs[r.rel]
	if !ok {
		if d.out.docs == nil {
			d.out.docs = map[string][]config.Document{}
		}
		docs = slices.Clone(r.docs)
		d.out.docs[r.rel] = docs
	}
	docs[i].Config = o
}

// reject records a rejected document, which puts kept (its fallback, if any) in force
// unless an earlier document holds its key.
func (d *decider) reject(st DocStatus, kind, msg string, kept *config.Config) {
	st.Error = msg
	st.Status = statusRejected
	if kept != nil {
		st.Status, st.cfg = statusKept, kept
		if _, dup := d.out.inForce[kept.Key()]; !dup {
			d.out.inForce[kept.Key()] = kept
			if d.keptNow == nil {
				d.keptNow = map[*config.Config]bool{}
			}
			d.keptNow[kept] = true
		}
	}
	d.out.rejected = append(d.out.rejected, rejection{status: len(d.out.status), kind: kind})
	d.out.status = append(d.out.status, st)
	d.out.errs[msg] = true
}

// changes finds the keys whose config changed: added, removed, or replaced by one that
// differs or comes from another document.
func (d *decider) changes() {
	before, next, changed := d.prev.inForce, d.out.inForce, d.out.changed
	note := func(k config.Key, o, c *config.Config, existed bool) {
		if c == nil || !existed || (o != c && (o.Source != c.Source || !o.Equal(c))) {
			changed[k] = struct{}{}
		}
	}
	if d.sc == nil {
		remaining := 0 // keys in force before still in force
		for k, c := range next {
			o, ok := before[k]
			if ok {
				remaining++
			}
			note(k, o, c, ok)
		}
		if remaining < len(before) { // some were removed
			for k, o := range before {
				if _, ok := next[k]; !ok {
					note(k, o, nil, true)
				}
			}
		}
	} else {
		for k := range d.sc.affected {
			o, existed := before[k]
			if c, ok := next[k]; ok || existed {
				note(k, o, c, existed)
			}
		}
	}
}

// learn lists what the memory learns: what files parsed anew put in force and what
// changed (the rest is remembered already), if in force.
func (d *decider) learn() {
	for k := range d.out.changed {
		if c := d.out.inForce[k]; c != nil {
			d.fresh = append(d.fresh, c)
		}
	}
	remember := d.fresh[:0]
	for _, c := range d.fresh {
		if d.out.inForce[c.Key()] == c { // else a duplicate's fallback, not in force
			remember = append(remember, c)
		}
	}
	d.out.remember, d.out.kept = remember, d.keptNow
}

// update brings the memory up to date after a read: it learns what the decision says, and
// forgets the files that are gone or unreadable (files holds those the read parsed).
func (m memory) update(dec decision, files map[string]parsedFile) {
	for _, c := range dec.remember {
		file := sourceFile(c.Source)
		lg := m[file]
		if lg.byKey == nil {
			lg = lastGood{byKey: map[config.Key]*config.Config{}, bySource: map[string]*config.Config{}}
			m[file] = lg
		}
		lg.byKey[c.Key()] = c
		if !dec.kept[c] {
			lg.bySource[c.Source] = c
		}
	}
	for file := range m {
		if files[file].data == nil {
			delete(m, file)
		}
	}
}
