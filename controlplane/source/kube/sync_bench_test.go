package kube

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// BenchmarkInitialSync lists N pods behind one Service (N/100 EndpointSlices) and N
// VirtualServices and publishes them. Read the scales side by side: sync-ns/object and
// heap-B/object stay flat from 1,000 to 10,000 objects when the work and the memory grow
// linearly (the heap counts the fake clientsets' copies of the objects, the informers'
// caches and what the source keeps).
func BenchmarkInitialSync(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			kubeObjs, istioObjs := podsBehindService(n), virtualServices(n)
			var ns, heap float64
			for range b.N {
				runtime.GC()
				var before runtime.MemStats
				runtime.ReadMemStats(&before)
				start := time.Now()
				f := startFake(b, kubeObjs, istioObjs)
				ns += float64(time.Since(start).Nanoseconds())
				runtime.GC()
				var after runtime.MemStats
				runtime.ReadMemStats(&after)
				heap += float64(after.HeapAlloc) - float64(before.HeapAlloc)
				runtime.KeepAlive(f)
			}
			objects := float64(2 * n * b.N)
			b.ReportMetric(ns/objects, "sync-ns/object")
			b.ReportMetric(heap/objects, "heap-B/object")
		})
	}
}

// BenchmarkPodLabelChange changes the labels of one pod of a Service with N pods: its
// workload and the Service's endpoints are published again. The endpoints event carries
// the host's whole list (source.EndpointEvent replaces it), so this grows with N; nothing
// else does (compare the two scales: about 10x, not 100x).
func BenchmarkPodLabelChange(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			f := startFake(b, podsBehindService(n), nil)
			host := hostIn("web", "shop")
			pods := f.kube.CoreV1().Pods("shop")
			b.ResetTimer()
			for i := range b.N {
				version := fmt.Sprintf("v%d", i)
				_, err := pods.Patch(context.Background(), "web-7", types.MergePatchType,
					[]byte(`{"metadata":{"labels":{"version":"`+version+`"}}}`), metav1.PatchOptions{})
				require.NoError(b, err)
				f.rec.wait(b, time.Minute, "the new label", func(r *recorder) bool {
					for _, e := range r.endpoints[host] {
						if e.Workload == "Pod shop/web-7" {
							return e.Labels["version"] == version
						}
					}
					return false
				})
			}
		})
	}
}
