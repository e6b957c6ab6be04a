package filtertest

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// FuzzScenarioParse reads random scenario files through Parse and Load: no panic, a
// rejection is a message (Load's names the file), an accepted scenario satisfies the
// checks Parse makes (a module, cases with distinct names) and parses the same again.
func FuzzScenarioParse(f *testing.F) {
	if b, err := os.ReadFile("testdata/kitchen.yaml"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("wasm: x.wasm\ncases: [{name: a}, {name: a}]\n"))
	f.Add([]byte("wasm: x.wasm\nplugin: {instances: 1}\ncases: [{name: a, worker: 3}]\n"))
	f.Add([]byte("wasm: x.wasm\nplugin: {expectStartError: boom}\n"))
	f.Add([]byte("wasm: x.wasm\nhttpCalls: {c: {noAnswer: true, fail: true}}\ncases: [{name: a}]\n"))
	f.Add([]byte("wasm: x.wasm\nbogus: 1\ncases: [{name: a, request: {delay: notaduration}}]\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		watchdog := time.AfterFunc(5*time.Second, func() { // a hang is a failure, with the stacks
			buf := make([]byte, 1<<20)
			panic("scenario parse still running after 5s:\n" + string(buf[:runtime.Stack(buf, true)]))
		})
		defer watchdog.Stop()
		s, err := Parse(raw)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("rejected without a message")
			}
		} else {
			if verr := s.validate(); verr != nil || s.Wasm == "" {
				t.Fatalf("accepted a scenario its own checks refuse: %v", verr)
			}
			if _, err2 := Parse(raw); err2 != nil {
				t.Fatalf("accepted once, refused the second time: %v", err2)
			}
		}
		path := filepath.Join(t.TempDir(), "scenario.yaml")
		if werr := os.WriteFile(path, raw, 0o644); werr != nil {
			t.Fatal(werr)
		}
		_, lerr := Load(path)
		if (lerr == nil) != (err == nil) {
			t.Fatalf("Load and Parse disagree: %v / %v", lerr, err)
		}
		if lerr != nil && !strings.HasPrefix(lerr.Error(), path+": ") {
			t.Fatalf("Load's error does not name the file: %q", lerr)
		}
	})
}
