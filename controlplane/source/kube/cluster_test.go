package kube

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
)

// The Istio kinds the tests install (the source's default set).
var testCRDKinds = []string{"ServiceEntry", "WorkloadEntry", "VirtualService", "DestinationRule", "Sidecar", "EnvoyFilter", "WasmPlugin", "Telemetry", "PeerAuthentication", "AuthorizationPolicy"}

// shared is one real cluster (etcd, kube-apiserver, kube-controller-manager, Istio's CRDs)
// for the tests that only add objects, each in namespaces of its own; tests that stop the
// API server or need CRDs missing start their own.
var shared struct {
	once    sync.Once
	cluster *kubecluster.Cluster
	err     error
	skip    string
}

var namespaceSeq atomic.Int64

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.cluster != nil {
		shared.cluster.Stop()
	}
	os.Exit(code)
}

func sharedCluster(t *testing.T) *kubecluster.Cluster {
	t.Helper()
	kubecluster.RequireBinaries(t)
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared.cluster, shared.err = kubecluster.Start(ctx, kubecluster.Options{ControllerManager: true})
		if shared.err == nil {
			shared.err = shared.cluster.InstallIstioCRDs(ctx, testCRDKinds...)
		}
	})
	require.NoError(t, shared.err)
	return shared.cluster
}

// namespace creates a namespace of the test's own, with a service account for its pods
// (pods are admitted only once their service account exists).
func namespace(t *testing.T, c *kubecluster.Cluster, labels map[string]string) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("t%d", namespaceSeq.Add(1))
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.Client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return name
}

// running is a source running against a cluster, with what it published and logged.
type running struct {
	src  *Source
	rec  *recorder
	logs *logs
}

// runSource runs a source on cfg until the test ends; it does not wait for Synced.
func runSource(t *testing.T, cfg *rest.Config, opts Options) *running {
	t.Helper()
	l := newLogs()
	opts.Config = cfg
	opts.Log = slog.New(teeHandler{l, newTestLogger(t).Handler()})
	src, err := New(opts)
	require.NoError(t, err)
	r := &running{src: src, rec: newRecorder(), logs: l}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, r.rec) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Error("Run did not return within a minute of its context ending")
		}
	})
	return r
}

// startSource runs a source and waits until it has synced.
func startSource(t *testing.T, c *kubecluster.Cluster, opts Options) *running {
	t.Helper()
	r := runSource(t, c.Config, opts)
	r.rec.wait(t, 2*time.Minute, "synced", func(r *recorder) bool { return r.synced })
	return r
}

// teeHandler sends records to two handlers.
type teeHandler struct{ a, b slog.Handler }

func (h teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.a.Enabled(ctx, l) || h.b.Enabled(ctx, l)
}

func (h teeHandler) Handle(ctx context.Context, r slog.Record) error {
	_ = h.a.Handle(ctx, r.Clone())
	return h.b.Handle(ctx, r)
}

func (h teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{h.a.WithAttrs(as), h.b.WithAttrs(as)}
}

func (h teeHandler) WithGroup(n string) slog.Handler {
	return teeHandler{h.a.WithGroup(n), h.b.WithGroup(n)}
}

// hostIn is a Service's host in namespace ns.
func hostIn(name, ns string) string { return Hostname(name, ns, "cluster.local") }

var _ = config.VirtualService
