package leader

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

const lease = 2 * time.Second // renewed within 1 s, tried every 500 ms

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// withConflicts gives the fake's Leases the API server's optimistic concurrency: each write
// bumps the resourceVersion, an update from an older one is a conflict. (The leader's renewal
// writes the version it last saw without reading; the fake alone would let it overwrite a
// Lease someone else took.)
func withConflicts(client *fake.Clientset) *fake.Clientset {
	var mu sync.Mutex
	version := 0
	gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
	client.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		// Create and update actions have one method set: tell them by verb.
		o, ok := a.(interface{ GetObject() runtime.Object })
		if !ok {
			return false, nil, nil
		}
		obj := o.GetObject().(*coordinationv1.Lease)
		switch a.GetVerb() {
		case "create":
		case "update":
			cur, err := client.Tracker().Get(gvr, obj.Namespace, obj.Name)
			if err == nil && cur.(*coordinationv1.Lease).ResourceVersion != obj.ResourceVersion {
				return true, nil, apierrors.NewConflict(gvr.GroupResource(), obj.Name, errors.New("the object has been modified"))
			}
		default:
			return false, nil, nil
		}
		version++
		obj.ResourceVersion = strconv.Itoa(version)
		return false, nil, nil
	})
	return client
}

// replica is one elector running, with a task that counts the leaderships it ran in and
// says whether it runs now.
type replica struct {
	e       *Elector
	reg     *prometheus.Registry
	running atomic.Int32
	starts  atomic.Int32
	cancel  context.CancelFunc
	done    chan struct{}
}

func startReplica(t *testing.T, client kubernetes.Interface, id string) *replica {
	return startReplicaWithLease(t, client, id, lease)
}

func startReplicaWithLease(t *testing.T, client kubernetes.Interface, id string, d time.Duration) *replica {
	t.Helper()
	r := &replica{reg: prometheus.NewRegistry(), done: make(chan struct{})}
	var err error
	r.e, err = New(Options{Client: client, Namespace: "istio-system", Identity: id, LeaseDuration: d, Log: quiet, Registerer: r.reg})
	require.NoError(t, err)
	r.e.Add("count", func(ctx context.Context) {
		r.starts.Add(1)
		r.running.Add(1)
		<-ctx.Done()
		r.running.Add(-1)
	})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { defer close(r.done); assert.NoError(t, r.e.Run(ctx)) }()
	t.Cleanup(r.stop)
	return r
}

// stop ends Run: the tasks have stopped when it returns.
func (r *replica) stop() {
	r.cancel()
	<-r.done
}

func holder(t *testing.T, client kubernetes.Interface) string {
	l, err := client.CoordinationV1().Leases("istio-system").Get(context.Background(), DefaultLeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func leaders(rs ...*replica) (n int, who *replica) {
	for _, r := range rs {
		if r.e.Leading() {
			n++
			who = r
		}
	}
	return n, who
}

// Two replicas on one Lease: exactly one leads and runs the singleton work, the other
// observes it; the gauge and /debug/leader say so.
func TestExactlyOneLeads(t *testing.T) {
	client := fake.NewClientset()
	a, b := startReplica(t, client, "a"), startReplica(t, client, "b")
	require.Eventually(t, func() bool { n, _ := leaders(a, b); return n == 1 }, 10*time.Second, 10*time.Millisecond)
	_, lead := leaders(a, b)
	follower := a
	if lead == a {
		follower = b
	}
	require.Eventually(t, func() bool { return follower.e.Status().Leader == lead.e.opts.Identity }, 10*time.Second, 10*time.Millisecond,
		"the follower observes the leader")
	require.Eventually(t, func() bool { return lead.running.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, lead.e.opts.Identity, holder(t, client))
	assert.Equal(t, int32(0), follower.starts.Load(), "the follower never ran the singleton work")
	assert.Equal(t, 1.0, testutil.ToFloat64(lead.e.gauge))
	assert.Equal(t, 0.0, testutil.ToFloat64(follower.e.gauge))
	assert.Equal(t, 1, testutil.CollectAndCount(lead.reg, "leader_election_master_status"))

	w := httptest.NewRecorder()
	follower.e.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/debug/leader", nil))
	var st Status
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &st))
	assert.Equal(t, Status{Lease: "istio-system/" + DefaultLeaseName, Identity: follower.e.opts.Identity, Leader: lead.e.opts.Identity,
		Tasks: []string{"count"}}, st)
}

// A leader that stops stops its work first and releases the Lease: the other leads at
// once, not a lease duration later.
func TestStoppedLeaderHandsOver(t *testing.T) {
	// Released, the Lease is taken at the follower's next try: within 2.2 retry periods (a
	// quarter of the lease, jittered by up to 120%), 6.6 s. Left to expire it could not be
	// taken before 9 s (the lease less the retry period the leader renews within).
	const long = 12 * time.Second
	client := fake.NewClientset()
	a := startReplicaWithLease(t, client, "a", long)
	require.Eventually(t, a.e.Leading, 10*time.Second, 10*time.Millisecond)
	b := startReplicaWithLease(t, client, "b", long)
	require.Eventually(t, func() bool { return b.e.Status().Leader == "a" }, 10*time.Second, 10*time.Millisecond)

	a.stop()
	assert.Equal(t, int32(0), a.running.Load(), "the old leader's work has stopped when Run returns")
	assert.False(t, a.e.Leading())
	require.Eventually(t, b.e.Leading, long*2/3, 10*time.Millisecond, "released, the Lease is taken at once, not once it expires")
	require.Eventually(t, func() bool { return b.running.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, "b", holder(t, client))
}

// A leader that dies renews its Lease no more: another replica takes it once it expires.
func TestDeadLeadersLeaseIsTakenOver(t *testing.T) {
	client := fake.NewClientset()
	now := metav1.NewMicroTime(time.Now())
	_, err := client.CoordinationV1().Leases("istio-system").Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultLeaseName, Namespace: "istio-system"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("dead"), LeaseDurationSeconds: ptr.To(int32(lease / time.Second)),
			AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	died := time.Now()
	b := startReplica(t, client, "b")
	require.Eventually(t, func() bool { return b.e.Status().Leader == "dead" }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, b.e.Leading, 10*lease, 10*time.Millisecond)
	took := time.Since(died)
	t.Logf("took over %v after the last renewal (lease %v)", took, lease)
	assert.GreaterOrEqual(t, took, lease, "not before the lease expired")
	assert.Equal(t, "b", holder(t, client))
	require.Eventually(t, func() bool { return b.running.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
}

// Tasks run once per leadership, each with a context that ends with it.
func TestTasksRunPerLeadership(t *testing.T) {
	client := fake.NewClientset()
	var mu sync.Mutex
	var ran []string
	e, err := New(Options{Client: client, Namespace: "istio-system", Identity: "a", LeaseDuration: lease, Log: quiet})
	require.NoError(t, err)
	for _, name := range []string{"caBundle", "status"} {
		e.Add(name, func(ctx context.Context) {
			mu.Lock()
			ran = append(ran, name)
			mu.Unlock()
			<-ctx.Done()
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(ran) == 2 }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	assert.ElementsMatch(t, []string{"caBundle", "status"}, ran)
	assert.Equal(t, []string{"caBundle", "status"}, e.Status().Tasks)
	assert.Empty(t, holder(t, client), "released on stop")
}

func TestOptionsNeedTheAPIServerAndANamespace(t *testing.T) {
	_, err := New(Options{Namespace: "istio-system"})
	assert.Error(t, err)
	_, err = New(Options{Client: fake.NewClientset()})
	assert.Error(t, err)
	t.Setenv("POD_NAME", "discovery-7c9f-x2")
	assert.Equal(t, "discovery-7c9f-x2", Identity())
}

// A leader whose Lease is taken from it stops its work, and campaigns again: it leads
// again once the other holder's lease runs out.
func TestLeaderThatLosesTheLeaseStopsAndCampaignsAgain(t *testing.T) {
	client := withConflicts(fake.NewClientset())
	a := startReplica(t, client, "a")
	require.Eventually(t, func() bool { return a.running.Load() == 1 }, 10*time.Second, 10*time.Millisecond)

	leases := client.CoordinationV1().Leases("istio-system")
	l, err := leases.Get(context.Background(), DefaultLeaseName, metav1.GetOptions{})
	require.NoError(t, err)
	now := metav1.NewMicroTime(time.Now())
	l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = ptr.To("thief"), &now, &now
	_, err = leases.Update(context.Background(), l, metav1.UpdateOptions{})
	require.NoError(t, err)

	require.Eventually(t, func() bool { return !a.e.Leading() && a.running.Load() == 0 }, 10*time.Second, 10*time.Millisecond,
		"the work stops with the lease")
	require.Eventually(t, func() bool { return a.running.Load() == 1 }, 10*lease, 10*time.Millisecond, "leads again")
	assert.Equal(t, int32(2), a.starts.Load())
}

// A stopping leader holds the Lease until its work has stopped: the next leader never
// runs beside it.
func TestLeaseIsReleasedOnlyOnceTheWorkStopped(t *testing.T) {
	client := fake.NewClientset()
	e, err := New(Options{Client: client, Namespace: "istio-system", Identity: "a", LeaseDuration: lease, Log: quiet})
	require.NoError(t, err)
	stopping, unblock := make(chan struct{}), make(chan struct{})
	e.Add("slow to stop", func(ctx context.Context) {
		<-ctx.Done()
		close(stopping)
		<-unblock
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	require.Eventually(t, e.Leading, 10*time.Second, 10*time.Millisecond)

	cancel()
	<-stopping
	assert.Never(t, func() bool {
		select {
		case <-done:
			return true
		default:
			return holder(t, client) != "a"
		}
	}, 500*time.Millisecond, 10*time.Millisecond, "held while the work stops")
	close(unblock)
	require.NoError(t, <-done)
	assert.Empty(t, holder(t, client), "released once it stopped")
}
