// Package leader elects one discovery replica, with client-go's leader election on a Lease
// in discovery's namespace, to do the work only one replica may do (patching the webhook's
// caBundle, writing the status of Istio objects), as istiod's replicas elect theirs.
package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Defaults: istiod's lease timing (a 30 s lease, renewed within half of it, tried every
// quarter).
const (
	DefaultLeaseName     = "istiod-leader"
	DefaultLeaseDuration = 30 * time.Second
)

// Options configure an Elector.
type Options struct {
	Client kubernetes.Interface
	// Namespace and Name locate the Lease (Name default DefaultLeaseName).
	Namespace, Name string
	// Identity names this replica in the Lease (default Identity()).
	Identity string
	// LeaseDuration is how long a lease holds without renewal (default
	// DefaultLeaseDuration): a leader that dies is replaced within about that long. The
	// leader renews within half of it and the others try every quarter.
	LeaseDuration time.Duration
	Log           *slog.Logger
	// Registerer takes the leader_election_master_status gauge (nil: not registered).
	Registerer prometheus.Registerer
}

// Identity is the replica's name: POD_NAME, else the hostname.
func Identity() string {
	if n := os.Getenv("POD_NAME"); n != "" {
		return n
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "discovery"
	}
	return h
}

// Elector campaigns for the Lease and runs the tasks added while this replica leads.
type Elector struct {
	opts   Options
	log    *slog.Logger
	gauge  prometheus.Gauge
	tasks  []task // set before Run
	mu     sync.Mutex
	status Status
	term   *term // the tasks of the current leadership, nil while not leading
}

type task struct {
	name string
	run  func(ctx context.Context)
}

// term is one leadership: its tasks' context and their completion.
type term struct {
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// Status is what /debug/leader shows.
type Status struct {
	Lease    string `json:"lease"`    // namespace/name
	Identity string `json:"identity"` // this replica
	Leading  bool   `json:"leading"`
	// Leader is the holder this replica last observed ("" before it observed one).
	Leader string `json:"leader"`
	// LeadingSince is when this replica last started leading.
	LeadingSince *time.Time `json:"leadingSince,omitempty"`
	Tasks        []string   `json:"tasks"`
}

// New returns an elector; Add its tasks, then Run it.
func New(opts Options) (*Elector, error) {
	if opts.Client == nil || opts.Namespace == "" {
		return nil, errors.New("leader election needs the API server and a namespace for its Lease")
	}
	if opts.Name == "" {
		opts.Name = DefaultLeaseName
	}
	if opts.Identity == "" {
		opts.Identity = Identity()
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = DefaultLeaseDuration
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	e := &Elector{opts: opts, log: opts.Log.With("scope", "leader", "lease", opts.Namespace+"/"+opts.Name, "identity", opts.Identity),
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leader_election_master_status", Help: "1 while this replica leads (holds the Lease), 0 otherwise.",
			ConstLabels: prometheus.Labels{"name": opts.Name},
		}),
		status: Status{Lease: opts.Namespace + "/" + opts.Name, Identity: opts.Identity, Tasks: []string{}},
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(e.gauge); err != nil {
			return nil, fmt.Errorf("leader metrics: %w", err)
		}
	}
	return e, nil
}

// Add registers singleton work: run starts each time this replica starts leading, with a
// context that ends when it stops (the lease lost, or Run ending); it must return then.
// Add before Run.
func (e *Elector) Add(name string, run func(ctx context.Context)) {
	e.tasks = append(e.tasks, task{name, run})
	e.mu.Lock()
	e.status.Tasks = append(e.status.Tasks, name)
	e.mu.Unlock()
}

// Status says who leads, as this replica sees it.
func (e *Elector) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.status
	st.Tasks = append([]string(nil), st.Tasks...)
	return st
}

// Leading reports whether this replica leads.
func (e *Elector) Leading() bool { return e.Status().Leading }

// Handler serves Status as JSON (/debug/leader).
func (e *Elector) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(e.Status())
	})
}

// Run campaigns until ctx ends, again after each leadership lost. When ctx ends, the tasks
// stop first and the Lease is released then, so that the next leader starts at once
// instead of after the lease runs out.
func (e *Elector) Run(ctx context.Context) error {
	d := e.opts.LeaseDuration
	for {
		campaign, stop := context.WithCancel(context.Background())
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: &resourcelock.LeaseLock{
				LeaseMeta:  metav1.ObjectMeta{Namespace: e.opts.Namespace, Name: e.opts.Name},
				Client:     e.opts.Client.CoordinationV1(),
				LockConfig: resourcelock.ResourceLockConfig{Identity: e.opts.Identity},
			},
			LeaseDuration: d, RenewDeadline: d / 2, RetryPeriod: d / 4,
			ReleaseOnCancel: true,
			Name:            e.opts.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: e.startedLeading,
				OnStoppedLeading: e.stoppedLeading,
				OnNewLeader:      e.observed,
			},
		})
		if err != nil {
			stop()
			return fmt.Errorf("leader election: %w", err)
		}
		ended := make(chan struct{})
		go func() {
			select {
			case <-ctx.Done():
				if e.endTerm() {
					e.log.Info("stopping: singleton work stopped; releasing the lease")
				}
				stop()
			case <-ended:
			}
		}()
		le.Run(campaign)
		close(ended)
		stop()
		if ctx.Err() != nil {
			return nil
		}
		e.log.Info("leadership lost; campaigning again")
	}
}

func (e *Elector) startedLeading(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	t := &term{cancel: cancel}
	now := time.Now()
	e.mu.Lock()
	// client-go calls this in a goroutine of its own: the leadership may be over already,
	// its end (which cancels ctx before calling stoppedLeading) come and gone.
	if ctx.Err() != nil {
		e.mu.Unlock()
		cancel()
		return
	}
	e.term = t
	e.status.Leading, e.status.Leader, e.status.LeadingSince = true, e.opts.Identity, &now
	e.gauge.Set(1)
	e.mu.Unlock()
	e.log.Info("leading: starting singleton work", "tasks", len(e.tasks))
	for _, tk := range e.tasks {
		t.done.Add(1)
		go func() {
			defer t.done.Done()
			tk.run(ctx)
		}()
	}
}

// stoppedLeading runs when a campaign ends, led or not.
func (e *Elector) stoppedLeading() {
	if e.endTerm() {
		e.log.Info("stopped leading: singleton work stopped")
	}
}

// endTerm stops the tasks of the current leadership and waits for them; false when not
// leading.
func (e *Elector) endTerm() bool {
	e.mu.Lock()
	t := e.term
	e.term = nil
	if t != nil {
		e.status.Leading = false
		e.gauge.Set(0)
	}
	e.mu.Unlock()
	if t == nil {
		return false
	}
	t.cancel()
	t.done.Wait()
	return true
}

func (e *Elector) observed(identity string) {
	e.mu.Lock()
	e.status.Leader = identity
	e.mu.Unlock()
	if identity != e.opts.Identity {
		e.log.Info("leader observed", "leader", identity)
	}
}
