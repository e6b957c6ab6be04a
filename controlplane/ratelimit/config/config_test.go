package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run with -update after checking):\n--- got\n%s--- want\n%s", name, got, want)
	}
}

// TestMatchGolden runs request descriptors through testdata/good and compares the limits
// found with testdata/match.golden.
func TestMatchGolden(t *testing.T) {
	cfg, err := Load("testdata/good")
	if err != nil {
		t.Fatal(err)
	}
	requests := []struct {
		domain  string
		entries string // key=value,key=value
	}{
		{"frontend", "remote_address=10.0.0.1"},
		{"frontend", "remote_address="},
		{"frontend", "header_match=bots"},
		{"frontend", "header_match=browsers"},
		{"frontend", "destination_cluster=internal"},
		{"frontend", "destination_cluster=other"},
		{"frontend", "source_cluster=a,destination_cluster=reviews"},
		{"frontend", "source_cluster=b,destination_cluster=ratings"},
		{"frontend", "source_cluster=a"},
		{"frontend", "source_cluster=a,destination_cluster=reviews,extra=1"},
		{"frontend", "remote_address=10.0.0.1,extra=1"},
		{"frontend", "unknown=1"},
		{"api", "path=/login"},
		{"api", "path=/other"},
		{"api", "path=/login,method=POST"},
		{"api", "path=/x,method=POST"},
		{"api", "path=/x,method=GET"},
		{"api", "file=/files/x.pdf"},
		{"api", "file=/files/.pdf"},
		{"api", "file=/files/x.pdf.txt"},
		{"api", "file=/files/axbxc"},
		{"api", "file=/files/exact"},
		{"api", "file=/other"},
		{"api", "files=/files/x.pdf"},
		{"api", "tag=axxbyyc"},
		{"api", "tag=abc"},
		{"api", "tag=acb"},
		{"api", "tag=abcx"},
		{"api", "tag=x"},
		{"api", "tag=xx"},
		{"nowhere", "path=/login"},
	}
	var b strings.Builder
	for _, r := range requests {
		var entries []Entry
		for _, kv := range strings.Split(r.entries, ",") {
			k, v, _ := strings.Cut(kv, "=")
			entries = append(entries, Entry{Key: k, Value: v})
		}
		fmt.Fprintf(&b, "%s %s -> ", r.domain, r.entries)
		m := cfg.Find(r.domain, entries)
		if m == nil {
			b.WriteString("no limit\n")
			continue
		}
		fmt.Fprintf(&b, "%d/%s unlimited=%v shadow=%v name=%q key=%s metric=%s\n", m.RequestsPerUnit, m.Unit,
			m.Unlimited, m.ShadowMode, m.Name, m.Key, m.MetricKey)
	}
	var domains []string
	for name, d := range cfg.Domains {
		domains = append(domains, fmt.Sprintf("domain %s from %s failure_mode_deny=%v", name, d.File, d.FailureModeDeny))
	}
	sort.Strings(domains)
	golden(t, "match.golden", strings.Join(domains, "\n")+"\n"+b.String())
}

// TestBadFilesGolden checks that every file of testdata/bad is rejected with an error naming
// the file, the path in the document and the reason.
func TestBadFilesGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no bad files: %v", err)
	}
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Parse(filepath.Base(f), data)
		var ce *Error
		if !errors.As(err, &ce) {
			t.Errorf("%s: want a *config.Error, got %v", f, err)
			continue
		}
		if ce.File != filepath.Base(f) {
			t.Errorf("%s: error names file %q", f, ce.File)
		}
		b.WriteString(err.Error() + "\n")
	}
	golden(t, "bad.golden", b.String())
}

func TestLoadRejectsDirectoryWithOneBadFile(t *testing.T) {
	dir := t.TempDir()
	good, _ := os.ReadFile("testdata/good/api.yml")
	bad, _ := os.ReadFile("testdata/bad/unit.yaml")
	os.WriteFile(filepath.Join(dir, "api.yaml"), good, 0o644)
	os.WriteFile(filepath.Join(dir, "broken.yaml"), bad, 0o644)
	_, err := Load(dir)
	if err == nil || !strings.Contains(err.Error(), "broken.yaml: descriptors[0].descriptors[0].rate_limit.unit: unknown unit") {
		t.Fatalf("want the error to name broken.yaml and the unit's path, got %v", err)
	}
	os.WriteFile(filepath.Join(dir, "broken.yaml"), good, 0o644)
	_, err = Load(dir)
	if err == nil || !strings.Contains(err.Error(), `domain "api" is already defined in api.yaml`) {
		t.Fatalf("want a duplicate domain error, got %v", err)
	}
}
