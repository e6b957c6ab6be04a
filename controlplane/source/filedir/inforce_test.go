package filedir

import (
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// A config of the decision tables, written "name:port@file#document": the ServiceEntry
// se(name, port) as the parser makes it, applied at that document.
func cfg(t *testing.T, s string) *config.Config {
	t.Helper()
	name, rest, _ := strings.Cut(s, ":")
	port, src, _ := strings.Cut(rest, "@")
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	docs := config.ParseFile(sourceFile(src), []byte(se(name, p)))
	require.Len(t, docs, 1)
	require.Nil(t, docs[0].Err, s)
	c := *docs[0].Config
	c.Source = src
	return &c
}

func cfgString(c *config.Config) string {
	return c.Name + ":" + strconv.Itoa(int(c.Spec.(*networking.ServiceEntry).GetPorts()[0].GetNumber())) + "@" + c.Source
}

// decideFile is a file of a read in a decision table.
type decideFile struct {
	rel  string
	yaml string // its documents (as last read, when the file is unreadable)
	// asBefore: the file is not parsed anew (its bytes did not change): its documents hold
	// the configs the last read put in force.
	asBefore   bool
	unreadable bool
}

type decideCase struct {
	name string
	// What the read before left: the configs in force, each applied at its source unless
	// held names the documents that hold it ("file#document": config, a rejected document
	// that kept it); the memory by file, each config remembered by key and at its source
	// ("key " first: by key alone).
	inForce  []string
	held     map[string]string
	lastGood map[string][]string
	files    []decideFile // what the read finds, in walk order
	// What the read decides: the configs in force, each document's status ("file#document
	// status", then what it holds in force) and a part of its error (by index), the names
	// whose config changed, the memory after it (nil: not checked), the configs that keep
	// the pointer they had, and (going through a scope) the affected keys.
	wantInForce  []string
	wantStatus   []string
	wantErr      map[int]string
	wantChanged  []string
	wantLastGood map[string][]string
	wantSame     []string
	wantAffected []string
}

// TestDecide holds the decision of which configs are in force to the rules, each case
// decided twice: going through every document (a walk) and through the scope a read of
// named paths finds (scopeOf), whose result merged into what was in force must be the same.
func TestDecide(t *testing.T) {
	for _, tc := range decideCases {
		t.Run(tc.name, func(t *testing.T) {
			prev, lastFiles := tc.previous(t)
			reads := tc.reads(t, prev.inForce)
			// decide writes nothing it is given.
			inForce, status, lastGood := maps.Clone(prev.inForce), slices.Clone(prev.status), cloneMemory(prev.lastGood)
			docs := make([][]config.Document, len(reads))
			for i, r := range reads {
				docs[i] = slices.Clone(r.docs)
			}
			t.Run("walk", func(t *testing.T) {
				dec := decide(reads, prev, nil, buffers{})
				tc.check(t, prev, reads, dec, dec.inForce)
				var rejected []int
				for i, st := range dec.status {
					if st.Error != "" {
						rejected = append(rejected, i)
					}
				}
				assert.Equal(t, rejected, statusIndexes(dec.rejected), "a walk rejects every rejected document anew")
			})
			t.Run("scope", func(t *testing.T) {
				p := prev
				var sc scope
				walk, unchanged := scopeOf(reads, &p, lastFiles, &sc)
				require.False(t, walk || unchanged, "a read that changes something goes through a scope")
				if tc.wantAffected != nil {
					assert.ElementsMatch(t, tc.wantAffected, keyNames(sc.affected), "the affected keys")
				}
				dec := decide(reads, p, &sc, buffers{})
				for k := range dec.inForce {
					require.True(t, sc.affected[k], "%s decided outside the scope", k)
				}
				after := maps.Clone(prev.inForce)
				sc.merge(after, dec.inForce)
				tc.check(t, prev, reads, dec, after)
			})
			same := func(a, b *config.Config) bool { return a == b }
			assert.True(t, maps.EqualFunc(inForce, prev.inForce, same), "what was in force")
			assert.Equal(t, status, prev.status)
			for file, lg := range lastGood {
				assert.True(t, maps.EqualFunc(lg.byKey, prev.lastGood[file].byKey, same) &&
					maps.EqualFunc(lg.bySource, prev.lastGood[file].bySource, same), "the memory of %s", file)
			}
			for i, r := range reads {
				for j := range r.docs {
					assert.Same(t, docs[i][j].Config, r.docs[j].Config, "%s document %d", r.rel, j+1)
				}
			}
		})
	}
}

var decideCases = []decideCase{
	{
		name:         "a valid document applies",
		files:        []decideFile{{rel: "a.yaml", yaml: se("a", 80)}},
		wantInForce:  []string{"a:80@a.yaml#1"},
		wantStatus:   []string{"a.yaml#1 applied a:80@a.yaml#1"},
		wantChanged:  []string{"a"},
		wantLastGood: map[string][]string{"a.yaml": {"a:80@a.yaml#1"}},
	},
	{
		name:        "a new version of a config applies",
		inForce:     []string{"a:80@a.yaml#1"},
		files:       []decideFile{{rel: "a.yaml", yaml: se("a", 81)}},
		wantInForce: []string{"a:81@a.yaml#1"},
		wantStatus:  []string{"a.yaml#1 applied a:81@a.yaml#1"},
		wantChanged: []string{"a"},
	},
	{
		name:        "a rejected document keeps the version in force from its file",
		inForce:     []string{"a:80@a.yaml#1", "b:80@a.yaml#2"},
		files:       []decideFile{{rel: "a.yaml", yaml: se("a", 81) + "---\n" + se("b", 0)}},
		wantInForce: []string{"a:81@a.yaml#1", "b:80@a.yaml#2"},
		wantStatus:  []string{"a.yaml#1 applied a:81@a.yaml#1", "a.yaml#2 rejected (last good kept) b:80@a.yaml#2"},
		wantErr:     map[int]string{1: "a.yaml: document 2 (ServiceEntry default/b): spec.ports[0].number"},
		wantChanged: []string{"a"},
		wantSame:    []string{"b"},
	},
	{
		name:         "a rejected document keeps its file's last good, remembered after an empty read",
		lastGood:     map[string][]string{"a.yaml": {"a:80@a.yaml#1", "b:80@a.yaml#2"}},
		files:        []decideFile{{rel: "a.yaml", yaml: se("a", 81) + "---\n" + se("b", 0)}},
		wantInForce:  []string{"a:81@a.yaml#1", "b:80@a.yaml#2"},
		wantStatus:   []string{"a.yaml#1 applied a:81@a.yaml#1", "a.yaml#2 rejected (last good kept) b:80@a.yaml#2"},
		wantChanged:  []string{"a", "b"},
		wantLastGood: map[string][]string{"a.yaml": {"a:81@a.yaml#1", "b:80@a.yaml#2"}},
	},
	{
		// b moved to the second document and broke, kept still carrying the first, where c
		// applied since; then a third document comes, and c parsed anew is unchanged.
		name:         "a config a rejected document keeps is not remembered at the position it carries",
		inForce:      []string{"c:80@a.yaml#1", "b:80@a.yaml#1"},
		held:         map[string]string{"a.yaml#2": "b:80@a.yaml#1"},
		lastGood:     map[string][]string{"a.yaml": {"c:80@a.yaml#1", "key b:80@a.yaml#1"}},
		files:        []decideFile{{rel: "a.yaml", yaml: se("c", 80) + "---\n" + se("b", 0) + "---\n" + se("d", 80)}},
		wantInForce:  []string{"b:80@a.yaml#1", "c:80@a.yaml#1", "d:80@a.yaml#3"},
		wantStatus:   []string{"a.yaml#1 applied c:80@a.yaml#1", "a.yaml#2 rejected (last good kept) b:80@a.yaml#1", "a.yaml#3 applied d:80@a.yaml#3"},
		wantChanged:  []string{"d"},
		wantLastGood: map[string][]string{"a.yaml": {"c:80@a.yaml#1", "d:80@a.yaml#3", "key b:80@a.yaml#1"}},
		wantSame:     []string{"b", "c"},
	},
	{
		name:        "a rejected document with no last good is rejected",
		files:       []decideFile{{rel: "a.yaml", yaml: se("b", 0)}},
		wantInForce: []string{},
		wantStatus:  []string{"a.yaml#1 rejected"},
		wantErr:     map[int]string{0: "spec.ports[0].number"},
	},
	{
		name:    "a rejected document keeps nothing another file holds in force",
		inForce: []string{"b:80@b.yaml#1"},
		files: []decideFile{
			{rel: "a.yaml", yaml: se("b", 0)},
			{rel: "b.yaml", yaml: se("b", 80), asBefore: true},
		},
		wantInForce:  []string{"b:80@b.yaml#1"},
		wantStatus:   []string{"a.yaml#1 rejected", "b.yaml#1 applied b:80@b.yaml#1"},
		wantSame:     []string{"b"},
		wantAffected: []string{"b"},
	},
	{
		name:        "a document too broken to name its config keeps what its position held",
		inForce:     []string{"a:80@f.yaml#1", "b:80@f.yaml#2"},
		files:       []decideFile{{rel: "f.yaml", yaml: se("a", 80) + "---\nkind: [broken\n"}},
		wantInForce: []string{"a:80@f.yaml#1", "b:80@f.yaml#2"},
		wantStatus:  []string{"f.yaml#1 applied a:80@f.yaml#1", "f.yaml#2 rejected (last good kept) b:80@f.yaml#2"},
		wantErr:     map[int]string{1: "invalid YAML"},
		wantSame:    []string{"a", "b"},
	},
	{
		// b moved to f.yaml#2 and broke, kept still carrying f.yaml#1, where c applied since;
		// then a read saw f.yaml empty.
		name:        "a document too broken to name its config keeps what its position last applied, not a config kept by key",
		lastGood:    map[string][]string{"f.yaml": {"key b:80@f.yaml#1", "c:80@f.yaml#1"}},
		files:       []decideFile{{rel: "f.yaml", yaml: "kind: [broken\n"}},
		wantInForce: []string{"c:80@f.yaml#1"},
		wantStatus:  []string{"f.yaml#1 rejected (last good kept) c:80@f.yaml#1"},
		wantChanged: []string{"c"},
	},
	{
		name:    "a duplicate key across files: the first in walk order wins, the second is rejected naming it",
		inForce: []string{"a:81@2.yaml#1"},
		files: []decideFile{
			{rel: "1.yaml", yaml: se("a", 80)},
			{rel: "2.yaml", yaml: se("a", 81), asBefore: true},
		},
		wantInForce:  []string{"a:80@1.yaml#1"},
		wantStatus:   []string{"1.yaml#1 applied a:80@1.yaml#1", "2.yaml#1 rejected"},
		wantErr:      map[int]string{1: "2.yaml: document 1 (ServiceEntry default/a): already defined in 1.yaml#1"},
		wantChanged:  []string{"a"},
		wantAffected: []string{"a"},
	},
	{
		name:    "a rejected document's last good does not displace what an earlier document applied",
		inForce: []string{"a:81@2.yaml#1"},
		files: []decideFile{
			{rel: "1.yaml", yaml: se("a", 80)},
			{rel: "2.yaml", yaml: se("a", 0), asBefore: true},
		},
		wantInForce: []string{"a:80@1.yaml#1"},
		// It names what it would keep, though that is not in force.
		wantStatus:   []string{"1.yaml#1 applied a:80@1.yaml#1", "2.yaml#1 rejected (last good kept) a:81@2.yaml#1"},
		wantChanged:  []string{"a"},
		wantAffected: []string{"a"},
	},
	{
		name:         "a config that moves to another file is a change of its source",
		inForce:      []string{"a:80@a.yaml#1"},
		lastGood:     map[string][]string{"a.yaml": {"a:80@a.yaml#1"}},
		files:        []decideFile{{rel: "b.yaml", yaml: se("a", 80)}},
		wantInForce:  []string{"a:80@b.yaml#1"},
		wantStatus:   []string{"b.yaml#1 applied a:80@b.yaml#1"},
		wantChanged:  []string{"a"},
		wantLastGood: map[string][]string{"b.yaml": {"a:80@b.yaml#1"}},
	},
	{
		name:        "an unchanged document parsed anew keeps the old pointer",
		inForce:     []string{"a:80@a.yaml#1", "b:80@a.yaml#2"},
		files:       []decideFile{{rel: "a.yaml", yaml: se("a", 80) + "---\n" + se("b", 81)}},
		wantInForce: []string{"a:80@a.yaml#1", "b:81@a.yaml#2"},
		wantStatus:  []string{"a.yaml#1 applied a:80@a.yaml#1", "a.yaml#2 applied b:81@a.yaml#2"},
		wantChanged: []string{"b"},
		wantSame:    []string{"a"},
	},
	{
		name:     "an unreadable file keeps everything it provided",
		inForce:  []string{"a:80@a.yaml#1", "b:80@a.yaml#2", "c:80@c.yaml#1"},
		lastGood: map[string][]string{"a.yaml": {"a:80@a.yaml#1", "b:80@a.yaml#2"}, "c.yaml": {"c:80@c.yaml#1"}},
		files: []decideFile{
			{rel: "a.yaml", yaml: se("a", 80) + "---\n" + se("b", 80), unreadable: true},
			{rel: "c.yaml", yaml: se("c", 80), asBefore: true},
		},
		wantInForce: []string{"a:80@a.yaml#1", "b:80@a.yaml#2", "c:80@c.yaml#1"},
		wantStatus:  []string{"a.yaml#0 rejected", "c.yaml#1 applied c:80@c.yaml#1"},
		wantErr:     map[int]string{0: "a.yaml: permission denied"},
		wantSame:    []string{"a", "b", "c"},
		// Its memory goes, as a gone file's: what it provided stays in force by the rule above.
		wantLastGood: map[string][]string{"c.yaml": {"c:80@c.yaml#1"}},
		wantAffected: []string{"a", "b"},
	},
	{
		name:         "a file removed takes its configs and its last good with it",
		inForce:      []string{"a:80@a.yaml#1", "b:80@b.yaml#1"},
		lastGood:     map[string][]string{"a.yaml": {"a:80@a.yaml#1"}, "b.yaml": {"b:80@b.yaml#1"}},
		files:        []decideFile{{rel: "b.yaml", yaml: se("b", 80), asBefore: true}},
		wantInForce:  []string{"b:80@b.yaml#1"},
		wantStatus:   []string{"b.yaml#1 applied b:80@b.yaml#1"},
		wantChanged:  []string{"a"},
		wantLastGood: map[string][]string{"b.yaml": {"b:80@b.yaml#1"}},
		wantAffected: []string{"a"},
	},
	{
		name:    "a read of named paths goes through the keys the changed files name, and the rejected documents'",
		inForce: []string{"a:80@a.yaml#1", "b:80@b.yaml#1", "c:80@c.yaml#1"},
		held:    map[string]string{"c.yaml#1": "c:80@c.yaml#1", "c.yaml#2": "c:80@c.yaml#1"}, // #1 broken keeps c, #2 too
		files: []decideFile{
			{rel: "a.yaml", yaml: se("a", 81)},
			{rel: "b.yaml", yaml: se("b", 80), asBefore: true},
			{rel: "c.yaml", yaml: "kind: [broken\n---\n" + se("c", 0), asBefore: true},
		},
		wantInForce:  []string{"a:81@a.yaml#1", "b:80@b.yaml#1", "c:80@c.yaml#1"},
		wantStatus:   []string{"a.yaml#1 applied a:81@a.yaml#1", "b.yaml#1 applied b:80@b.yaml#1", "c.yaml#1 rejected (last good kept) c:80@c.yaml#1", "c.yaml#2 rejected (last good kept) c:80@c.yaml#1"},
		wantChanged:  []string{"a"},
		wantSame:     []string{"b", "c"},
		wantAffected: []string{"a", "c"},
	},
}

// previous is what the read before left, and the files it parsed.
func (tc decideCase) previous(t *testing.T) (previous, map[string]parsedFile) {
	prev := previous{inForce: map[config.Key]*config.Config{}, lastGood: memory{}}
	lastFiles := map[string]parsedFile{}
	held := map[string]*config.Config{}
	for _, s := range tc.inForce {
		c := cfg(t, s)
		prev.inForce[c.Key()] = c
		if !slices.Contains(slices.Collect(maps.Values(tc.held)), s) {
			held[c.Source] = c
		}
	}
	for pos, s := range tc.held {
		c := prev.inForce[cfg(t, s).Key()]
		require.NotNil(t, c, "%s holds a config in force", pos)
		held[pos] = c
	}
	for pos, c := range held {
		file, doc, _ := strings.Cut(pos, "#")
		n, _ := strconv.Atoi(doc)
		prev.status = append(prev.status, DocStatus{File: file, Doc: n, key: ptr(c.Key()), cfg: c, Status: statusApplied})
		lastFiles[file] = parsedFile{data: []byte{}}
	}
	// Rejected documents of files as before: their statuses say so.
	for _, f := range tc.files {
		if !f.asBefore {
			continue
		}
		lastFiles[f.rel] = parsedFile{data: []byte(f.yaml)}
		for _, d := range config.ParseFile(f.rel, []byte(f.yaml)) {
			if d.Err == nil {
				continue
			}
			pos := config.DocumentSource(f.rel, d.Index)
			st := DocStatus{File: f.rel, Doc: d.Index, key: d.Key, Status: statusRejected, Error: d.Err.Error()}
			if i := slices.IndexFunc(prev.status, func(st DocStatus) bool { return config.DocumentSource(st.File, st.Doc) == pos }); i >= 0 {
				st.Status, st.cfg = statusKept, prev.status[i].cfg
				prev.status[i] = st
				continue
			}
			prev.status = append(prev.status, st)
		}
	}
	slices.SortFunc(prev.status, func(a, b DocStatus) int {
		return strings.Compare(config.DocumentSource(a.File, a.Doc), config.DocumentSource(b.File, b.Doc))
	})
	for file, cs := range tc.lastGood {
		lg := lastGood{byKey: map[config.Key]*config.Config{}, bySource: map[string]*config.Config{}}
		for _, s := range cs {
			s, byKeyOnly := strings.CutPrefix(s, "key ")
			c := cfg(t, s)
			if in := prev.inForce[c.Key()]; in != nil && in.Source == c.Source {
				c = in
			}
			lg.byKey[c.Key()] = c
			if !byKeyOnly {
				lg.bySource[c.Source] = c
			}
		}
		prev.lastGood[file] = lg
		lastFiles[file] = parsedFile{data: []byte{}}
	}
	return prev, lastFiles
}

// reads are the files of the read, parsed; a file as before holds the configs in force.
func (tc decideCase) reads(t *testing.T, inForce map[config.Key]*config.Config) []fileRead {
	var reads []fileRead
	for _, f := range tc.files {
		r := fileRead{rel: f.rel, data: []byte(f.yaml), docs: config.ParseFile(f.rel, []byte(f.yaml)), reparsed: !f.asBefore && !f.unreadable}
		if f.unreadable {
			r.data, r.err = nil, errors.New("permission denied")
		}
		if f.asBefore {
			for i, d := range r.docs {
				if d.Config == nil {
					continue
				}
				if c := inForce[d.Config.Key()]; c != nil && c.Source == d.Config.Source {
					require.True(t, c.Equal(d.Config), "%s is as before", f.rel)
					r.docs[i].Config = c
				}
			}
		}
		reads = append(reads, r)
	}
	return reads
}

func (tc decideCase) check(t *testing.T, prev previous, reads []fileRead, dec decision, after map[config.Key]*config.Config) {
	t.Helper()
	inForce := []string{}
	for _, c := range after {
		inForce = append(inForce, cfgString(c))
	}
	slices.Sort(inForce)
	assert.Equal(t, tc.wantInForce, inForce, "in force")
	var status []string
	for i, st := range dec.status {
		s := st.File + "#" + strconv.Itoa(st.Doc) + " " + st.Status
		if st.cfg != nil {
			s += " " + cfgString(st.cfg)
		}
		status = append(status, s)
		if want, ok := tc.wantErr[i]; ok {
			assert.Contains(t, st.Error, want, "status %d", i)
		}
	}
	assert.Equal(t, tc.wantStatus, status, "statuses")
	assert.ElementsMatch(t, tc.wantChanged, keyNames(dec.changed), "changed")
	for _, name := range tc.wantSame {
		k := config.Key{Kind: config.ServiceEntry, Namespace: config.DefaultNamespace, Name: name}
		assert.Same(t, prev.inForce[k], after[k], "%s keeps its pointer", name)
	}
	for _, name := range tc.wantSame {
		// A document parsed anew is kept for the next read with the pointer in force.
		for _, r := range reads {
			for i, d := range r.docs {
				if r.reparsed && d.Config != nil && d.Config.Name == name {
					require.Contains(t, dec.docs, r.rel)
					assert.Same(t, prev.inForce[d.Config.Key()], dec.docs[r.rel][i].Config, "%s document %d", r.rel, i+1)
				}
			}
		}
	}
	if tc.wantLastGood != nil {
		m := cloneMemory(prev.lastGood)
		files := map[string]parsedFile{}
		for _, r := range reads {
			if r.err == nil {
				files[r.rel] = parsedFile{data: r.data}
			}
		}
		m.update(dec, files)
		assert.Equal(t, tc.wantLastGood, memoryStrings(m), "last good")
	}
}

// memoryStrings renders a memory by file: each config remembered by key, and at its source
// unless "key " says by key alone; "p file#document config" a position that remembers
// another config than the one remembered by its key.
func memoryStrings(m memory) map[string][]string {
	out := map[string][]string{}
	for file, lg := range m {
		var s []string
		for _, c := range lg.byKey {
			if lg.bySource[c.Source] == c {
				s = append(s, cfgString(c))
			} else {
				s = append(s, "key "+cfgString(c))
			}
		}
		for src, c := range lg.bySource {
			if lg.byKey[c.Key()] != c {
				s = append(s, "p "+src+" "+cfgString(c))
			}
		}
		slices.Sort(s)
		out[file] = s
	}
	return out
}

func cloneMemory(m memory) memory {
	out := memory{}
	for file, lg := range m {
		out[file] = lastGood{byKey: maps.Clone(lg.byKey), bySource: maps.Clone(lg.bySource)}
	}
	return out
}

func keyNames[V any](m map[config.Key]V) []string {
	out := []string{}
	for k := range m {
		out = append(out, k.Name)
	}
	return out
}

func statusIndexes(rs []rejection) []int {
	var out []int
	for _, r := range rs {
		out = append(out, r.status)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// TestScopeOf: which reads of named paths go through a scope, walk, or change nothing.
func TestScopeOf(t *testing.T) {
	a := cfg(t, "a:80@a.yaml#1")
	prev := previous{
		inForce: map[config.Key]*config.Config{a.Key(): a},
		status:  []DocStatus{{File: "a.yaml", Doc: 1, key: ptr(a.Key()), cfg: a, Status: statusApplied}},
	}
	files := map[string]parsedFile{"a.yaml": {data: []byte(se("a", 80))}, "empty.yaml": {data: []byte{}}}
	asBefore := fileRead{rel: "a.yaml", docs: []config.Document{{Index: 1, Key: ptr(a.Key()), Config: a}}}
	empty := fileRead{rel: "empty.yaml"}
	for _, tc := range []struct {
		name            string
		reads           []fileRead
		walk, unchanged bool
	}{
		{name: "nothing changed", reads: []fileRead{asBefore, empty}, unchanged: true},
		{name: "an empty file gone is a change", reads: []fileRead{asBefore}},
		{name: "a file as before with another number of documents than its statuses walks", reads: []fileRead{{rel: "a.yaml"}, empty}, walk: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prev
			walk, unchanged := scopeOf(tc.reads, &p, files, &scope{})
			assert.Equal(t, tc.walk, walk, "walk")
			assert.Equal(t, tc.unchanged, unchanged, "unchanged")
		})
	}
}
