package xds

import (
	"fmt"
	"sort"
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/envoyfilter"
)

// Problem is configuration that could not be applied to a generated resource: an EnvoyFilter
// patch that would have made it invalid (the resource is sent without the patch), or a
// WasmPlugin or Telemetry whose filter configuration could not be built.
type Problem struct {
	Source config.Key `json:"-"`
	// Config names Source for humans: "EnvoyFilter default/bad".
	Config string `json:"config"`
	// Patch is the index in the EnvoyFilter's configPatches; -1 for other kinds.
	Patch    int    `json:"patch"`
	Resource string `json:"resource"`
	Err      error  `json:"-"`
	Message  string `json:"error"`
}

func (p *Problem) String() string {
	if p.Patch >= 0 {
		return fmt.Sprintf("%s configPatches[%d] not applied to %s: %v", p.Source, p.Patch, p.Resource, p.Err)
	}
	return fmt.Sprintf("%s not applied to %s: %v", p.Source, p.Resource, p.Err)
}

// Report collects the problems found while generating from one snapshot. Generation is lazy
// (per proxy shape, on demand), so problems appear as proxies are served.
type Report struct {
	mu       sync.Mutex
	problems map[string]*Problem
	onNew    func(*Problem)
}

func reportOf(snap *Snapshot) *Report {
	return snap.full.report.Get(func() *Report { return &Report{problems: map[string]*Problem{}} })
}

// ReportTo sets the function told about each problem the first time it is found in the
// snapshot (for logs and metrics). Call it before the snapshot is used for generation.
func ReportTo(snap *Snapshot, onNew func(*Problem)) {
	r := reportOf(snap)
	r.mu.Lock()
	r.onNew = onNew
	r.mu.Unlock()
}

// Problems returns the problems found so far in the snapshot, sorted.
func Problems(snap *Snapshot) []*Problem {
	r := reportOf(snap)
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Problem, 0, len(r.problems))
	for _, p := range r.problems {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

func (r *Report) add(p *Problem) {
	p.Message = p.Err.Error()
	p.Config = p.Source.String()
	key := p.String()
	r.mu.Lock()
	_, seen := r.problems[key]
	if !seen {
		r.problems[key] = p
	}
	onNew := r.onNew
	r.mu.Unlock()
	if !seen && onNew != nil {
		onNew(p)
	}
}

func (r *Report) addPatchErrors(errs []*envoyfilter.PatchError) {
	for _, e := range errs {
		r.add(&Problem{Source: e.Patch.Filter, Patch: e.Patch.Index, Resource: e.Resource, Err: e.Err})
	}
}
