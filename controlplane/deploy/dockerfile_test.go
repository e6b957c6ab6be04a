package deploy

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// No image can be built here (no container engine), so the Dockerfiles are checked against
// what they must not drift from: each Go command their build stage runs is one the Makefile
// runs (same directory, environment and arguments, with the Makefile's output directories at
// /out), each image builds what it ships, and the Go image is the release go.work names.

// repoRoot is the repository root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "Makefile"))
	require.NoError(t, err)
	return root
}

// goRun is one go command: the directory it runs in (from the root), the GOOS/GOARCH it sets,
// and its arguments.
type goRun struct {
	dir, env, args string
}

func (r goRun) String() string {
	return strings.TrimSpace("cd " + r.dir + " && " + strings.TrimSpace(r.env+" go "+r.args))
}

// makefileGoRuns runs `make build` with GO set to a script that records each go command
// instead of running it, and BIN and the Wasm output under a directory standing for /out.
func makefileGoRuns(t *testing.T, root string) []goRun {
	t.Helper()
	tmp := t.TempDir()
	log := filepath.Join(tmp, "go.log")
	fake := filepath.Join(tmp, "fakego")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\nprintf '%s\\t%s %s\\t%s\\n' \"$PWD\" \"${GOOS:+GOOS=$GOOS}\" \"${GOARCH:+GOARCH=$GOARCH}\" \"$*\" >> "+log+"\n"), 0o755))
	out := filepath.Join(tmp, "out")
	cmd := exec.Command("make", "--no-print-directory", "-C", root, "build", "GO="+fake, "BIN="+out, "WASM_OUT="+out+"/wasm")
	// Under `make test` this is a make inside a make: not a job of the outer one, and none of
	// its command-line variables.
	for _, e := range os.Environ() {
		if name, _, _ := strings.Cut(e, "="); name != "MAKEFLAGS" && name != "MFLAGS" && name != "MAKELEVEL" {
			cmd.Env = append(cmd.Env, e)
		}
	}
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "make build with a recording go:\n%s", b)
	f, err := os.Open(log)
	require.NoError(t, err)
	defer f.Close()
	var runs []goRun
	s := bufio.NewScanner(f)
	for s.Scan() {
		parts := strings.SplitN(s.Text(), "\t", 3)
		require.Len(t, parts, 3, s.Text())
		dir, err := filepath.Rel(root, parts[0])
		require.NoError(t, err)
		runs = append(runs, goRun{dir: dir, env: strings.Join(strings.Fields(parts[1]), " "), args: strings.ReplaceAll(parts[2], tmp, "")})
	}
	require.NoError(t, s.Err())
	require.NotEmpty(t, runs)
	return runs
}

// dockerfile is what the test reads of a Dockerfile: its instructions, continuation lines
// joined, comments dropped.
func dockerfile(t *testing.T, path string) [][2]string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var out [][2]string
	var cur string
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur += strings.TrimSuffix(trimmed, "\\") + " "
			continue
		}
		cur += trimmed
		op, rest, _ := strings.Cut(cur, " ")
		out = append(out, [2]string{strings.ToUpper(op), strings.TrimSpace(rest)})
		cur = ""
	}
	require.Empty(t, cur, "%s ends in a continuation", path)
	return out
}

var dockerGoRun = regexp.MustCompile(`^cd (\S+) && ((?:GO[A-Z]+=\S+ )*)go (.+)$`)

// dockerGoRuns are the RUN instructions of the Dockerfile's build stage, each of which must
// be one go command in the Makefile's form.
func dockerGoRuns(t *testing.T, instrs [][2]string) []goRun {
	t.Helper()
	var runs []goRun
	for _, in := range instrs {
		if in[0] != "RUN" {
			continue
		}
		m := dockerGoRun.FindStringSubmatch(in[1])
		require.NotNil(t, m, "RUN %s: not a go command as the Makefile runs one (cd <module> && go ...)", in[1])
		runs = append(runs, goRun{dir: m[1], env: strings.TrimSpace(m[2]), args: m[3]})
	}
	return runs
}

func TestDockerfilesRunTheMakefilesCommands(t *testing.T) {
	root := repoRoot(t)
	makeRuns := makefileGoRuns(t, root)
	goWork, err := os.ReadFile(filepath.Join(root, "go.work"))
	require.NoError(t, err)
	goRelease := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(goWork)
	require.NotNil(t, goRelease, "go.work names no Go release")

	for _, c := range []struct {
		dockerfile string
		builds     []string // files the image ships, each built in the build stage
	}{
		{"controlplane/Dockerfile", []string{"/out/discovery"}},
		{"agent/Dockerfile", []string{"/out/agent", "/out/meshproxy", "/out/wasm/telemetry.wasm", "/out/wasm/quota.wasm"}},
	} {
		t.Run(c.dockerfile, func(t *testing.T) {
			instrs := dockerfile(t, filepath.Join(root, c.dockerfile))
			runs := dockerGoRuns(t, instrs)
			require.NotEmpty(t, runs)
			for _, r := range runs {
				assert.True(t, slices.Contains(makeRuns, r), "%s runs %q, which the Makefile does not run; it runs:\n%s", c.dockerfile, r, listRuns(makeRuns))
			}
			for _, out := range c.builds {
				assert.True(t, slices.ContainsFunc(runs, func(r goRun) bool {
					return strings.HasPrefix(r.args, "build ") && strings.Contains(r.args, " -o "+out+" ")
				}), "%s builds no %s", c.dockerfile, out)
				assert.True(t, slices.ContainsFunc(instrs, func(in [2]string) bool {
					return in[0] == "COPY" && strings.HasPrefix(in[1], "--from=build "+out) || in[0] == "COPY" && strings.HasPrefix(in[1], "--from=build "+filepath.Dir(out)+"/ ")
				}), "%s does not ship %s", c.dockerfile, out)
			}
			for _, in := range instrs {
				if in[0] == "FROM" && strings.HasPrefix(in[1], "golang:") {
					assert.Equal(t, "golang:"+string(goRelease[1])+" AS build", in[1], "the build stage's Go is go.work's")
				}
			}
		})
	}
}

func listRuns(runs []goRun) string {
	var b strings.Builder
	for _, r := range runs {
		b.WriteString("  " + r.String() + "\n")
	}
	return b.String()
}
