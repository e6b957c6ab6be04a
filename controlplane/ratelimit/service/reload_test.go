package service

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/wasmesh/wasmesh/controlplane/ratelimit/config"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReloadKeepsLastGoodConfig watches the config directory: a changed file takes effect; a
// bad file is rejected with an error naming it, the path in its document and the reason,
// and the last good config stays in force for requests; fixing it loads again.
func TestReloadKeepsLastGoodConfig(t *testing.T) {
	r := newRig(t, map[string]string{"frontend.yaml": frontend}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	first := make(chan error, 1)
	go func() { done <- r.svc.WatchConfig(ctx, r.dir, func(err error) { first <- err }) }()
	t.Cleanup(func() { cancel(); <-done })
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	c := r.client()
	loads := func(result string) float64 { return testFloat(r.metrics.ConfigLoad.WithLabelValues(result)) }

	// A new domain in a new file takes effect.
	r.write("api.yaml", "domain: api\ndescriptors:\n  - key: path\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	waitFor(t, "the api domain loaded", func() bool { return r.svc.Config().Domains["api"] != nil })
	ask(t, c, "api", 0, desc("path", "/a"))
	if resp := ask(t, c, "api", 0, desc("path", "/a")); resp.OverallCode != over {
		t.Fatalf("api's limit of 1 not applied: %v", resp)
	}

	// A bad edit of frontend.yaml: rejected by name, the last good config stays.
	pathLimit := func() uint32 {
		m := r.svc.Config().Find("frontend", []config.Entry{{Key: "path", Value: "/p"}})
		if m == nil {
			return 0
		}
		return m.RequestsPerUnit
	}
	errorsBefore := loads("error")
	r.write("frontend.yaml", strings.Replace(frontend, "unit: minute, requests_per_unit: 2}", "unit: fortnight, requests_per_unit: 2}", 1))
	waitFor(t, "the bad file rejected", func() bool { return loads("error") > errorsBefore })
	if pathLimit() != 2 || r.svc.Config().Domains["api"] == nil {
		t.Fatal("a bad file replaced the config in force")
	}
	want := `frontend.yaml: descriptors[4].rate_limit.unit: unknown unit "fortnight"`
	if err := r.svc.LoadError(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("the load error does not name the file, path and reason (%s): %v", want, err)
	}
	if resp := ask(t, c, "frontend", 0, desc("path", "/p"), desc("path", "/p")); resp.OverallCode != ok || resp.Statuses[1].LimitRemaining != 0 {
		t.Fatalf("the last good limit of 2 on path is not in force: %v", resp)
	}
	if err := r.svc.Ready(); err != nil {
		t.Fatalf("health after a rejected file: %v", err)
	}

	// Fixed: a new limit (3) takes effect.
	r.write("frontend.yaml", strings.Replace(frontend, "unit: minute, requests_per_unit: 2}", "unit: minute, requests_per_unit: 3}", 1))
	waitFor(t, "the fixed file loaded", func() bool { return pathLimit() == 3 })
	if err := r.svc.LoadError(); err != nil {
		t.Fatalf("load error after the fix: %v", err)
	}
	if resp := ask(t, c, "frontend", 0, desc("path", "/q")); resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 3 {
		t.Fatalf("the fixed config is not in force: %v", resp)
	}
}
