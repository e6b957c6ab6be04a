package kubenode

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type containerKind int

const (
	regularContainer containerKind = iota
	initContainer
	sidecarContainer // an init container with restartPolicy Always
)

// A container of a pod: its spec and, under the pod's lock, the state its status reports.
// supervise runs it (and runs it again, by the restart policy) until stop.
type container struct {
	pod  *podRun
	spec corev1.Container
	kind containerKind

	stopCh   chan struct{} // closed by stop: no new run
	stopOnce sync.Once
	done     chan struct{} // closed when supervise returns

	// Guarded by pod.mu.
	launched     bool // supervise was started
	state, last  corev1.ContainerState
	lastTerm     *corev1.ContainerStateTerminated
	restarts     int32
	runs         int  // runs started (numbers the log files)
	started      bool // running, its postStart hook done and its startup probe passed
	ready        bool
	startAttempt bool // a first start (with its postStart hook) finished, well or not
	ran          bool // ran at least once
	finished     bool // supervise returned without being stopped: no further run
	proc         *process
	exec         *execContext // of the current run
	imageID      string
	backoffDelay time.Duration
}

func newContainer(r *podRun, spec corev1.Container, kind containerKind) *container {
	return &container{pod: r, spec: spec, kind: kind, stopCh: make(chan struct{}), done: make(chan struct{}),
		state: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
}

// startFailure is why a run did not start: a waiting reason (ErrImagePull,
// CreateContainerConfigError), or, when exited, a start that failed after the container
// was created (StartError, which counts as a run that exited 128).
type startFailure struct {
	reason, msg string
	exited      bool
}

// supervise runs the container until it is stopped, the node closes, or it ends and its
// restart policy does not run it again.
func (c *container) supervise() {
	defer close(c.done)
	r := c.pod
	for {
		proc, fail := c.start()
		if proc == nil && fail == nil {
			return // stopped before it started
		}
		if fail != nil && !fail.exited {
			if !c.backOff(fail) {
				return
			}
			continue
		}
		var code int32
		if proc != nil {
			code = c.wait(proc)
		} else {
			code = 128
			c.recordExit(&corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: fail.msg,
				StartedAt: metav1.Now(), FinishedAt: metav1.Now()})
		}
		if !c.restartable(code) {
			r.mu.Lock()
			c.finished = !c.stopped() && r.node.ctx.Err() == nil
			r.changedLocked()
			r.mu.Unlock()
			return
		}
		if !c.backOff(nil) {
			return
		}
	}
}

func (c *container) stopped() bool {
	select {
	case <-c.stopCh:
		return true
	default:
		return false
	}
}

func (c *container) restartable(code int32) bool {
	if c.stopped() || c.pod.node.ctx.Err() != nil {
		return false
	}
	switch c.kind {
	case sidecarContainer:
		return true
	case initContainer:
		return code != 0 && c.pod.restartPolicy() != corev1.RestartPolicyNever
	}
	switch c.pod.restartPolicy() {
	case corev1.RestartPolicyAlways:
		return true
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return false
}

// backOff waits before the next run as the kubelet does: no wait after a first failure,
// then the node's initial back-off, doubling up to its maximum (reset after a run of ten
// minutes). The container waits meanwhile with fail's reason (ErrImagePull turns
// ImagePullBackOff), or CrashLoopBackOff after an exit. It reports false when stopped.
func (c *container) backOff(fail *startFailure) bool {
	r := c.pod
	r.mu.Lock()
	delay := c.backoffDelay
	if fail == nil && c.lastTerm != nil && c.lastTerm.FinishedAt.Sub(c.lastTerm.StartedAt.Time) > 10*time.Minute {
		delay = 0
	}
	if delay == 0 {
		c.backoffDelay = r.node.opts.RestartBackoff
	} else {
		c.backoffDelay = min(2*delay, r.node.opts.MaxRestartBackoff)
	}
	switch {
	case fail == nil && delay > 0:
		c.last = corev1.ContainerState{Terminated: c.lastTerm}
		c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", delay, c.spec.Name, r.name, r.namespace, r.uid)}}
	case fail != nil:
		c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: fail.reason, Message: fail.msg}}
	}
	r.changedLocked()
	r.mu.Unlock()
	if fail != nil {
		r.node.event(r, corev1.EventTypeWarning, failedEventReason(fail.reason), fail.msg)
		if delay == 0 {
			delay = r.node.opts.RestartBackoff
		}
		if fail.reason == "ErrImagePull" {
			r.mu.Lock()
			c.state.Waiting = &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff",
				Message: fmt.Sprintf("Back-off pulling image %q: ErrImagePull: %s", c.spec.Image, fail.msg)}
			r.changedLocked()
			r.mu.Unlock()
		}
	}
	if delay == 0 {
		return !c.stopped() && r.node.ctx.Err() == nil
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.stopCh:
	case <-r.node.ctx.Done():
	}
	return false
}

func failedEventReason(reason string) string {
	switch reason {
	case "ErrImagePull":
		return "Failed"
	case "CreateContainerConfigError":
		return "Failed"
	}
	return "BackOff"
}

// start resolves the container's image, mounts, environment and command line, starts the
// process and runs its postStart hook: the container is running (and the next one may
// start) only once the hook is done, as with the kubelet.
func (c *container) start() (*process, *startFailure) {
	r := c.pod
	pod := r.podCopy()
	img, err := r.node.lookupImage(c.spec.Image)
	if err != nil {
		return nil, &startFailure{reason: "ErrImagePull", msg: err.Error()}
	}
	ms, err := r.containerMounts(&c.spec)
	if err != nil {
		return nil, &startFailure{reason: "CreateContainerConfigError", msg: err.Error()}
	}
	ctx, cancel := c.stopContext()
	defer cancel()
	envMap, err := r.containerEnv(ctx, pod, &c.spec, ms)
	if err != nil {
		return nil, &startFailure{reason: "CreateContainerConfigError", msg: err.Error()}
	}
	lookup := func(k string) (string, bool) { v, ok := envMap[k]; return v, ok }
	var argv []string
	for _, a := range commandLine(img, c.spec.Command, c.spec.Args) {
		argv = append(argv, ms.rewrite(expand(a, lookup)))
	}
	if len(argv) == 0 {
		return nil, &startFailure{reason: "CreateContainerError", msg: "no command specified"}
	}
	prog, err := r.node.program(img, argv[0])
	if err != nil {
		var ie *imageError
		if errors.As(err, &ie) {
			return nil, &startFailure{reason: "ErrImagePull", msg: err.Error()}
		}
		return nil, &startFailure{reason: "StartError", msg: err.Error(), exited: true}
	}
	argv[0] = prog
	env := environ(envMap)
	dir := r.dir
	if c.spec.WorkingDir != "" {
		dir = ms.rewrite(c.spec.WorkingDir)
	}
	x := &execContext{img: img, env: env, dir: dir, mounts: ms}

	r.mu.Lock()
	if c.stopped() || r.node.ctx.Err() != nil {
		r.mu.Unlock()
		return nil, nil
	}
	proc, err := startProcess(argv, env, dir, r.logPath(c.spec.Name, c.runs))
	if err != nil {
		r.mu.Unlock()
		return nil, &startFailure{reason: "StartError", msg: err.Error(), exited: true}
	}
	if c.lastTerm != nil {
		c.restarts++
		c.last = corev1.ContainerState{Terminated: c.lastTerm}
	}
	c.runs++
	c.proc, c.exec, c.imageID = proc, x, "kubenode://"+prog
	c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	r.changedLocked()
	r.mu.Unlock()
	c.postStart(ctx, proc, x)
	go c.probe(proc, x)
	return proc, nil
}

// stopContext is a context that ends when the container is stopped or the node closes.
func (c *container) stopContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(c.pod.node.ctx)
	go func() {
		select {
		case <-c.stopCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// postStart runs the postStart hook, if any, while the process runs; the container counts
// as running only once it is done. A failed hook kills the run, as the kubelet's does.
func (c *container) postStart(ctx context.Context, proc *process, x *execContext) {
	r := c.pod
	if c.spec.Lifecycle != nil && c.spec.Lifecycle.PostStart != nil {
		// A hook cut short by the container's stop leaves the container to stop's preStop
		// hook and SIGTERM.
		if err := c.runHandler(ctx, c.spec.Lifecycle.PostStart, x); err != nil && !c.stopped() {
			msg := fmt.Sprintf("PostStartHook failed: %v", err)
			r.node.event(r, corev1.EventTypeWarning, "FailedPostStartHook", msg)
			proc.kill()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c.startAttempt = true
	if !proc.running() {
		r.changedLocked()
		return
	}
	c.ran = true
	c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(proc.started)}}
	c.started = c.spec.StartupProbe == nil
	c.ready = c.started && c.spec.ReadinessProbe == nil
	r.changedLocked()
}

// wait waits for the run to end (killing it when the node closes) and records how.
func (c *container) wait(proc *process) int32 {
	select {
	case <-proc.done:
	case <-c.pod.node.ctx.Done():
		proc.kill()
	}
	code, sig := proc.exit()
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	c.recordExit(&corev1.ContainerStateTerminated{ExitCode: code, Signal: sig, Reason: reason,
		StartedAt: metav1.NewTime(proc.started), FinishedAt: metav1.NewTime(proc.finished),
		ContainerID: "kubenode://" + strconv.Itoa(proc.pid)})
	return code
}

func (c *container) recordExit(t *corev1.ContainerStateTerminated) {
	r := c.pod
	r.mu.Lock()
	defer r.mu.Unlock()
	c.lastTerm = t
	c.state = corev1.ContainerState{Terminated: t}
	c.started, c.ready = false, false
	c.startAttempt = true
	r.changedLocked()
}

// stop stops the container for good, as the kubelet kills a container of a pod being
// deleted: its preStop hook, SIGTERM, and SIGKILL at the deadline (at least two seconds
// after the hook, the kubelet's minimum). It returns once the container is down.
func (c *container) stop(deadline time.Time) {
	c.stopOnce.Do(func() { close(c.stopCh) })
	r := c.pod
	r.mu.Lock()
	proc, launched := c.proc, c.launched
	r.mu.Unlock()
	// A container that never started keeps its waiting state; one that ran keeps its last
	// terminated state.
	if proc != nil && proc.running() {
		c.terminateRun(proc, deadline, "Stopping container "+c.spec.Name)
	}
	if launched {
		<-c.done
	}
}

// terminateRun ends one run of the container: preStop hook, SIGTERM, SIGKILL at the
// deadline.
func (c *container) terminateRun(proc *process, deadline time.Time, why string) {
	r := c.pod
	r.node.event(r, corev1.EventTypeNormal, "Killing", why)
	r.mu.Lock()
	x := c.exec
	r.mu.Unlock()
	if c.spec.Lifecycle != nil && c.spec.Lifecycle.PreStop != nil {
		ctx, cancel := context.WithDeadline(r.node.ctx, deadline)
		err := c.runHandler(ctx, c.spec.Lifecycle.PreStop, x)
		cancel()
		if err != nil {
			r.node.event(r, corev1.EventTypeWarning, "FailedPreStopHook", fmt.Sprintf("PreStopHook failed: %v", err))
		}
	}
	proc.signal(syscall.SIGTERM)
	grace := max(time.Until(deadline), minimumGrace)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-proc.done:
	case <-t.C:
		proc.kill()
	case <-r.node.ctx.Done():
		proc.kill()
	}
}

// minimumGrace is the least time a container gets between SIGTERM and SIGKILL (the
// kubelet's minimumGracePeriodInSeconds).
const minimumGrace = 2 * time.Second

// execContext is what a hook or probe of the container runs with: the container's image,
// environment, working directory and mounts.
type execContext struct {
	img    Image
	env    []string
	dir    string
	mounts mounts
}

func (r *podRun) logPath(container string, run int) string {
	return filepath.Join(r.dir, "logs", container, strconv.Itoa(run)+".log")
}
