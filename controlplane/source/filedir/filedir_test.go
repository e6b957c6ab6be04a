package filedir

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/source"
	"github.com/wasmesh/wasmesh/controlplane/source/sourcetest"
)

func se(name string, port int) string {
	return "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: " + name + "}\n" +
		"spec: {hosts: [" + name + ".example.com], ports: [{number: " + strconv.Itoa(port) + ", name: http}]}\n"
}

func write(t testing.TB, path, data string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(data), 0o644))
}

// newSource returns a source for dir that logs nowhere, publishing to a recorder.
func newSource(dir string) *Source {
	return record(New(dir, slog.New(slog.NewTextHandler(io.Discard, nil)), metrics.New(prometheus.NewRegistry())))
}

// record makes a recorder the source's sink: what the source publishes from now on adds up
// there (list, changes).
func record(s *Source) *Source {
	s.sink = sourcetest.NewRecorder()
	return s
}

// recorder is the source's recorder, read under the lock Run's Publish sets it under.
func recorder(s *Source) *sourcetest.Recorder {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sink.(*sourcetest.Recorder)
}

// list is the configs the source's events put in force, sorted.
func list(s *Source) []*config.Config { return recorder(s).List() }

// changes is the keys of each change event the source published.
func changes(s *Source) []map[config.Key]struct{} {
	var out []map[config.Key]struct{}
	for _, ev := range recorder(s).ConfigEvents() {
		out = append(out, eventKeys(ev))
	}
	return out
}

func eventKeys(ev source.ConfigEvent) map[config.Key]struct{} {
	keys := map[config.Key]struct{}{}
	for _, c := range ev.Updated {
		keys[c.Key()] = struct{}{}
	}
	for _, k := range ev.Deleted {
		keys[k] = struct{}{}
	}
	return keys
}

// watch runs the source's watcher until the test ends, publishing to its recorder.
func watch(t *testing.T, s *Source) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	sink := recorder(s)
	go func() { done <- s.Run(ctx, sink) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
}

// configNames lists the names of the configs in force, in order.
func configNames(s *Source) []string {
	var out []string
	for _, c := range list(s) {
		out = append(out, c.Name)
	}
	return out
}

func portOf(t *testing.T, s *Source, name string) uint32 {
	for _, c := range list(s) {
		if c.Name == name {
			return c.Spec.(*networking.ServiceEntry).GetPorts()[0].GetNumber()
		}
	}
	t.Fatalf("config %s not in force", name)
	return 0
}

func TestBadDocumentKeepsLastGoodAndOthersApply(t *testing.T) {
	dir := t.TempDir()
	m := metrics.New(prometheus.NewRegistry())
	s := record(New(dir, slog.New(slog.NewTextHandler(io.Discard, nil)), m))

	write(t, filepath.Join(dir, "a.yaml"), se("a", 8080)+"---\n"+se("b", 8081))
	require.NoError(t, s.Sync())
	require.Len(t, list(s), 2)
	require.Len(t, changes(s), 1)

	// b breaks (port out of range), a changes: a applies, b keeps its last good version.
	write(t, filepath.Join(dir, "a.yaml"), se("a", 9090)+"---\n"+se("b", 99999))
	require.NoError(t, s.Sync())
	assert.Equal(t, uint32(9090), portOf(t, s, "a"))
	assert.Equal(t, uint32(8081), portOf(t, s, "b"))
	require.Len(t, changes(s), 2)
	assert.Equal(t, map[config.Key]struct{}{{Kind: config.ServiceEntry, Namespace: "default", Name: "a"}: {}}, changes(s)[1])
	st := s.Status()
	require.Len(t, st, 2)
	assert.Equal(t, "rejected (last good kept)", st[1].Status)
	assert.Contains(t, st[1].Error, "a.yaml: document 2")
	assert.Contains(t, st[1].Error, "spec.ports[0].number")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.ConfigRejects.WithLabelValues("ServiceEntry")))

	// The same error on a rescan is not counted again.
	require.NoError(t, s.Sync())
	assert.Equal(t, 1.0, testutil.ToFloat64(m.ConfigRejects.WithLabelValues("ServiceEntry")))

	// Broken YAML that cannot even be named keeps what that document position held.
	write(t, filepath.Join(dir, "a.yaml"), se("a", 9090)+"---\nkind: [broken\n")
	require.NoError(t, s.Sync())
	assert.Equal(t, uint32(8081), portOf(t, s, "b"))

	// Deleting the file removes its configs.
	require.NoError(t, os.Remove(filepath.Join(dir, "a.yaml")))
	require.NoError(t, s.Sync())
	assert.Empty(t, list(s))
}

func TestDuplicateKeyAcrossFilesRejected(t *testing.T) {
	dir := t.TempDir()
	s := newSource(dir)
	write(t, filepath.Join(dir, "1.yaml"), se("a", 8080))
	write(t, filepath.Join(dir, "2.yaml"), se("a", 8081))
	require.NoError(t, s.Sync())
	assert.Equal(t, uint32(8080), portOf(t, s, "a"))
	assert.Contains(t, s.Status()[1].Error, "already defined in 1.yaml#1")
}

// A document too broken to name its config keeps what its position last held: the config
// applied there, not one kept by key elsewhere that still carries the position it was
// applied from, even after a read saw the file empty.
func TestUnnamedDocumentKeepsWhatItsPositionHeld(t *testing.T) {
	dir := t.TempDir()
	s := newSource(dir)
	f := filepath.Join(dir, "f.yaml")
	names := func() []string {
		var out []string
		for _, c := range list(s) {
			out = append(out, c.Name+"@"+c.Source)
		}
		return out
	}
	write(t, f, se("b", 80))
	require.NoError(t, s.Sync())
	// b moves to the second position and breaks (kept, still carrying f.yaml#1); c takes
	// the first.
	write(t, f, se("c", 80)+"---\n"+se("b", 0))
	require.NoError(t, s.Sync())
	write(t, f, se("c", 80)+"---\n"+se("b", 0)+"---\n"+se("d", 80)) // read again, c unchanged
	require.NoError(t, s.Sync())
	require.Equal(t, []string{"b@f.yaml#1", "c@f.yaml#1", "d@f.yaml#3"}, names())
	write(t, f, "") // an editor truncating before it writes
	require.NoError(t, s.Sync())
	write(t, f, "kind: [broken\n")
	require.NoError(t, s.Sync())
	assert.Equal(t, []string{"c@f.yaml#1"}, names(), "the first position last applied c")
}

func TestRunWatchesDirectory(t *testing.T) {
	dir := t.TempDir()
	s := newSource(dir)
	require.NoError(t, s.Sync())
	watch(t, s)

	key := config.Key{Kind: config.ServiceEntry, Namespace: "default", Name: "late"}
	// The watch is registered asynchronously; rewriting the file until it is seen avoids a race
	// between Run's start and the first write.
	require.Eventually(t, func() bool {
		write(t, filepath.Join(dir, "late.yaml"), se("late", 8080))
		return recorder(s).Get(key) != nil
	}, 10*time.Second, 50*time.Millisecond)
}

// An editor that truncates before writing can be read in between: the rejected document
// still falls back to its last good version afterwards.
func TestLastGoodSurvivesAnEmptyReadInBetween(t *testing.T) {
	dir := t.TempDir()
	s := newSource(dir)
	write(t, filepath.Join(dir, "a.yaml"), se("a", 8080)+"---\n"+se("b", 8081))
	require.NoError(t, s.Sync())
	write(t, filepath.Join(dir, "a.yaml"), "")
	require.NoError(t, s.Sync())
	assert.Empty(t, list(s))
	write(t, filepath.Join(dir, "a.yaml"), se("a", 9090)+"---\n"+se("b", 0))
	require.NoError(t, s.Sync())
	assert.Equal(t, uint32(9090), portOf(t, s, "a"))
	assert.Equal(t, uint32(8081), portOf(t, s, "b"))

	// Once the file is deleted, its history goes with it.
	require.NoError(t, os.Remove(filepath.Join(dir, "a.yaml")))
	require.NoError(t, s.Sync())
	write(t, filepath.Join(dir, "a.yaml"), se("b", 0))
	require.NoError(t, s.Sync())
	assert.Empty(t, list(s))
}

// An unchanged file is recognised without a copy; any change, including one past the first
// 32 KiB chunk or of the length, is read whole.
func TestReadChangedKeepsUnchangedBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.yaml")
	big := make([]byte, 100<<10)
	for i := range big {
		big[i] = byte('a' + i%26)
	}
	require.NoError(t, os.WriteFile(path, big, 0o644))
	had, err := readChanged(path, nil)
	require.NoError(t, err)
	require.Equal(t, big, had)

	same, err := readChanged(path, had)
	require.NoError(t, err)
	assert.Same(t, &had[0], &same[0], "unchanged bytes come back as the slice given")

	for name, edit := range map[string]func([]byte) []byte{
		"byte in the last chunk":  func(b []byte) []byte { b[len(b)-1] = '!'; return b },
		"byte in the first chunk": func(b []byte) []byte { b[10] = '!'; return b },
		"grown":                   func(b []byte) []byte { return append(b, 'x') },
		"shrunk":                  func(b []byte) []byte { return b[:len(b)-1] },
	} {
		want := edit(append([]byte(nil), big...))
		require.NoError(t, os.WriteFile(path, want, 0o644))
		got, err := readChanged(path, had)
		require.NoError(t, err, name)
		assert.Equal(t, want, got, name)
	}
	require.NoError(t, os.Remove(path))
	_, err = readChanged(path, had)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// A read that changes a few configs of many updates the sorted list in place: it must stay
// sorted and hold exactly what is in force, with the new versions, and a config that moves
// to another file is reported with its new source.
func TestListFollowsSmallChanges(t *testing.T) {
	dir := t.TempDir()
	s := newSource(dir)
	big := func(port int) string {
		var b strings.Builder
		for i := range 40 {
			if i > 0 {
				b.WriteString("---\n")
			}
			p := 80
			if i == 7 {
				p = port
			}
			b.WriteString(se("svc-"+strconv.Itoa(i), p))
		}
		return b.String()
	}
	check := func(want ...string) {
		t.Helper()
		var names []string
		for _, c := range list(s) {
			names = append(names, c.Name)
		}
		slices.Sort(want)
		assert.Equal(t, want, names, "List must be sorted and hold what is in force")
	}
	all := func(extra ...string) []string {
		out := slices.Clone(extra)
		for i := range 40 {
			out = append(out, "svc-"+strconv.Itoa(i))
		}
		return out
	}
	write(t, filepath.Join(dir, "big.yaml"), big(80))
	require.NoError(t, s.Sync())
	check(all()...)
	unchanged := list(s)[0]

	write(t, filepath.Join(dir, "extra.yaml"), se("aaa", 80)) // sorts first
	require.NoError(t, s.Sync())
	check(all("aaa")...)

	write(t, filepath.Join(dir, "big.yaml"), big(9090)) // one config of the file changes
	require.NoError(t, s.Sync())
	check(all("aaa")...)
	assert.Equal(t, uint32(9090), portOf(t, s, "svc-7"))
	assert.Same(t, unchanged, list(s)[1], "an unchanged config of a re-read file keeps its pointer")
	assert.Equal(t, map[config.Key]struct{}{{Kind: config.ServiceEntry, Namespace: config.DefaultNamespace, Name: "svc-7"}: {}}, changes(s)[len(changes(s))-1])

	write(t, filepath.Join(dir, "extra.yaml"), se("zzz", 80)) // one out, one in at the end
	require.NoError(t, s.Sync())
	check(all("zzz")...)

	require.NoError(t, os.Remove(filepath.Join(dir, "extra.yaml")))
	write(t, filepath.Join(dir, "moved.yaml"), se("zzz", 80))
	require.NoError(t, s.Sync())
	check(all("zzz")...)
	moved := list(s)[len(list(s))-1]
	assert.Equal(t, "moved.yaml#1", moved.Source)
	assert.Contains(t, changes(s)[len(changes(s))-1], moved.Key(), "a config that moved files is a change of its source")
}

// What the watcher saw is what is read again: a file it did not name is not (its change is
// seen by the next full read), one it names that is gone takes its configs away, and a
// directory it names is read whole, as a walk would.
func TestSyncPathsReadsWhatTheWatcherNamed(t *testing.T) {
	dir := t.TempDir()
	s := newSource(dir)
	write(t, filepath.Join(dir, "a.yaml"), se("a", 80))
	write(t, filepath.Join(dir, "b.yaml"), se("b", 80))
	require.NoError(t, s.Sync())
	paths := func(rels ...string) map[string]struct{} {
		out := map[string]struct{}{}
		for _, rel := range rels {
			out[filepath.Join(dir, rel)] = struct{}{}
		}
		return out
	}

	write(t, filepath.Join(dir, "a.yaml"), se("a", 81))
	write(t, filepath.Join(dir, "b.yaml"), se("b", 82))
	write(t, filepath.Join(dir, "c.yaml"), se("c", 83))
	require.NoError(t, s.SyncPaths(paths("a.yaml", "c.yaml", ".a.yaml.swp")))
	assert.Equal(t, uint32(81), portOf(t, s, "a"))
	assert.Equal(t, uint32(80), portOf(t, s, "b"), "b.yaml was not named: not read again")
	assert.Equal(t, uint32(83), portOf(t, s, "c"))

	require.NoError(t, os.Remove(filepath.Join(dir, "a.yaml")))
	require.NoError(t, s.SyncPaths(paths("a.yaml")))
	assert.Equal(t, []string{"b", "c"}, configNames(s))
	assert.Equal(t, uint32(80), portOf(t, s, "b"))

	require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	write(t, filepath.Join(dir, "sub", "d.yaml"), se("d", 84))
	require.NoError(t, s.SyncPaths(paths("sub")))
	assert.Equal(t, []string{"b", "c", "d"}, configNames(s))
	assert.Equal(t, uint32(82), portOf(t, s, "b"), "a directory is read whole")

	require.NoError(t, os.RemoveAll(filepath.Join(dir, "sub")))
	require.NoError(t, s.SyncPaths(paths("sub")))
	assert.Equal(t, []string{"b", "c"}, configNames(s), "a removed directory takes its files' configs")
}

// Through the watcher, as editors and tools change files: a save by rename over the file,
// a removal, and a new subdirectory with a file in it.
func TestRunFollowsRenamesRemovalsAndNewDirectories(t *testing.T) {
	dir := t.TempDir()
	s := newSource(dir)
	write(t, filepath.Join(dir, "a.yaml"), se("a", 80))
	write(t, filepath.Join(dir, "b.yaml"), se("b", 80))
	require.NoError(t, s.Sync())
	watch(t, s)
	inForce := func(name string) bool { return slices.Contains(configNames(s), name) }

	select {
	case <-s.Watching():
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not start")
	}
	tmp := filepath.Join(dir, ".a.yaml.tmp")
	write(t, tmp, se("a", 8001))
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, "a.yaml")))
	require.Eventually(t, func() bool { return portOf(t, s, "a") == 8001 }, 10*time.Second, 10*time.Millisecond, "a save by rename")
	assert.Equal(t, uint32(80), portOf(t, s, "b"))

	require.NoError(t, os.Remove(filepath.Join(dir, "b.yaml")))
	require.Eventually(t, func() bool { return !inForce("b") }, 10*time.Second, 10*time.Millisecond, "a removal")

	require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	write(t, filepath.Join(dir, "sub", "c.yaml"), se("c", 80))
	require.Eventually(t, func() bool { return inForce("c") }, 10*time.Second, 10*time.Millisecond, "a new directory")
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "sub")))
	require.Eventually(t, func() bool { return !inForce("c") }, 10*time.Second, 10*time.Millisecond, "a removed directory")
	assert.True(t, inForce("a"))
}

// A read of the files the watcher named (SyncPaths) leaves the source exactly as a read of
// the whole tree would: the configs in force, the per-document status and the changes
// handed to handlers, over a random walk of edits, removals, duplicates across files and
// invalid documents (last good kept).
func TestSyncPathsMatchesAWalkOfTheTree(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	dirA, dirB := t.TempDir(), t.TempDir()
	a, b := newSource(dirA), newSource(dirB)
	changed := func(s *Source) []string {
		var out []string
		for _, c := range changes(s) {
			keys := make([]string, 0, len(c))
			for k := range c {
				keys = append(keys, k.String())
			}
			slices.Sort(keys)
			out = append(out, strings.Join(keys, ","))
		}
		return out
	}
	doc := func() string {
		name := "svc-" + strconv.Itoa(rng.IntN(12))
		switch rng.IntN(10) {
		case 0:
			return se(name, 0) // invalid: port 0
		case 1:
			return "kind: [unterminated\n" // names no config: its last good is found by position
		default:
			return se(name, 80+rng.IntN(3))
		}
	}
	state := func(s *Source) string {
		var out strings.Builder
		for _, c := range list(s) {
			out.WriteString(c.Key().String() + " " + c.Source + " " + strconv.Itoa(int(c.Spec.(*networking.ServiceEntry).GetPorts()[0].GetNumber())) + "\n")
		}
		for _, st := range s.Status() {
			out.WriteString(st.File + "#" + strconv.Itoa(st.Doc) + " " + st.Config + " " + st.Status + " " + st.Error + "\n")
		}
		return out.String()
	}
	for step := range 400 {
		rel := "f" + strconv.Itoa(rng.IntN(5)) + ".yaml"
		if rng.IntN(2) == 0 {
			rel = filepath.Join("sub", rel)
		}
		var content string
		remove := rng.IntN(6) == 0
		if !remove {
			docs := make([]string, rng.IntN(4))
			for i := range docs {
				docs[i] = doc()
			}
			content = strings.Join(docs, "---\n")
		}
		for _, dir := range []string{dirA, dirB} {
			p := filepath.Join(dir, rel)
			if remove {
				_ = os.Remove(p)
				continue
			}
			require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			write(t, p, content)
		}
		require.NoError(t, a.SyncPaths(map[string]struct{}{filepath.Join(dirA, rel): {}}))
		require.NoError(t, b.Sync())
		require.Equal(t, state(b), state(a), "step %d: %s", step, rel)
		require.Equal(t, changed(b), changed(a), "step %d: %s", step, rel)
		require.Equal(t, a.sorted, list(a), "step %d: the events add up to what is in force", step)
	}
}

// Publish hands a sink everything in force as one event, says the source is synced, and
// from then on every change; the events add up to what the directory holds.
func TestPublishSendsWhatIsInForceThenEveryChange(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), se("a", 8080)+"---\n"+se("b", 8081))
	s := New(dir, slog.New(slog.NewTextHandler(io.Discard, nil)), metrics.New(prometheus.NewRegistry()))
	rec := sourcetest.NewRecorder()
	require.NoError(t, s.Publish(rec))
	require.True(t, rec.IsSynced(Name))
	require.Len(t, rec.ConfigEvents(), 1)
	assert.Len(t, rec.ConfigEvents()[0].Updated, 2, "the first event carries everything in force")

	write(t, filepath.Join(dir, "a.yaml"), se("a", 9090))
	require.NoError(t, s.Sync())
	evs := rec.ConfigEvents()
	require.Len(t, evs, 2)
	last := evs[1]
	require.Len(t, last.Updated, 1)
	assert.Equal(t, "a", last.Updated[0].Name)
	assert.Equal(t, []config.Key{{Kind: config.ServiceEntry, Namespace: "default", Name: "b"}}, last.Deleted)
	require.Len(t, rec.List(), 1)
	assert.Equal(t, "a", rec.List()[0].Name)
}
