// Package wasmbuild compiles a Go package directory into a proxy-wasm reactor module
// (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared) for tests and tools, caching the result by
// the content of the sources so that a guest is built once however many tests ask for it.
package wasmbuild

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
)

// Workspace says whether the build uses the go.work that encloses the directory.
type Workspace int

const (
	// WorkspaceAuto uses the enclosing go.work only when it lists the guest's module in its
	// `use` directives; otherwise it builds with GOWORK=off. A guest module that lives under
	// the repository but outside the workspace (test guests with their own go.mod) would
	// otherwise fail with "directory is outside modules listed in go.work".
	WorkspaceAuto Workspace = iota
	// WorkspaceOn builds with whatever go.work the go command finds.
	WorkspaceOn
	// WorkspaceOff builds with GOWORK=off.
	WorkspaceOff
)

// Options tune a build. The zero value is ready to use.
type Options struct {
	// CacheDir holds built modules. Empty means <user cache dir>/wasmesh/wasmbuild.
	CacheDir string
	// Workspace chooses how go.work is treated.
	Workspace Workspace
	// Env is appended to the build environment (after GOOS/GOARCH), e.g. "GOFLAGS=-mod=mod".
	Env []string
	// GoCommand is the go binary; empty means "go" from PATH, falling back to GOROOT/bin/go.
	GoCommand string
}

// Artifact is a built module.
type Artifact struct {
	// Path is the .wasm file in the cache directory; treat it as read-only.
	Path string
	// Key is the content key the artifact is cached under.
	Key string
	// Cached reports whether the artifact came from the cache rather than a fresh build.
	Cached bool
}

// Bytes reads the artifact.
func (a Artifact) Bytes() ([]byte, error) {
	b, err := os.ReadFile(a.Path)
	if err != nil {
		return nil, fmt.Errorf("wasmbuild: read %s: %w", a.Path, err)
	}
	return b, nil
}

// Builder memoises builds within one process, on top of the on-disk cache. Share one
// Builder between tests to avoid even hashing the sources twice. Safe for concurrent use.
type Builder struct {
	opts Options

	mu   sync.Mutex
	done map[string]*buildOnce
}

type buildOnce struct {
	once sync.Once
	art  Artifact
	err  error
}

// New returns a Builder using opts.
func New(opts Options) *Builder {
	return &Builder{opts: opts, done: map[string]*buildOnce{}}
}

// Build compiles dir (a directory holding package main) once per Builder.
func (b *Builder) Build(ctx context.Context, dir string) (Artifact, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Artifact{}, fmt.Errorf("wasmbuild: %w", err)
	}
	b.mu.Lock()
	o, ok := b.done[abs]
	if !ok {
		o = &buildOnce{}
		b.done[abs] = o
	}
	b.mu.Unlock()
	o.once.Do(func() { o.art, o.err = Build(ctx, abs, b.opts) })
	return o.art, o.err
}

// Build compiles dir into a reactor module, reusing a cached artifact when the sources of
// the guest's module (and, with a workspace, of every workspace module), the Go version,
// the build settings (buildSettings) and the options are unchanged. Concurrent builds of
// the same key, even from different processes, are safe: the artifact is written to a
// temporary file and renamed into place.
func Build(ctx context.Context, dir string, opts Options) (Artifact, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Artifact{}, fmt.Errorf("wasmbuild: %w", err)
	}
	modRoot, err := findUp(abs, "go.mod")
	if err != nil {
		return Artifact{}, fmt.Errorf("wasmbuild: %s: %w", abs, err)
	}
	goCmd := opts.GoCommand
	if goCmd == "" {
		goCmd = defaultGo()
	}

	useWork := false
	var workRoots []string
	var workFile string
	if wd, werr := findUp(modRoot, "go.work"); werr == nil && os.Getenv("GOWORK") != "off" {
		workFile = filepath.Join(wd, "go.work")
		roots, perr := parseWorkUses(workFile)
		if perr != nil && opts.Workspace != WorkspaceOff {
			return Artifact{}, perr
		}
		switch opts.Workspace {
		case WorkspaceOn:
			useWork = true
		case WorkspaceAuto:
			useWork = contains(roots, modRoot)
		}
		if useWork {
			workRoots = roots
		}
	}

	env := []string{"GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0"}
	if !useWork {
		env = append(env, "GOWORK=off")
	}
	env = append(env, opts.Env...)

	// The settings that change what the go command builds, as it resolves them from the
	// environment and go env's own file: a GOEXPERIMENT or GOFLAGS set for one build must
	// not reuse another's artifact.
	settings, err := output(ctx, goCmd, abs, env, append([]string{"env"}, buildSettings...)...)
	if err != nil {
		return Artifact{}, err
	}
	h := sha256.New()
	fmt.Fprintf(h, "v2\x00%s\x00%s\x00%s\x00", settings, abs, strings.Join(env, "\x00"))
	roots := []string{modRoot}
	if useWork {
		fmt.Fprintf(h, "work\x00")
		if err := hashFile(h, workFile); err != nil {
			return Artifact{}, err
		}
		roots = append(roots, workRoots...)
	}
	sort.Strings(roots)
	for _, r := range dedupe(roots) {
		if err := hashTree(h, r); err != nil {
			return Artifact{}, err
		}
	}
	key := hex.EncodeToString(h.Sum(nil))[:32]

	cacheDir := opts.CacheDir
	if cacheDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		cacheDir = filepath.Join(base, "wasmesh", "wasmbuild")
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return Artifact{}, fmt.Errorf("wasmbuild: cache dir: %w", err)
	}
	out := filepath.Join(cacheDir, filepath.Base(abs)+"-"+key+".wasm")
	if st, err := os.Stat(out); err == nil && st.Size() > 0 {
		return Artifact{Path: out, Key: key, Cached: true}, nil
	}

	tmp, err := os.CreateTemp(cacheDir, ".build-*.wasm")
	if err != nil {
		return Artifact{}, fmt.Errorf("wasmbuild: %w", err)
	}
	tmpName := tmp.Name()
	_ = tmp.Close()
	defer os.Remove(tmpName) // harmless after a successful rename

	if _, err := output(ctx, goCmd, abs, env, "build", "-buildmode=c-shared", "-trimpath", "-o", tmpName, "."); err != nil {
		return Artifact{}, err
	}
	if err := os.Rename(tmpName, out); err != nil {
		return Artifact{}, fmt.Errorf("wasmbuild: %w", err)
	}
	return Artifact{Path: out, Key: key}, nil
}

// buildSettings are the go env variables a build's cache key includes.
var buildSettings = []string{"GOVERSION", "GOEXPERIMENT", "GOFLAGS", "GOWASM", "GOTOOLCHAIN"}

func defaultGo() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

func output(ctx context.Context, goCmd, dir string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, goCmd, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("wasmbuild: go %s in %s: %w\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	return stdout.String(), nil
}

// findUp returns the nearest directory at or above dir that contains name.
func findUp(dir, name string) (string, error) {
	for d := dir; ; {
		if _, err := os.Stat(filepath.Join(d, name)); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no %s found above %s", name, dir)
		}
		d = parent
	}
}

// parseWorkUses returns the absolute module roots listed by `use` in a go.work file. It
// understands the two forms the go command writes (single line and parenthesised block).
func parseWorkUses(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("wasmbuild: %w", err)
	}
	base := filepath.Dir(path)
	var roots []string
	add := func(s string) {
		s = strings.Trim(strings.TrimSpace(s), `"`)
		if s == "" {
			return
		}
		if !filepath.IsAbs(s) {
			s = filepath.Join(base, s)
		}
		roots = append(roots, filepath.Clean(s))
	}
	inBlock := false
	for _, line := range strings.Split(string(data), "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		switch {
		case inBlock && line == ")":
			inBlock = false
		case inBlock:
			add(line)
		case line == "use (":
			inBlock = true
		case strings.HasPrefix(line, "use "):
			add(strings.TrimPrefix(line, "use "))
		}
	}
	return roots, nil
}

// hashTree hashes the files that can change a build: Go sources, module files and anything
// a //go:embed could pick up, skipping VCS metadata and test files.
func hashTree(h interface{ Write([]byte) (int, error) }, root string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, "_test.go") || strings.HasSuffix(name, ".wasm") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		fmt.Fprintf(h, "%s\x00", rel)
		return hashFile(h, path)
	})
}

func hashFile(h interface{ Write([]byte) (int, error) }, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("wasmbuild: %w", err)
	}
	fmt.Fprintf(h, "%d\x00", len(data))
	_, _ = h.Write(data)
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func dedupe(sorted []string) []string {
	out := sorted[:0]
	for i, s := range sorted {
		if i == 0 || s != sorted[i-1] {
			out = append(out, s)
		}
	}
	return out
}
