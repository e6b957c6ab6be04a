package main

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

// meshrunProcess is bin/meshrun running the sample mesh, its output read line by line.
type meshrunProcess struct {
	t     *testing.T
	cmd   *exec.Cmd
	dir   string
	out   io.ReadCloser
	lines chan string
	all   strings.Builder
}

func startMeshrun(t *testing.T) *meshrunProcess {
	bin, wasmDir := meshtest.Binaries(t)
	if _, err := os.Stat(filepath.Join(bin, "meshrun")); err != nil {
		t.Fatalf("meshrun missing in %s beside the other binaries: %v", bin, err)
	}
	m := &meshrunProcess{t: t, dir: t.TempDir(), lines: make(chan string, 1000)}
	m.cmd = exec.Command(filepath.Join(bin, "meshrun"), "--dir", m.dir, "--bin", bin, "--wasm", wasmDir,
		"--config", filepath.Join(meshtest.Root(), "testenv", "samples", "bookinfo"), "--interval", "500ms", "--rate", "50")
	out, err := m.cmd.StdoutPipe()
	require.NoError(t, err)
	m.out = out
	m.cmd.Stderr = m.cmd.Stdout
	require.NoError(t, m.cmd.Start())
	t.Cleanup(func() {
		_ = m.cmd.Process.Kill()
		m.noProcessLeft(10 * time.Second)
		if t.Failed() {
			m.logTails()
		}
	})
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			m.lines <- s.Text()
		}
		close(m.lines)
	}()
	return m
}

// wait reads output until a line matches substr and returns that line.
func (m *meshrunProcess) wait(substr string) string {
	m.t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case l, ok := <-m.lines:
			if !ok {
				m.t.Fatalf("meshrun ended before %q:\n%s", substr, m.all.String())
			}
			m.all.WriteString(l + "\n")
			if strings.Contains(l, substr) {
				return l
			}
		case <-deadline:
			m.t.Fatalf("no %q from meshrun:\n%s", substr, m.all.String())
		}
	}
}

// noProcessLeft waits up to d until no process carries this mesh's directory in its
// environment (every process the mesh starts does, and so do the proxies its agents start),
// and fails naming those that remain.
func (m *meshrunProcess) noProcessLeft(d time.Duration) {
	m.t.Helper()
	marker := []byte(localmesh.EnvMeshDir + "=" + m.dir + "\x00")
	var left []string
	deadline := time.Now().Add(d)
	for {
		left = left[:0]
		envs, _ := filepath.Glob("/proc/[0-9]*/environ")
		for _, p := range envs {
			b, err := os.ReadFile(p)
			if err != nil || !strings.Contains(string(b), string(marker)) {
				continue
			}
			cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
			if len(cmdline) > 0 { // a zombie has an empty command line: it is gone
				left = append(left, filepath.Dir(p)+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, l := range left {
		m.t.Errorf("left behind: %s", l)
	}
}

// logTails logs the end of every log file the mesh wrote, for a failed test.
func (m *meshrunProcess) logTails() {
	_ = filepath.WalkDir(m.dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") {
			return nil
		}
		b, _ := os.ReadFile(path)
		if len(b) > 3000 {
			b = b[len(b)-3000:]
		}
		m.t.Logf("--- %s\n%s", path, b)
		return nil
	})
}

// outsideClient calls url the way a curl loop does (a new connection per request) until
// stop is closed, counting what it gets.
type outsideClient struct {
	mu                 sync.Mutex
	ok, refused, other int
	okAfterSignal      int
	signalled          bool
	otherAnswers       []string
}

func (c *outsideClient) run(url string, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for {
		select {
		case <-stop:
			return
		default:
		}
		resp, err := client.Get(url)
		c.mu.Lock()
		switch {
		case err != nil && errors.Is(err, syscall.ECONNREFUSED):
			c.refused++
		case err != nil:
			c.other++
			c.otherAnswers = appendFew(c.otherAnswers, err.Error())
		case resp.StatusCode == http.StatusOK:
			c.ok++
			if c.signalled {
				c.okAfterSignal++
			}
		default:
			c.other++
			c.otherAnswers = appendFew(c.otherAnswers, resp.Status)
		}
		c.mu.Unlock()
		if resp != nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		time.Sleep(20 * time.Millisecond) // about what a shell loop of curl manages
	}
}

// appendFew keeps the first five answers, enough to say what went wrong.
func appendFew(s []string, v string) []string {
	if len(s) < 5 {
		s = append(s, v)
	}
	return s
}

// `make run` end to end: meshrun prints where its logs are, starts the sample mesh (and the
// rate-limit service and its Redis, which the guide names), reports
// the first successful request and a rejected config file by name; Ctrl-C stops it with no
// failed request, inside or from a client outside the mesh, and no process left behind.
func TestMeshrunStartsAndStopsCleanly(t *testing.T) {
	m := startMeshrun(t)
	logs := m.wait("logs: ")
	assert.Contains(t, logs, filepath.Join(m.dir, "logs"), "the log directory is printed at start")
	m.wait("the mesh is up")
	front := regexp.MustCompile(`curl (http://\S+)`).FindStringSubmatch(m.wait("front end:"))
	require.Len(t, front, 2)
	prom := regexp.MustCompile(`(http://\S+)`).FindStringSubmatch(m.wait("prometheus:"))
	require.Len(t, prom, 2, "meshrun prints its Prometheus")
	rl := m.wait("rate-limit service:")
	assert.Contains(t, rl, "outbound|8081||ratelimit.default.svc.cluster.local", "the guide names the service's cluster")
	assert.Contains(t, rl, filepath.Join(m.dir, "ratelimit", "config", "config.yaml"), "and its live config")
	assert.Regexp(t, `redis: +127\.0\.0\.1:\d+`, m.wait("redis:"), "and its Redis")
	require.Eventually(t, func() bool {
		resp, err := http.Get(prom[1] + "/api/v1/query?query=" + url.QueryEscape(`sum(istio_requests_total{reporter="source"})`))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"value"`)
	}, time.Minute, 200*time.Millisecond, "its Prometheus has the mesh's requests")
	m.wait("istio_requests_total{") // the live summary shows the telemetry filter's series
	m.wait("429 by the front end's global rate limit")

	// A broken file in the config directory shows in the live summary, named.
	require.NoError(t, os.WriteFile(filepath.Join(m.dir, "config", "broken.yaml"),
		[]byte("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: broken}\nspec: {hosts: [reviews], http: [{route: [{destination: {host: reviews}, weight: -5}]}]}\n"), 0o644))
	problem := m.wait("broken.yaml")
	assert.Contains(t, problem, "rejected")
	assert.Contains(t, problem, "weight", "the field is named")

	client := &outsideClient{}
	stop, done := make(chan struct{}), make(chan struct{})
	go client.run(front[1], stop, done)
	defer func() { close(stop); <-done }()
	require.Eventually(t, func() bool { client.mu.Lock(); defer client.mu.Unlock(); return client.ok > 0 }, 10*time.Second, 10*time.Millisecond)

	client.mu.Lock()
	client.signalled = true
	client.mu.Unlock()
	require.NoError(t, m.cmd.Process.Signal(syscall.SIGINT))
	m.wait("stopped;")
	for l := range m.lines {
		m.all.WriteString(l + "\n")
	}
	require.NoError(t, m.cmd.Wait(), m.all.String())
	t.Log(m.all.String())
	assert.Contains(t, m.all.String(), "failed 0,")

	client.mu.Lock()
	t.Logf("outside client: %d ok (%d after Ctrl-C), %d refused, %d other", client.ok, client.okAfterSignal, client.refused, client.other)
	assert.Zero(t, client.other, "an outside client gets an answer or a refused connection, never %v", client.otherAnswers)
	assert.Positive(t, client.okAfterSignal, "the front end serves while it drains")
	client.mu.Unlock()
	m.noProcessLeft(0)
}

// `make run 2>&1 | tee run.log`, then Ctrl-C: tee goes first and meshrun's output is
// closed; it still drains every pod and stops, and nothing of the mesh is left.
func TestMeshrunSurvivesAClosedOutput(t *testing.T) {
	m := startMeshrun(t)
	m.wait("the mesh is up")
	require.NoError(t, m.out.Close())
	require.NoError(t, m.cmd.Process.Signal(syscall.SIGINT))
	err := m.cmd.Wait()
	require.NoError(t, err, "meshrun must exit on its own, not by SIGPIPE")
	m.noProcessLeft(0)
}

// meshrun killed outright (SIGKILL, nothing to handle): every process of the mesh, the
// agents' proxies included, goes with it.
func TestMeshrunKilledLeavesNothing(t *testing.T) {
	m := startMeshrun(t)
	m.wait("the mesh is up")
	require.NoError(t, m.cmd.Process.Kill())
	_ = m.cmd.Wait()
	m.noProcessLeft(10 * time.Second)
}

// The sample's global limit, edited live as the guide says (this machine's two shared
// cores cannot always burst past the sample's 200 per second): with 20 per second a burst
// at the front end gets 429s from it (with retry-after), and the live summary counts them.
// That the steady traffic stays under the sample's limit is TestMeshrunStartsAndStopsCleanly's
// "failed 0".
func TestMeshrunShowsTheGlobalLimitsRejections(t *testing.T) {
	m := startMeshrun(t)
	m.wait("the mesh is up")
	front := regexp.MustCompile(`curl (http://\S+)`).FindStringSubmatch(m.wait("front end:"))
	require.Len(t, front, 2)
	conf := regexp.MustCompile(`config \(edit live\) (\S+)`).FindStringSubmatch(m.wait("rate-limit service:"))
	require.Len(t, conf, 2, "the guide names the service's live config")
	m.wait("429 by the front end's global rate limit")
	b, err := os.ReadFile(conf[1])
	require.NoError(t, err)
	lowered := strings.Replace(string(b), "requests_per_unit: 200", "requests_per_unit: 20", 1)
	require.NotEqual(t, string(b), lowered, "the sample's limit is 200 per second")
	require.NoError(t, os.WriteFile(conf[1]+".tmp", []byte(lowered), 0o644))
	require.NoError(t, os.Rename(conf[1]+".tmp", conf[1]))

	var mu sync.Mutex
	statuses := map[int]int{}
	retryAfter := ""
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 20}}
	burst := func() { // the guide's seq 600 | xargs -P 40 curl, halved
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 15 {
					resp, err := client.Get(front[1])
					if err != nil {
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mu.Lock()
					statuses[resp.StatusCode]++
					if resp.StatusCode == http.StatusTooManyRequests {
						retryAfter = resp.Header.Get("retry-after")
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	for i := 0; i < 5 && statuses[http.StatusTooManyRequests] == 0; i++ { // until the service has reloaded
		burst()
	}
	t.Logf("bursts of 300 requests: %v", statuses)
	require.Positive(t, statuses[http.StatusTooManyRequests], "a burst passes the global limit")
	assert.Equal(t, "1", retryAfter, "a 429 says when to retry")
	denied := regexp.MustCompile(`^\s*(\d+)\s+429 by the front end's global rate limit`)
	// The summary counts the bursts' 429s (all of them, once the proxies' stats are
	// flushed; m.wait fails the test after two minutes of lines without).
	for counted := 0; counted < statuses[http.StatusTooManyRequests]; {
		d := denied.FindStringSubmatch(m.wait("429 by the front end's global rate limit"))
		require.Len(t, d, 2)
		counted, _ = strconv.Atoi(d[1])
	}
	require.NoError(t, m.cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, m.cmd.Wait())
	m.noProcessLeft(10 * time.Second)
}

// Without redis-server, meshrun says what is missing, how to get it and how to go without,
// before starting anything.
func TestMeshrunWithoutRedisSaysSo(t *testing.T) {
	bin, wasmDir := meshtest.Binaries(t)
	cmd := exec.Command(filepath.Join(bin, "meshrun"), "--dir", t.TempDir(), "--bin", bin, "--wasm", wasmDir,
		"--config", filepath.Join(meshtest.Root(), "testenv", "samples", "bookinfo"), "--prometheus=false")
	cmd.Env = []string{"PATH=" + t.TempDir(), "HOME=" + os.Getenv("HOME")}
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	assert.Contains(t, string(out), "redis-server")
	assert.Contains(t, string(out), "make tools")
	assert.Contains(t, string(out), "--ratelimit=false")
	assert.NotContains(t, string(out), "starting the local mesh", "nothing is started")
}
