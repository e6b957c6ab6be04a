package kubenode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podRun is one pod on the node: its addresses, its directory, its containers, and the
// sequence that starts them (volumes, init containers and native sidecars in order, then
// the regular containers) and stops them (regular containers, then sidecars in reverse).
type podRun struct {
	node                 *Node
	namespace, name, key string
	uid                  types.UID
	ip, localhost        string
	baseID               int
	dir                  string
	volumePaths          map[string]string
	badVolumes           map[string]string

	inits, regulars []*container
	seqDone         chan struct{} // closed when the start sequence returns
	startStop       chan struct{} // closed when termination begins: nothing more starts
	dirty           chan struct{} // the status changed: tell virtual-kubelet
	ended           chan struct{} // closed once the pod is down and reported

	mu            sync.Mutex
	pod           *corev1.Pod // the latest spec and metadata
	changed       chan struct{}
	startTime     metav1.Time
	volumesReady  bool
	volumeError   string
	initDone      bool
	terminating   bool
	phase         corev1.PodPhase // set once the pod ended (Succeeded or Failed)
	conditionTime map[corev1.PodConditionType]metav1.Time
	condition     map[corev1.PodConditionType]corev1.ConditionStatus
	tokens        map[string]token
}

func newPodRun(n *Node, pod *corev1.Pod, seq int) *podRun {
	r := &podRun{node: n, namespace: pod.Namespace, name: pod.Name, key: pod.Namespace + "/" + pod.Name, uid: pod.UID,
		ip:        fmt.Sprintf("%s.%d.%d", n.podNet, seq/250, seq%250+1),
		localhost: fmt.Sprintf("127.%d.%d.%d", n.net+localhostOffset, seq/250, seq%250+1),
		baseID:    n.net*100000 + seq,
		dir:       filepath.Join(n.dir, "pods", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID)),
		seqDone:   make(chan struct{}), startStop: make(chan struct{}), dirty: make(chan struct{}, 1), ended: make(chan struct{}),
		pod: pod.DeepCopy(), changed: make(chan struct{}), startTime: metav1.Now(),
		conditionTime: map[corev1.PodConditionType]metav1.Time{}, condition: map[corev1.PodConditionType]corev1.ConditionStatus{},
		tokens: map[string]token{}}
	r.volumePaths, r.badVolumes = volumeDirs(pod, r.dir)
	for _, c := range pod.Spec.InitContainers {
		kind := initContainer
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			kind = sidecarContainer
		}
		r.inits = append(r.inits, newContainer(r, c, kind))
	}
	for _, c := range pod.Spec.Containers {
		r.regulars = append(r.regulars, newContainer(r, c, regularContainer))
	}
	for _, c := range r.inits {
		c.state.Waiting.Reason = "PodInitializing"
	}
	if len(r.inits) > 0 {
		for _, c := range r.regulars {
			c.state.Waiting.Reason = "PodInitializing"
		}
	}
	return r
}

func (r *podRun) podCopy() *corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pod.DeepCopy()
}

func (r *podRun) restartPolicy() corev1.RestartPolicy {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.pod.Spec.RestartPolicy; p != "" {
		return p
	}
	return corev1.RestartPolicyAlways
}

// gracePeriod is the deletion's grace period, else the pod's
// terminationGracePeriodSeconds (default 30 s).
func (r *podRun) gracePeriod(deleted *corev1.Pod) time.Duration {
	if deleted != nil && deleted.DeletionGracePeriodSeconds != nil {
		return time.Duration(*deleted.DeletionGracePeriodSeconds) * time.Second
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if g := r.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return 30 * time.Second
}

// changedLocked wakes whoever waits for a state change and marks the status for
// reporting; r.mu is held.
func (r *podRun) changedLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

// waitUntil waits until cond (called with r.mu held) holds; false when termination began
// or the node closed first.
func (r *podRun) waitUntil(cond func() bool) bool {
	for {
		r.mu.Lock()
		if cond() {
			r.mu.Unlock()
			return true
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-r.startStop:
			return false
		case <-r.node.ctx.Done():
			return false
		}
	}
}

// launch starts c's supervisor unless the pod is terminating.
func (r *podRun) launch(c *container) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.terminating || r.node.ctx.Err() != nil {
		return false
	}
	c.launched = true
	go c.supervise()
	return true
}

// run is the pod's start sequence.
func (r *podRun) run() {
	defer close(r.seqDone)
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		r.setVolumeError(err.Error())
		return
	}
	if !r.setUpVolumes() {
		return
	}
	for _, c := range r.inits {
		if !r.launch(c) {
			return
		}
		if c.kind == sidecarContainer {
			if !r.waitUntil(func() bool { return c.started || c.finished }) {
				return
			}
			continue
		}
		if !r.waitUntil(func() bool { return c.finished }) {
			return
		}
		if !r.exitedOK(c) {
			r.end(corev1.PodFailed) // a failed init container that is not restarted fails the pod
			return
		}
	}
	r.mu.Lock()
	r.initDone = true
	r.changedLocked()
	r.mu.Unlock()
	// Regular containers start in order, each once the one before has started and run its
	// postStart hook (as the kubelet starts them in one sync, hook by hook).
	for _, c := range r.regulars {
		if !r.launch(c) || !r.waitUntil(func() bool { return c.startAttempt || c.finished }) {
			return
		}
	}
	// A pod whose containers are not all restarted ends when they have all ended.
	if !r.waitUntil(func() bool {
		for _, c := range r.regulars {
			if !c.finished {
				return false
			}
		}
		return true
	}) {
		return
	}
	phase := corev1.PodSucceeded
	for _, c := range r.regulars {
		if !r.exitedOK(c) {
			phase = corev1.PodFailed
		}
	}
	r.end(phase)
}

// exitedOK reports whether c's last run exited 0.
func (r *podRun) exitedOK(c *container) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return c.lastTerm != nil && c.lastTerm.ExitCode == 0
}

// setUpVolumes makes the pod's volumes, retrying (with the pod's containers waiting in
// ContainerCreating, a FailedMount event each time) until it succeeds or the pod goes.
func (r *podRun) setUpVolumes() bool {
	delay := r.node.opts.RestartBackoff
	for {
		ctx, cancel := context.WithTimeout(r.node.ctx, 30*time.Second)
		err := r.syncVolumes(ctx)
		cancel()
		if err == nil && len(r.badVolumes) == 0 {
			break
		}
		msg := fmt.Sprint(err)
		for _, why := range r.badVolumes {
			msg = why
		}
		r.setVolumeError(msg)
		r.node.event(r, corev1.EventTypeWarning, "FailedMount", msg)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.startStop:
			t.Stop()
			return false
		case <-r.node.ctx.Done():
			t.Stop()
			return false
		}
		delay = min(2*delay, r.node.opts.MaxRestartBackoff)
	}
	r.mu.Lock()
	r.volumesReady, r.volumeError = true, ""
	r.changedLocked()
	r.mu.Unlock()
	go r.refreshVolumes()
	return true
}

func (r *podRun) setVolumeError(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.volumeError = msg
	r.changedLocked()
}

// refreshVolumes brings ConfigMap, Secret, downward-API and token contents up to date
// every VolumeSyncPeriod, as the kubelet's periodic sync does, until the pod ends.
func (r *podRun) refreshVolumes() {
	t := time.NewTicker(r.node.opts.VolumeSyncPeriod)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-r.ended:
			return
		case <-r.node.ctx.Done():
			return
		}
		ctx, cancel := context.WithTimeout(r.node.ctx, 30*time.Second)
		if err := r.syncVolumes(ctx); err != nil {
			r.node.event(r, corev1.EventTypeWarning, "FailedMount", err.Error())
		}
		cancel()
	}
}

// end stops what still runs of a pod that ended on its own (its containers are done and
// not restarted, or an init container failed): its sidecars, in reverse order.
func (r *podRun) end(phase corev1.PodPhase) {
	deadline := time.Now().Add(r.gracePeriod(nil))
	for i := len(r.inits) - 1; i >= 0; i-- {
		r.inits[i].stop(deadline)
	}
	r.mu.Lock()
	if r.phase == "" {
		r.phase = phase
	}
	r.changedLocked()
	r.mu.Unlock()
}

// terminate deletes the pod as the kubelet does, in the background: nothing more
// starts; the regular containers (and a running init container) stop at once, each with
// its preStop hook and SIGTERM, SIGKILL at the grace period's end; then the native
// sidecars, in reverse order, within what is left of it. The final status is written and
// the pod is removed from the API server.
func (r *podRun) terminate(grace time.Duration) {
	r.mu.Lock()
	if r.terminating {
		r.mu.Unlock()
		return
	}
	r.terminating = true
	close(r.startStop)
	r.changedLocked()
	r.mu.Unlock()
	deadline := time.Now().Add(grace)
	go func() {
		<-r.seqDone
		var wg sync.WaitGroup
		for _, c := range append(append([]*container{}, r.regulars...), r.inits...) {
			if c.kind == sidecarContainer {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.stop(deadline)
			}()
		}
		wg.Wait()
		for i := len(r.inits) - 1; i >= 0; i-- {
			r.inits[i].stop(deadline)
		}
		r.finish()
	}()
}

// finish reports the ended pod's final status, removes it from the API server (the
// kubelet deletes a terminated pod with grace 0) and from the node, and removes its
// volumes (its logs stay until the node closes).
func (r *podRun) finish() {
	r.mu.Lock()
	if r.phase == "" {
		r.phase = corev1.PodSucceeded
		for _, c := range r.regulars {
			if !c.ran || c.lastTerm == nil || c.lastTerm.ExitCode != 0 {
				r.phase = corev1.PodFailed
			}
		}
	}
	r.changedLocked()
	r.mu.Unlock()
	pod := r.podWithStatus()
	ctx, cancel := context.WithTimeout(r.node.ctx, 30*time.Second)
	defer cancel()
	pods := r.node.client.CoreV1().Pods(r.namespace)
	if err := patchPodStatus(ctx, pods, pod); err != nil && !apierrors.IsNotFound(err) {
		r.node.logf("pod %s: final status: %v", r.key, err)
	}
	zero := int64(0)
	err := pods.Delete(ctx, r.name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: metav1.NewUIDPreconditions(string(r.uid))})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		r.node.logf("pod %s: delete: %v", r.key, err)
	}
	close(r.ended)
	_ = os.RemoveAll(filepath.Join(r.dir, "volumes"))
	r.node.forget(r)
}

// update takes a new version of the pod's metadata (labels and annotations): the
// downward-API files follow at once.
func (r *podRun) update(pod *corev1.Pod) {
	r.mu.Lock()
	r.pod.Labels, r.pod.Annotations = pod.Labels, pod.Annotations
	ready := r.volumesReady
	r.changedLocked()
	r.mu.Unlock()
	if ready {
		ctx, cancel := context.WithTimeout(r.node.ctx, 30*time.Second)
		defer cancel()
		if err := r.syncVolumes(ctx); err != nil {
			r.node.event(r, corev1.EventTypeWarning, "FailedMount", err.Error())
		}
	}
}

// reporter tells virtual-kubelet of every status change until the pod ended.
func (r *podRun) reporter() {
	for {
		select {
		case <-r.dirty:
		case <-r.ended:
			return
		case <-r.node.ctx.Done():
			return
		}
		if notify := r.node.notifier(); notify != nil {
			notify(r.podWithStatus())
		}
	}
}

// wait returns once every container of the pod is down (after the node's context ended).
func (r *podRun) wait() {
	<-r.seqDone
	for _, c := range append(append([]*container{}, r.inits...), r.regulars...) {
		r.mu.Lock()
		launched := c.launched
		r.mu.Unlock()
		if launched {
			<-c.done
		}
	}
}
