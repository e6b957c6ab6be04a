// Package analyze checks Istio configuration offline, as istioctl analyze does: every
// document goes through discovery's own parser and validation (package config), and the
// valid configs through cross-object checks (routes to unknown hosts or subsets, subsets
// selecting no workload, Sidecars importing nothing, EnvoyFilters patching nothing,
// conflicting DestinationRules, WasmPlugin modules that cannot be had).
package analyze

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/source/filedir"
)

// Level is a message's severity, istioctl's.
type Level int

// Levels, from the least severe.
const (
	Info Level = iota
	Warning
	Error
)

func (l Level) String() string {
	switch l {
	case Error:
		return "Error"
	case Warning:
		return "Warning"
	}
	return "Info"
}

// ParseLevel reads a level's name (any case), as istioctl's --failure-threshold takes it.
func ParseLevel(s string) (Level, error) {
	for _, l := range []Level{Info, Warning, Error} {
		if strings.EqualFold(s, l.String()) {
			return l, nil
		}
	}
	return 0, fmt.Errorf("unknown level %q: want Info, Warning or Error", s)
}

// Message is one finding, shaped as istioctl's.
type Message struct {
	Code  string `json:"code"`
	Level string `json:"level"`
	// Origin names the config ("VirtualService default/reviews"); Reference is where it is
	// ("file.yaml:12").
	Origin    string `json:"origin,omitempty"`
	Reference string `json:"reference,omitempty"`
	Message   string `json:"message"`

	level     Level
	namespace string // of the config at fault
}

// Severity is the message's level.
func (m Message) Severity() Level { return m.level }

// String is istioctl's log line: Error [IST0101] (VirtualService default/reviews a.yaml:12) text.
func (m Message) String() string {
	origin := ""
	if m.Origin != "" {
		origin = " (" + strings.TrimSpace(m.Origin+" "+m.Reference) + ")"
	}
	return fmt.Sprintf("%s [%s]%s %s", m.Level, m.Code, origin, m.Message)
}

// Result is what an analysis found.
type Result struct {
	Messages []Message
	// Files lists the files analyzed; ParseErrors says which documents are not YAML at all
	// (istioctl's "files could not be parsed"), which no check sees.
	Files       []string
	ParseErrors []string
}

// Options tune an analysis.
type Options struct {
	// SkipModules does not fetch WasmPlugin modules (no network).
	SkipModules bool
	// Cluster, when set, is the live cluster's state the files are analyzed over: a file's
	// config replaces the cluster's of the same kind, namespace and name, as istioctl's.
	Cluster *Cluster
	// Namespace, with a Cluster, keeps the messages about configs of that namespace only
	// (istioctl's -n; "": every namespace, -A). Every namespace is read still: a route
	// may name another's host.
	Namespace string
}

// Paths analyzes files and directories (read as discovery's --configDir reads them), over
// opts.Cluster when set. A path that cannot be read is an error; a bad document is a
// finding.
func Paths(paths []string, opts Options) (*Result, error) {
	res := &Result{}
	in := &input{}
	if opts.Cluster != nil {
		in.addCluster(opts.Cluster)
	}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		files := []string{p}
		if fi.IsDir() {
			if files, err = filedir.ConfigFiles(p); err != nil {
				return nil, err
			}
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return nil, err
			}
			res.Files = append(res.Files, f)
			in.add(f, data)
		}
	}
	res.ParseErrors = in.parseErrors
	if opts.Cluster != nil {
		in.overrideCluster()
	}
	res.Messages = dedupe(append(in.problems, check(in, opts)...))
	if opts.Cluster != nil && opts.Namespace != "" {
		res.Messages = filter(res.Messages, func(m Message) bool { return m.namespace == opts.Namespace })
	}
	sort.SliceStable(res.Messages, func(i, j int) bool {
		a, b := res.Messages[i], res.Messages[j]
		if a.level != b.level {
			return a.level > b.level
		}
		if a.Origin != b.Origin {
			return a.Origin < b.Origin
		}
		return a.Reference < b.Reference
	})
	return res, nil
}

// dedupe drops repeated messages (two destinations of one rule naming one unknown host).
func dedupe(msgs []Message) []Message {
	seen := map[string]bool{}
	out := msgs[:0]
	for _, m := range msgs {
		if k := m.String(); !seen[k] {
			seen[k] = true
			out = append(out, m)
		}
	}
	return out
}

// doc is one valid config and where it is.
type doc struct {
	cfg   *config.Config
	file  string
	start int      // line of the document's first line
	lines []string // the document's lines
}

func (d *doc) origin() string { return fmt.Sprintf("%s %s", d.cfg.Kind, d.name()) }

func (d *doc) name() string { return d.cfg.Namespace + "/" + d.cfg.Name }

// ref is file:line of the first line of the document holding key: value (value may be
// quoted; empty: any), else of the document; "" for a cluster's object (no file).
func (d *doc) ref(key, value string) string {
	if d.file == "" {
		return ""
	}
	line := d.start
	if key != "" {
		pattern := `(^|[\s{,-])` + regexp.QuoteMeta(key) + `:`
		if value != "" {
			pattern += `\s*["']?` + regexp.QuoteMeta(value) + `["']?\s*([,}#]|$)`
		}
		re := regexp.MustCompile(pattern)
		for i, l := range d.lines {
			if re.MatchString(l) {
				line = d.start + i
				break
			}
		}
	}
	return fmt.Sprintf("%s:%d", d.file, line)
}

// input is the configs read, by kind, and the schema findings.
type input struct {
	docs        []*doc
	byKind      map[config.Kind][]*doc
	problems    []Message
	parseErrors []string
	// kubeServices are the input's Kubernetes Services: the cluster's first (the first
	// clusterServices), then the files'.
	kubeServices    []*corev1.Service
	clusterServices int
	// cluster says the input holds a live cluster's state: pods are its running pods,
	// clusterRejected its objects discovery rejects. rejectedKeys are the files' documents
	// rejected that name their config.
	cluster         bool
	pods            []*corev1.Pod
	clusterRejected []*config.Error
	rejectedKeys    []config.Key
}

// kubeService reads a document as a Kubernetes Service, nil when it is not one.
func kubeService(lines []string) *corev1.Service {
	var svc corev1.Service
	if yaml.Unmarshal([]byte(strings.Join(lines, "\n")), &svc) != nil || svc.APIVersion != "v1" || svc.Kind != "Service" || svc.Name == "" {
		return nil
	}
	if svc.Namespace == "" {
		svc.Namespace = config.DefaultNamespace
	}
	return &svc
}

func (in *input) kind(k config.Kind) []*doc { return in.byKind[k] }

// add parses a file as discovery does.
func (in *input) add(file string, data []byte) {
	if in.byKind == nil {
		in.byKind = map[config.Kind][]*doc{}
	}
	starts, lines := documentLines(data)
	for _, d := range config.ParseFile(file, data) {
		at := &doc{file: file, start: starts[d.Index-1], lines: lines[d.Index-1]}
		if d.Err == nil {
			at.cfg = d.Config
			in.docs = append(in.docs, at)
			in.byKind[d.Config.Kind] = append(in.byKind[d.Config.Kind], at)
			continue
		}
		if strings.HasPrefix(d.Err.Err.Error(), "invalid YAML") {
			// istioctl's file parse error: said apart from the findings.
			in.parseErrors = append(in.parseErrors, d.Err.Error())
			continue
		}
		if d.Err.Field == "kind" && !istioKind(at.lines) {
			// Kubernetes objects beside the configs: not discovery's to read, but a
			// Service's host is one a route may name (on Kubernetes discovery has it).
			if svc := kubeService(at.lines); svc != nil {
				in.kubeServices = append(in.kubeServices, svc)
			}
			continue
		}
		m := newMessage(Error, "IST0106", "Schema validation error: %s", fieldError(d.Err))
		if d.Key != nil {
			m.Origin, m.namespace = d.Key.String(), d.Key.Namespace
			in.rejectedKeys = append(in.rejectedKeys, *d.Key)
		}
		m.Reference = at.ref(lastField(d.Err.Field), "")
		in.problems = append(in.problems, m)
	}
}

// istioKind reports whether a document rejected for its kind is an Istio one (an *.istio.io
// apiVersion): Deployments and Services are skipped, a misspelt Istio kind is a finding.
func istioKind(lines []string) bool {
	for _, l := range lines {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "apiVersion:"); ok {
			return strings.Contains(v, "istio.io")
		}
	}
	return false
}

// lastField is the key a field path ends with ("weight" of "spec.http[0].route[0].weight"),
// to find its line; "" for the envelope's "spec".
func lastField(path string) string {
	if i := strings.LastIndex(path, "."); i >= 0 {
		path = path[i+1:]
	}
	if i := strings.Index(path, "["); i >= 0 {
		path = path[:i]
	}
	if path == "spec" {
		return ""
	}
	return path
}

func fieldError(e *config.Error) string {
	if e.Field == "" {
		return e.Err.Error()
	}
	return e.Field + ": " + e.Err.Error()
}

func newMessage(l Level, code, format string, args ...any) Message {
	return Message{Code: code, Level: l.String(), Message: fmt.Sprintf(format, args...), level: l}
}

var separator = regexp.MustCompile(`^---\s*(#.*)?$`)

// documentLines splits data as config.ParseFile does and gives each document's first line
// (1-based; its first line with content) and its lines.
func documentLines(data []byte) ([]int, [][]string) {
	starts, docs := []int{1}, [][]string{nil}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	n, seen := 0, false
	for sc.Scan() {
		n++
		line := sc.Text()
		if separator.MatchString(line) {
			starts, docs, seen = append(starts, n+1), append(docs, nil), false
			continue
		}
		cur := len(docs) - 1
		if t := strings.TrimSpace(line); !seen && t != "" && !strings.HasPrefix(t, "#") {
			starts[cur], seen = n, true
			docs[cur] = nil
		}
		if seen {
			docs[cur] = append(docs[cur], line)
		}
	}
	return starts, docs
}
