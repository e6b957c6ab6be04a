package xds_test

import (
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	meshconfig "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/envoytypes"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

var update = flag.Bool("update", false, "rewrite the golden output files")

// testProxy is one entry of a case's proxies.yaml: a node as the agent would send it.
type testProxy struct {
	ID       string         `json:"id"`
	Metadata map[string]any `json:"metadata"`
	Dump     bool           `json:"dump"`
	// Types limits the dump to some types ("cds", "eds", "lds", "rds", "ecds"); empty dumps all.
	Types []string `json:"types"`
	// Locality is the node's region/zone/subzone.
	Locality string `json:"locality"`
}

// fixture is a case directory loaded into a snapshot.
type fixture struct {
	snap    *xds.Snapshot
	configs []*config.Config
	mesh    *meshconfig.MeshConfig
	opts    push.Options // from options.yaml
	reg     *registry.ServiceEntries
	proxies []*model.Proxy
	dump    []bool
	types   [][]string
}

func loadCase(t *testing.T, dir string) *fixture {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "input.yaml"))
	require.NoError(t, err)
	var cs []*config.Config
	for _, d := range config.ParseFile("input.yaml", data) {
		require.Nil(t, d.Err, "%v", d.Err)
		cs = append(cs, d.Config)
	}
	m := mesh.Default()
	if md, err := os.ReadFile(filepath.Join(dir, "mesh.yaml")); err == nil {
		m, err = mesh.Parse("mesh.yaml", md)
		require.NoError(t, err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mt := metrics.New(prometheus.NewRegistry())
	reg := registry.NewServiceEntries(log, mt)
	reg.SetConfigs(cs)
	f := &fixture{configs: cs, mesh: m, reg: reg}
	pd, err := os.ReadFile(filepath.Join(dir, "proxies.yaml"))
	require.NoError(t, err)
	var tps []testProxy
	require.NoError(t, yaml.UnmarshalStrict(pd, &tps))
	for _, tp := range tps {
		md, err := structpb.NewStruct(tp.Metadata)
		require.NoError(t, err)
		node := &core.Node{Id: tp.ID, Metadata: md}
		if tp.Locality != "" {
			parts := append(strings.SplitN(tp.Locality, "/", 3), "", "")
			node.Locality = &core.Locality{Region: parts[0], Zone: parts[1], SubZone: parts[2]}
		}
		p, err := model.ParseNode(node)
		require.NoError(t, err)
		if w, ok := p.Workload(); ok {
			reg.SetWorkload(w)
		}
		f.proxies = append(f.proxies, p)
		f.dump = append(f.dump, tp.Dump)
		f.types = append(f.types, tp.Types)
	}
	b := push.Build("test", m, config.NewIndex(cs), registry.NewAggregate(reg))
	// options.yaml sets the snapshot's push.Options (mtls: true); without it, none.
	if od, err := os.ReadFile(filepath.Join(dir, "options.yaml")); err == nil {
		require.NoError(t, yaml.UnmarshalStrict(od, &b.Options), "options.yaml")
	} else {
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	f.opts = b.Options
	f.snap = xds.NewSnapshot(b)
	return f
}

// build is a snapshot of the case's mesh config and options with configs and reg.
func (f *fixture) build(version string, configs []*config.Config, reg registry.Registry) *xds.Snapshot {
	b := push.Build(version, f.mesh, config.NewIndex(configs), reg)
	b.Options = f.opts
	return xds.NewSnapshot(b)
}

type validator interface{ ValidateAll() error }

// expectedProblemsFile lists, by hand, the configs a case expects to be reported as not
// applied ("EnvoyFilter default/bad"); -update never writes it. A case without it expects
// none.
const expectedProblemsFile = "expected-problems.yaml"

// requireExpectedProblems fails the case, before -update can record anything, unless the
// configs reported are exactly those the case expects: a config that stops applying is a
// failure, not a new golden.
func requireExpectedProblems(t *testing.T, dir string, problems []*xds.Problem) {
	t.Helper()
	var want []string
	data, err := os.ReadFile(filepath.Join(dir, expectedProblemsFile))
	if err == nil {
		require.NoError(t, yaml.UnmarshalStrict(data, &want), expectedProblemsFile)
		require.NotEmpty(t, want, "%s lists no config; remove it", expectedProblemsFile)
	} else {
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.Config)
	}
	slices.Sort(got)
	got = slices.Compact(got)
	slices.Sort(want)
	if !slices.Equal(want, got) {
		var msgs []string
		for _, p := range problems {
			msgs = append(msgs, p.String()+": "+p.Message)
		}
		require.Failf(t, "configs not applied", "expected (%s): %q\nreported: %q\n%s",
			expectedProblemsFile, want, got, strings.Join(msgs, "\n"))
	}
}

// goldenCases lists the case directories under testdata.
func goldenCases(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("testdata")
	require.NoError(t, err)
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join("testdata", e.Name()))
		}
	}
	return dirs
}

func TestGolden(t *testing.T) {
	for _, dir := range goldenCases(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			f := loadCase(t, dir)
			var out []map[string]any
			for i, p := range f.proxies {
				v := xds.NewView(f.snap, p)
				dump := xds.Dump(v)
				entry := map[string]any{"proxy": p.ID}
				for _, typ := range []string{xds.ClusterType, xds.EndpointType, xds.ListenerType, xds.RouteType, xds.ExtensionType} {
					if len(f.types[i]) > 0 && !slices.Contains(f.types[i], xds.ShortType(typ)) {
						continue
					}
					if typ == xds.ExtensionType && len(f.types[i]) == 0 && len(dump[typ].Items) == 0 {
						continue // cases without extensions do not list an empty ECDS
					}
					var list []json.RawMessage
					for _, r := range dump[typ].Items {
						require.NoError(t, r.Message.(validator).ValidateAll(), "%s %s", xds.ShortType(typ), r.Name)
						// ValidateAll stops at Any fields (filter configs, transport sockets);
						// Envoy validates what it unpacks, so the test does too.
						require.NoError(t, envoytypes.Validate(r.Message), "%s %s", xds.ShortType(typ), r.Name)
						js, err := protojson.Marshal(r.Message)
						require.NoError(t, err)
						list = append(list, js)
					}
					entry[xds.ShortType(typ)] = list
				}
				if f.dump[i] {
					out = append(out, entry)
				}
			}
			// Configuration that could not be applied (EnvoyFilter patches that would make a
			// resource invalid, ...) is reported, not sent; only where the case expects it.
			problems := xds.Problems(f.snap)
			requireExpectedProblems(t, dir, problems)
			if len(problems) > 0 {
				out = append(out, map[string]any{"problems": problems})
			}
			js, err := json.Marshal(out)
			require.NoError(t, err)
			got, err := yaml.JSONToYAML(js)
			require.NoError(t, err)
			golden := filepath.Join(dir, "output.yaml")
			if *update {
				require.NoError(t, os.WriteFile(golden, got, 0o644))
				return
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test -update to create %s", golden)
			assert.Equal(t, string(want), string(got))
		})
	}
}
