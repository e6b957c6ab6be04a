package kubenode_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/wasmesh/wasmesh/testenv/kubenode"
)

// loop keeps a shell container running; on SIGTERM it runs onTerm at once (the shell
// waits on a background sleep, which a signal interrupts) and exits 0.
func loop(start, onTerm string) string {
	return start + "; trap '" + onTerm + "; exit 0' TERM; while true; do sleep 3600 & wait $!; done"
}

// An init container runs to completion first; a native sidecar starts next and the app
// only once the sidecar's startup probe passed; each regular container starts only once
// the one before it has run its postStart hook; on deletion the preStop hook runs before
// SIGTERM, and the sidecar stops after the app has exited. The containers write what
// happens to them into a file on the machine.
func testOrder(e *env) {
	t := e.t
	dir := t.TempDir()
	ev := func(s string) string { return "echo " + s + " >> /ev/events" }
	always := corev1.ContainerRestartPolicyAlways
	sidecar := shell("sidecar", loop(ev("sidecar-start")+"; sleep 0.5; "+ev("sidecar-ready")+"; touch /ev/sidecar-ready", ev("sidecar-term")))
	sidecar.RestartPolicy = &always
	sidecar.StartupProbe = &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 30,
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/ev/sidecar-ready"}}}}
	first := shell("first", loop(ev("first-start"), ev("first-term")+"; sleep 0.5; "+ev("first-exit")))
	first.Lifecycle = &corev1.Lifecycle{
		PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", ev("hook-start") + "; sleep 1; " + ev("hook-end")}}},
		PreStop:   &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "sleep 0.5; " + ev("prestop")}}},
	}
	second := shell("second", loop(ev("second-start"), ev("second-term")))
	containers := []*corev1.Container{&sidecar, &first, &second}
	initC := shell("init", "sleep 0.5; "+ev("init")) // long enough for a sidecar started beside it to write first
	containers = append(containers, &initC)
	for _, c := range containers {
		c.VolumeMounts = []corev1.VolumeMount{{Name: "ev", MountPath: "/ev"}}
	}
	e.createPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "order"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{initC, sidecar}, Containers: []corev1.Container{first, second},
		TerminationGracePeriodSeconds: int64p(20), Volumes: []corev1.Volume{hostPathVolume("ev", dir)}}})

	pod := e.waitPod("order", 2*time.Minute, "Ready", ready)
	events := lines(t, filepath.Join(dir, "events"))
	before(t, events, "init", "sidecar-start")
	before(t, events, "sidecar-ready", "first-start")
	before(t, events, "hook-end", "second-start")
	assert.Equal(t, corev1.PodRunning, pod.Status.Phase)
	initStatus := containerStatus(pod, "init")
	require.NotNil(t, initStatus.State.Terminated, "the init container completed")
	assert.Equal(t, int32(0), initStatus.State.Terminated.ExitCode)
	assert.True(t, containerStatus(pod, "sidecar").Ready)

	require.NoError(t, e.kc.CoreV1().Pods(e.ns).Delete(e.ctx, "order", metav1.DeleteOptions{}))
	e.waitGone("order")
	events = lines(t, filepath.Join(dir, "events"))
	before(t, events, "prestop", "first-term")
	before(t, events, "first-exit", "sidecar-term")
	before(t, events, "second-term", "sidecar-term")
}

// A container that ignores SIGTERM is killed when the grace period ends, and the pod's
// final status says so before the pod goes.
func testGracePeriod(e *env) {
	t := e.t
	e.createPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stubborn"}, Spec: corev1.PodSpec{
		TerminationGracePeriodSeconds: int64p(1),
		Containers:                    []corev1.Container{shell("stubborn", "trap '' TERM; while true; do sleep 0.1; done")}}})
	e.waitPod("stubborn", time.Minute, "running", running)
	w, err := e.kc.CoreV1().Pods(e.ns).Watch(e.ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", "stubborn").String()})
	require.NoError(t, err)
	defer w.Stop()
	require.NoError(t, e.kc.CoreV1().Pods(e.ns).Delete(e.ctx, "stubborn", metav1.DeleteOptions{}))
	var last *corev1.Pod
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for deleted := false; !deleted; {
		select {
		case ev, ok := <-w.ResultChan():
			require.True(t, ok, "the watch ended")
			if p, ok := ev.Object.(*corev1.Pod); ok {
				last = p
			}
			deleted = ev.Type == watch.Deleted
		case <-deadline.C:
			t.Fatalf("the pod is not gone a minute after its deletion with a grace period of 1s; processes %v", e.processesOf("stubborn"))
		}
	}
	require.NotNil(t, last)
	term := containerStatus(last, "stubborn").State.Terminated
	require.NotNil(t, term, "the final status, written before the pod went: %s", statusSummary(last))
	assert.Equal(t, int32(137), term.ExitCode, "SIGKILL")
	assert.Equal(t, corev1.PodFailed, last.Status.Phase)
	e.waitGone("stubborn")
}

// Restart policies: Always restarts a crashing container with a growing back-off and a
// restart count; OnFailure restarts until it succeeds; Never does not restart.
func testRestarts(e *env) {
	t := e.t
	dir := t.TempDir()
	withEv := func(c corev1.Container) corev1.Container {
		c.VolumeMounts = []corev1.VolumeMount{{Name: "ev", MountPath: "/ev"}}
		return c
	}
	pod := func(name string, policy corev1.RestartPolicy, script string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{RestartPolicy: policy,
			TerminationGracePeriodSeconds: int64p(1),
			Containers:                    []corev1.Container{withEv(shell("main", script))}, Volumes: []corev1.Volume{hostPathVolume("ev", dir)}}}
	}
	e.createPod(pod("crasher", corev1.RestartPolicyAlways, "echo run >> /ev/crasher; exit 3"))
	e.createPod(pod("retry", corev1.RestartPolicyOnFailure, "if [ -f /ev/retried ]; then exit 0; fi; touch /ev/retried; exit 1"))
	e.createPod(pod("never", corev1.RestartPolicyNever, "exit 1"))

	p := e.waitPod("crasher", 2*time.Minute, "restarted twice, in back-off", func(p *corev1.Pod) error {
		cs := containerStatus(p, "main")
		if cs.RestartCount < 2 || cs.State.Waiting == nil || cs.State.Waiting.Reason != "CrashLoopBackOff" {
			return fmt.Errorf("restarts %d", cs.RestartCount)
		}
		return nil
	})
	cs := containerStatus(p, "main")
	require.NotNil(t, cs.LastTerminationState.Terminated)
	assert.Equal(t, int32(3), cs.LastTerminationState.Terminated.ExitCode)
	assert.Equal(t, "Error", cs.LastTerminationState.Terminated.Reason)
	assert.Contains(t, cs.State.Waiting.Message, "restarting failed container=main pod=crasher_"+e.ns)
	assert.GreaterOrEqual(t, len(lines(t, filepath.Join(dir, "crasher"))), int(cs.RestartCount)+1, "every restart ran the command")
	assert.Equal(t, corev1.PodRunning, p.Status.Phase)

	p = e.waitPod("retry", time.Minute, "Succeeded", phase(corev1.PodSucceeded))
	cs = containerStatus(p, "main")
	assert.Equal(t, int32(1), cs.RestartCount)
	require.NotNil(t, cs.State.Terminated)
	assert.Equal(t, "Completed", cs.State.Terminated.Reason)

	p = e.waitPod("never", time.Minute, "Failed", phase(corev1.PodFailed))
	cs = containerStatus(p, "main")
	assert.Equal(t, int32(0), cs.RestartCount)
	require.NotNil(t, cs.State.Terminated)
	assert.Equal(t, int32(1), cs.State.Terminated.ExitCode)

	for _, name := range []string{"crasher", "retry", "never"} {
		require.NoError(t, e.kc.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}))
	}
	for _, name := range []string{"crasher", "retry", "never"} {
		e.waitGone(name)
	}
}

func phase(want corev1.PodPhase) func(*corev1.Pod) error {
	return func(p *corev1.Pod) error {
		if p.Status.Phase != want {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	}
}

// An image the table does not have leaves the container waiting, with a reason and a
// message that say so.
func testUnknownImage(e *env) {
	t := e.t
	e.createPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ghost"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: int64p(1),
		Containers: []corev1.Container{{Name: "app", Image: "registry.example.com/team/ghost:1.0"}}}})
	p := e.waitPod("ghost", time.Minute, "waiting for its image", func(p *corev1.Pod) error {
		w := containerStatus(p, "app").State.Waiting
		if w == nil || (w.Reason != "ErrImagePull" && w.Reason != "ImagePullBackOff") {
			return fmt.Errorf("not waiting for its image")
		}
		return nil
	})
	w := containerStatus(p, "app").State.Waiting
	assert.Contains(t, w.Message, `image "registry.example.com/team/ghost:1.0" (team/ghost) is not in the image table`)
	assert.Contains(t, w.Message, "wasmesh/echo", "the message lists the images there are")
	assert.Equal(t, corev1.PodPending, p.Status.Phase)
	require.NoError(t, e.kc.CoreV1().Pods(e.ns).Delete(e.ctx, "ghost", metav1.DeleteOptions{}))
	e.waitGone("ghost")
}

// A pod whose ConfigMap is missing waits in ContainerCreating, saying why, and starts once
// the ConfigMap is there.
func testMissingConfigMap(e *env) {
	t := e.t
	c := shell("main", "cat /conf/key && exec sleep 3600")
	c.VolumeMounts = []corev1.VolumeMount{{Name: "conf", MountPath: "/conf"}}
	e.createPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "late"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: int64p(1),
		Containers: []corev1.Container{c}, Volumes: []corev1.Volume{{Name: "conf", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "late-conf"}}}}}}})
	p := e.waitPod("late", time.Minute, "waiting for its volume", func(p *corev1.Pod) error {
		w := containerStatus(p, "main").State.Waiting
		if w == nil || w.Reason != "ContainerCreating" || !strings.Contains(w.Message, `configmap "late-conf" not found`) {
			return fmt.Errorf("not waiting for its ConfigMap")
		}
		return nil
	})
	assert.Equal(t, corev1.PodPending, p.Status.Phase)
	_, err := e.kc.CoreV1().ConfigMaps(e.ns).Create(e.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late-conf"},
		Data: map[string]string{"key": "value"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	e.waitPod("late", time.Minute, "Ready once its ConfigMap is there", ready)
	require.NoError(t, e.kc.CoreV1().Pods(e.ns).Delete(e.ctx, "late", metav1.DeleteOptions{}))
	e.waitGone("late")
}

// Readiness and liveness probes (exec) drive the container's and the pod's Ready
// status and its restarts.
func testProbes(e *env) {
	t := e.t
	dir := t.TempDir()
	c := shell("main", "touch /ev/alive /ev/ready; echo run >> /ev/runs; while true; do sleep 0.1; done")
	c.VolumeMounts = []corev1.VolumeMount{{Name: "ev", MountPath: "/ev"}}
	c.ReadinessProbe = &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 1,
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/ev/ready"}}}}
	c.LivenessProbe = &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 2,
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/ev/alive"}}}}
	e.createPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "probed"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: int64p(1),
		Containers: []corev1.Container{c}, Volumes: []corev1.Volume{hostPathVolume("ev", dir)}}})
	e.waitPod("probed", time.Minute, "Ready", ready)

	require.NoError(t, os.Remove(filepath.Join(dir, "ready")))
	p := e.waitPod("probed", time.Minute, "not Ready after its readiness probe fails", func(p *corev1.Pod) error {
		if ready(p) == nil {
			return fmt.Errorf("still Ready")
		}
		return nil
	})
	assert.False(t, containerStatus(p, "main").Ready)
	assert.Equal(t, int32(0), containerStatus(p, "main").RestartCount, "readiness does not restart")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ready"), nil, 0o644))
	e.waitPod("probed", time.Minute, "Ready again", ready)

	require.NoError(t, os.Remove(filepath.Join(dir, "alive")))
	e.waitPod("probed", time.Minute, "restarted by its liveness probe, and Ready", func(p *corev1.Pod) error {
		if n := containerStatus(p, "main").RestartCount; n != 1 {
			return fmt.Errorf("restarts %d", n)
		}
		return ready(p)
	})
	assert.Len(t, lines(t, filepath.Join(dir, "runs")), 2)
	require.NoError(t, e.kc.CoreV1().Pods(e.ns).Delete(e.ctx, "probed", metav1.DeleteOptions{}))
	e.waitGone("probed")
}

// Closing a node kills every process it started at once, whatever they started too, and
// a second node runs in a block of its own.
func testClose(e *env, bin string) {
	t := e.t
	n2, err := kubenode.Start(e.ctx, kubenode.Options{Config: e.cluster.Config, Name: "second", BinDir: bin, Logf: t.Logf})
	require.NoError(t, err)
	defer n2.Close()
	other := *e
	other.node = n2
	e2 := &other
	e2.createPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "family"}, Spec: corev1.PodSpec{NodeName: "second",
		Containers: []corev1.Container{shell("main", "sleep 3600 & sleep 3600 & wait")}}})
	p := e2.waitPod("family", time.Minute, "running", running)
	assert.NotEqual(t, strings.Split(p.Status.PodIP, ".")[1], strings.Split(e.node.HostIP(), ".")[1], "the nodes' blocks differ")
	e2.waitFor(time.Minute, "the container's children", func() error {
		if procs := e2.processesOf("family"); len(procs) < 3 {
			return fmt.Errorf("processes %v", procs)
		}
		return nil
	})
	n2.Close()
	assert.Empty(t, n2.Processes(), "nothing left once Close returns")
}
