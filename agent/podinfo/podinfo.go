// Package podinfo reads the pod's labels and annotations from Kubernetes downward-API
// files, so the agent learns the same facts about its pod in Kubernetes and in the local
// mesh (where the runner writes the same files).
package podinfo

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// DefaultDir is where Istio's injector mounts the downward-API volume.
const DefaultDir = "/etc/istio/pod"

// Info is what the downward API tells about the pod.
type Info struct {
	Labels      map[string]string
	Annotations map[string]string
}

// Read reads dir/labels and dir/annotations. A missing file is an empty map (a pod
// without the volume still runs, only without labels); a malformed file is an error
// naming the file and line, because guessing would put wrong labels into telemetry.
func Read(dir string) (Info, error) {
	labels, err := readFile(filepath.Join(dir, "labels"))
	if err != nil {
		return Info{}, err
	}
	annotations, err := readFile(filepath.Join(dir, "annotations"))
	if err != nil {
		return Info{}, err
	}
	return Info{Labels: labels, Annotations: annotations}, nil
}

func readFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pod info: %w", err)
	}
	m, err := Parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("pod info %s: %w", path, err)
	}
	return m, nil
}

// Parse parses the downward-API format: one key="value" per line, the value quoted the
// way Go's %q quotes it.
func Parse(text string) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		key, quoted, ok := strings.Cut(line, "=")
		if !ok || key == "" {
			return nil, fmt.Errorf("line %d: want key=\"value\", got %q", n, line)
		}
		val, err := strconv.Unquote(quoted)
		if err != nil {
			return nil, fmt.Errorf("line %d: value of %q is not a quoted string: %s", n, key, quoted)
		}
		out[key] = val
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// Format writes m in the downward-API format, keys sorted; tests and the local mesh use
// it to write the files the agent reads.
func Format(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return b.String()
}
