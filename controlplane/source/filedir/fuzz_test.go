package filedir

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// fuzzKeeper is the good file every fuzz input's directory holds besides the random ones.
const fuzzKeeper = "keeper-zz9"

// fuzzName turns fuzz bytes into a file name the OS takes: no separators, no NUL, not
// empty, bounded; ext 0..3 picks .yaml, .yml, .json or the name as it is.
func fuzzName(raw string, ext uint8) string {
	n := strings.Map(func(r rune) rune {
		if r == '/' || r == 0 || r == '\\' {
			return '_'
		}
		return r
	}, raw)
	if len(n) > 100 {
		n = n[:100]
	}
	if n == "" || n == "." || n == ".." {
		n = "f"
	}
	return n + [...]string{".yaml", ".yml", ".json", ""}[ext%4]
}

// fuzzBody shapes a random file's bytes by mode: UTF-16 byte order marks, NUL bytes, a huge
// line, and a second document after a separator.
func fuzzBody(body []byte, mode uint8) []byte {
	out := append([]byte(nil), body...)
	switch mode % 4 {
	case 1:
		out = append([]byte{0xff, 0xfe}, out...) // UTF-16 LE BOM
	case 2:
		out = append([]byte{0xfe, 0xff}, out...) // UTF-16 BE BOM
	case 3:
		out = append([]byte{0xef, 0xbb, 0xbf}, out...) // UTF-8 BOM
	}
	if mode&4 != 0 {
		out = bytes.ReplaceAll(out, []byte(" "), []byte{0})
	}
	if mode&8 != 0 {
		out = append(out, bytes.Repeat([]byte("x"), 1<<20)...) // a 1 MiB line
	}
	if mode&16 != 0 {
		out = append(out, []byte("\n---\n"+se("fuzz-second", 81)+"--- # trailing\n")...)
	}
	return out
}

// FuzzConfigDir writes two random files beside a good one into a fresh directory and reads
// it: the read never panics, every document the parser rejects is reported under its
// file's name with a reason, and the good file's config is in force.
func FuzzConfigDir(f *testing.F) {
	f.Add("a", []byte(se("svc", 80)), "b", []byte("kind: [unclosed"), uint8(0), uint8(0))
	f.Add("dup", []byte(se(fuzzKeeper, 80)), "utf16", []byte("kind: ServiceEntry\n"), uint8(1), uint8(0x11))
	f.Add("nul", []byte(se("n", 80)), "huge", []byte("spec: {}\n"), uint8(2), uint8(0x0c))
	f.Add(".hidden", []byte(se("h", 80)), "x.txt", []byte("apiVersion: v1\n"), uint8(3), uint8(0x12))
	f.Fuzz(func(t *testing.T, name1 string, body1 []byte, name2 string, body2 []byte, ext, mode uint8) {
		dir := t.TempDir()
		write(t, filepath.Join(dir, "0-good.yaml"), se(fuzzKeeper, 80))
		files := map[string][]byte{"0-good.yaml": []byte(se(fuzzKeeper, 80))}
		for i, nb := range []struct {
			name string
			body []byte
		}{{name1, body1}, {name2, body2}} {
			n := fuzzName(nb.name, ext>>(2*i))
			if _, taken := files[n]; taken {
				continue
			}
			files[n] = fuzzBody(nb.body, mode>>(i*5))
			if err := os.WriteFile(filepath.Join(dir, n), files[n], 0o644); err != nil {
				t.Skipf("the OS refuses the name %q: %v", n, err)
			}
		}
		s := newSource(dir)
		if err := s.Sync(); err != nil {
			t.Fatalf("Sync: %v", err)
		}
		checkFuzzStatus(t, s, files)
		if err := s.Sync(); err != nil { // again, from what it read: the same outcome
			t.Fatalf("second Sync: %v", err)
		}
		checkFuzzStatus(t, s, files)
	})
}

func checkFuzzStatus(t *testing.T, s *Source, files map[string][]byte) {
	t.Helper()
	byDoc := map[string]DocStatus{}
	for _, st := range s.Status() {
		if _, ok := files[st.File]; !ok {
			t.Fatalf("status for a file never written: %+v", st)
		}
		if st.Status != statusApplied && (st.Error == "" || !strings.Contains(st.Error, st.File)) {
			t.Fatalf("rejection does not name its file: %+v", st)
		}
		byDoc[config.DocumentSource(st.File, st.Doc)] = st
	}
	for name, data := range files {
		if !isConfigFile(name) {
			continue
		}
		for _, d := range config.ParseFile(name, data) {
			st, ok := byDoc[config.DocumentSource(name, d.Index)]
			if !ok {
				t.Fatalf("%s document %d has no status", name, d.Index)
			}
			if d.Err != nil && st.Status == statusApplied {
				t.Fatalf("%s document %d: parser rejects it (%v) but the source applied it", name, d.Index, d.Err)
			}
		}
	}
	good := byDoc[config.DocumentSource("0-good.yaml", 1)]
	if strings.Contains(good.Error, "already defined in") { // a random file sorting first took its name
		return
	}
	if good.Status != statusApplied || good.InForce() == nil || good.InForce().Name != fuzzKeeper {
		t.Fatalf("the good file is not in force: %+v", good)
	}
}
