package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	analyzeClean    = "../../analyze/testdata/clean"
	analyzeFindings = "../../analyze/testdata/findings"
)

// writeConfig writes one file of YAML into a new directory and returns the directory.
func writeConfig(t *testing.T, name, data string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644))
	return dir
}

// A DestinationRule for a host nobody defines: a Warning only.
const warningOnly = `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ghost, namespace: shop}
spec: {host: ghost.shop.svc.cluster.local}
`

// analyze prints istioctl's lines and exits as istioctl analyze does: 0 for a clean
// directory, 79 for findings at or above --failure-threshold (Error by default), 64 for a
// bad command line, 65 when a document is not YAML; --output-threshold hides lower levels.
func TestAnalyzeCommand(t *testing.T) {
	out, stderr, err := run(t, "", "analyze", analyzeClean)
	require.NoError(t, err)
	assert.Empty(t, out)
	assert.Contains(t, stderr, "No validation issues found when analyzing files")

	out, _, err = run(t, "", "analyze", analyzeFindings)
	assert.Equal(t, exitFoundIssues, exitCode(err), "%v", err)
	assert.Contains(t, out, `Error [IST0101] (VirtualService shop/reviews `+analyzeFindings+`/routes.yaml:10) Referenced host not found: "ratings"`)
	assert.Contains(t, out, "Warning [WSM0001] (Sidecar shop/default")

	warn := writeConfig(t, "dr.yaml", warningOnly)
	out, _, err = run(t, "", "analyze", warn)
	require.NoError(t, err, "a Warning is below the default failure threshold")
	assert.Contains(t, out, "Warning [IST0174]")
	_, _, err = run(t, "", "analyze", warn, "--failure-threshold", "warning")
	assert.Equal(t, exitFoundIssues, exitCode(err))
	out, _, err = run(t, "", "analyze", warn, "--output-threshold", "Error")
	require.NoError(t, err)
	assert.Empty(t, out, "the Warning is below the output threshold")

	for _, args := range [][]string{{"analyze"}, {"analyze", warn, "--failure-threshold", "fatal"}, {"analyze", warn, "-o", "xml"}, {"analyze", warn, "--no-such-flag"}} {
		_, _, err = run(t, "", args...)
		assert.Equal(t, exitUsage, exitCode(err), "%v: %v", args, err)
	}
	_, _, err = run(t, "", "analyze", filepath.Join(warn, "missing.yaml"))
	assert.Equal(t, 1, exitCode(err))

	notYAML := writeConfig(t, "bad.yaml", "kind: [unclosed\n")
	_, stderr, err = run(t, "", "analyze", notYAML)
	assert.Equal(t, exitDataError, exitCode(err), "%v", err)
	assert.Contains(t, stderr, "bad.yaml: document 1: invalid YAML")
	require.NoError(t, os.WriteFile(filepath.Join(notYAML, "dr.yaml"), []byte(warningOnly), 0o644))
	_, _, err = run(t, "", "analyze", notYAML, "--failure-threshold", "Warning")
	assert.Equal(t, exitFoundIssues, exitCode(err), "findings win over parse errors")
}

// -o json and -o yaml print the findings as istioctl's objects; as istioctl, they set no
// exit code.
func TestAnalyzeStructuredOutput(t *testing.T) {
	out, _, err := run(t, "", "analyze", analyzeFindings, "-o", "json")
	require.NoError(t, err)
	var msgs []map[string]string
	require.NoError(t, json.Unmarshal([]byte(out), &msgs))
	require.NotEmpty(t, msgs)
	assert.Equal(t, "IST0173", msgs[0]["code"])
	assert.Equal(t, "Error", msgs[0]["level"])
	assert.Equal(t, "DestinationRule shop/reviews", msgs[0]["origin"])
	assert.Equal(t, analyzeFindings+"/rules.yaml:10", msgs[0]["reference"])

	out, _, err = run(t, "", "analyze", analyzeFindings, "-o", "yaml", "--output-threshold", "Error")
	require.NoError(t, err)
	assert.Contains(t, out, "code: IST0101")
	assert.NotContains(t, out, "level: Warning")
}

// The process exits with the command's code (main's exitCode), as a CI job sees it.
func TestAnalyzeProcessExitCode(t *testing.T) {
	if os.Getenv("MESHCTL_RUN_MAIN") != "" {
		os.Args = append([]string{"meshctl"}, strings.Fields(os.Getenv("MESHCTL_RUN_MAIN"))...)
		main()
		os.Exit(0)
	}
	for args, want := range map[string]int{"analyze " + analyzeFindings: exitFoundIssues, "analyze " + analyzeClean: 0, "analyze": exitUsage} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAnalyzeProcessExitCode$")
		cmd.Env = append(os.Environ(), "MESHCTL_RUN_MAIN="+args)
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		assert.Equal(t, want, code, args)
	}
}
