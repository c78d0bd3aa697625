package nri

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if os.Getenv(runtimeSocketEnv) != "" {
		os.Exit(RuntimeMain())
	}
	os.Exit(m.Run())
}

const (
	unlimited = ^uint64(0)
	deadline  = 20 * time.Second
)

// binary is the plugin under test: $RDP_BINARY (run.sh and ctest set it).
func binary(t *testing.T) string {
	t.Helper()
	path := os.Getenv("RDP_BINARY")
	if path == "" {
		t.Skip("$RDP_BINARY is not set: the built rdma-device-plugin")
	}
	return path
}

// socketDir is a short directory for the runtime's socket (sockaddr_un holds 107 bytes).
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rdpt-nri-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// lines collects a child's output and lets a test wait for a line.
type lines struct {
	mu      sync.Mutex
	changed *sync.Cond
	all     []string
	closed  bool
}

func newLines(r io.Reader, also func(string)) *lines {
	l := &lines{}
	l.changed = sync.NewCond(&l.mu)
	go func() {
		s := bufio.NewScanner(r)
		s.Buffer(make([]byte, 1<<20), 64<<20)
		for s.Scan() {
			if also != nil {
				also(s.Text())
			}
			l.mu.Lock()
			l.all = append(l.all, s.Text())
			l.changed.Broadcast()
			l.mu.Unlock()
		}
		l.mu.Lock()
		l.closed = true
		l.changed.Broadcast()
		l.mu.Unlock()
	}()
	return l
}

// wait returns the first line from index `from` on that matches, or "" after the timeout or
// when the output ends; and the index after it.
func (l *lines) wait(re *regexp.Regexp, from int, timeout time.Duration) (string, int) {
	timer := time.AfterFunc(timeout, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.changed.Broadcast()
	})
	defer timer.Stop()
	end := time.Now().Add(timeout)
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := from; ; {
		for ; i < len(l.all); i++ {
			if re.MatchString(l.all[i]) {
				return l.all[i], i + 1
			}
		}
		if l.closed || !time.Now().Before(end) {
			return "", i
		}
		l.changed.Wait()
	}
}

func (l *lines) count(re *regexp.Regexp) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.all {
		if re.MatchString(line) {
			n++
		}
	}
	return n
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.all, "\n")
}

// runtimeProc is the runtime child (runtime.go).
type runtimeProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	reply  *lines
	next   int
	stderr *bytes.Buffer
}

// startRuntime starts a runtime listening on `socket`, reporting `existing` containers at
// Synchronize, and waits until it listens.
func startRuntime(t *testing.T, socket string, existing int) *runtimeProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), runtimeSocketEnv+"="+socket,
		fmt.Sprintf("%s=%d", runtimeExistingEnv, existing))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r := &runtimeProc{t: t, cmd: cmd, stdin: stdin, stderr: &bytes.Buffer{}}
	cmd.Stderr = &lockedWriter{w: r.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.reply = newLines(stdout, nil)
	t.Cleanup(func() {
		r.kill()
		if t.Failed() {
			t.Logf("runtime's log:\n%s", r.stderr.String())
		}
	})
	r.do(runtimeCommand{Op: "ready"}, true)
	return r
}

// do sends a command and returns its reply; with `ready`, it only reads the first line.
func (r *runtimeProc) do(cmd runtimeCommand, ready bool) runtimeReply {
	r.t.Helper()
	if !ready {
		b, _ := json.Marshal(cmd)
		if _, err := r.stdin.Write(append(b, '\n')); err != nil {
			r.t.Fatalf("runtime: %v", err)
		}
	}
	line, next := r.reply.wait(regexp.MustCompile(`^\{`), r.next, 2*deadline)
	if line == "" {
		r.t.Fatalf("runtime: no answer to %+v", cmd)
	}
	r.next = next
	var reply runtimeReply
	if err := json.Unmarshal([]byte(line), &reply); err != nil {
		r.t.Fatalf("runtime: %q: %v", line, err)
	}
	return reply
}

// waitAdded waits until this runtime has added n plugins (connected and synchronized them),
// counting from its start.
func (r *runtimeProc) waitAdded(n int) runtimeReply {
	r.t.Helper()
	reply := r.do(runtimeCommand{Op: "wait", Plugins: n, TimeoutMs: deadline.Milliseconds()}, false)
	if reply.Added < n {
		r.t.Fatalf("%d plugins added after %v, want %d", reply.Added, deadline, n)
	}
	return reply
}

// create asks the runtime to create a container with these device nodes (and CDI devices and
// memlock limits, when given) and returns the RLIMIT_MEMLOCK adjustment, or nil.
func (r *runtimeProc) create(name string, devices []string, cdi []string, memlock []uint64) []uint64 {
	r.t.Helper()
	reply := r.do(runtimeCommand{Op: "create", Name: name, Devices: devices, CDI: cdi, Memlock: memlock}, false)
	if reply.Error != "" {
		r.t.Fatalf("creating %s failed: %s", name, reply.Error)
	}
	r.t.Logf("create %s: the runtime's CreateContainer took %d us", name, reply.LatencyUs)
	for _, rl := range reply.Rlimits {
		if rl.Type != "RLIMIT_MEMLOCK" {
			r.t.Errorf("create %s: unexpected rlimit %v", name, rl)
		}
	}
	if len(reply.Rlimits) == 0 {
		return nil
	}
	return []uint64{reply.Rlimits[0].Soft, reply.Rlimits[0].Hard}
}

// kill ends the runtime as a crash would (SIGKILL); idempotent.
func (r *runtimeProc) kill() {
	if r.cmd.ProcessState == nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
	}
}

// stop ends the runtime cleanly: stdin closed, the adaptation stopped, the process exits.
func (r *runtimeProc) stop() {
	r.t.Helper()
	r.stdin.Close()
	if err := r.cmd.Wait(); err != nil {
		r.t.Errorf("runtime exit: %v", err)
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// pluginProc is the plugin binary, `rdma-device-plugin nri`.
type pluginProc struct {
	t   *testing.T
	cmd *exec.Cmd
	log *lines
}

var metricsLine = regexp.MustCompile(`metrics: serving on (\S+)`)

func startPlugin(t *testing.T, socket string, args ...string) *pluginProc {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"nri", "--nri-socket", socket,
		"--metrics-address", "127.0.0.1:0"}, args...)...)
	cmd.Env = os.Environ()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pluginProc{t: t, cmd: cmd, log: newLines(stderr, nil)}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("plugin's log:\n%s", p.log.String())
		}
	})
	return p
}

func (p *pluginProc) kill() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	}
}

// scrape returns the plugin's /metrics.
func (p *pluginProc) scrape() string {
	p.t.Helper()
	line, _ := p.log.wait(metricsLine, 0, deadline)
	if line == "" {
		p.t.Fatal("the plugin logged no metrics address")
	}
	resp, err := http.Get("http://" + metricsLine.FindStringSubmatch(line)[1] + "/metrics")
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

func expectSample(t *testing.T, scrape, sample string) {
	t.Helper()
	for _, line := range strings.Split(scrape, "\n") {
		if line == sample {
			return
		}
	}
	t.Errorf("no sample %q in the scrape:\n%s", sample, scrape)
}

var (
	uverbsDP  = []string{"/dev/infiniband/uverbs0", "/dev/infiniband/uverbs3", "/dev/infiniband/rdma_cm"}
	uverbsCDI = []string{"/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"}
	cdiNames  = []string{"rdma.network.alibabacloud.com/hca=0f1e2d3c-claim-hca"}
)

// TestNRIMemlockFollowsTheDevices: the containers that hold one of our devices, through the
// device plugin or through DRA's CDI devices, get RLIMIT_MEMLOCK raised to unlimited; every
// other container is created as the runtime would create it. The runtime reports 30000 existing
// containers, more than one ttrpc message holds, so it synchronizes the plugin in parts.
func TestNRIMemlockFollowsTheDevices(t *testing.T) {
	socket := filepath.Join(socketDir(t), "nri.sock")
	runtime := startRuntime(t, socket, 30000)
	plugin := startPlugin(t, socket)
	runtime.waitAdded(1)

	cases := []struct {
		name    string
		devices []string
		cdi     []string
		memlock []uint64
		want    []uint64
	}{
		{"device-plugin", uverbsDP, nil, nil, []uint64{unlimited, unlimited}},
		{"dra-cdi", uverbsCDI, cdiNames, nil, []uint64{unlimited, unlimited}},
		{"runtime-default-8mi", uverbsDP, nil, []uint64{8 << 20, 8 << 20}, []uint64{unlimited, unlimited}},
		{"plain", nil, nil, nil, nil},
		{"gpu-only", []string{"/dev/nvidia0", "/dev/nvidiactl"}, nil, nil, nil},
		{"rdma-cm-only", []string{"/dev/infiniband/rdma_cm"}, nil, nil, nil},
		{"already-unlimited", uverbsDP, nil, []uint64{unlimited, unlimited}, nil},
	}
	adjusted := 0
	for _, c := range cases {
		got := runtime.create(c.name, c.devices, c.cdi, c.memlock)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: RLIMIT_MEMLOCK adjustment %v, want %v", c.name, got, c.want)
		}
		logged := regexp.MustCompile(`raised RLIMIT_MEMLOCK of container ml/trainer-0/` + c.name + ` `)
		if c.want != nil {
			adjusted++
			if line, _ := plugin.log.wait(logged, 0, deadline); line == "" {
				t.Errorf("%s: no log line for the adjustment", c.name)
			} else {
				t.Logf("plugin: %s", line)
			}
		}
	}
	for _, c := range cases {
		logged := regexp.MustCompile(`raised RLIMIT_MEMLOCK of container ml/trainer-0/` + c.name + ` `)
		if n := plugin.log.count(logged); (c.want == nil && n != 0) || (c.want != nil && n != 1) {
			t.Errorf("%s: %d adjustment log lines", c.name, n)
		}
	}
	if line, _ := plugin.log.wait(regexp.MustCompile(`synchronized: 30000 existing containers, 3000 with an HCA`), 0, deadline); line == "" {
		t.Error("no log line for the split synchronization of 30000 containers")
	}

	// Only the events the plugin subscribed to reach it.
	reply := runtime.do(runtimeCommand{Op: "start", Name: "plain"}, false)
	if reply.Error != "" {
		t.Errorf("start/update/remove: %s", reply.Error)
	}
	split := 0
	for _, inv := range reply.Invocations {
		switch {
		case strings.HasSuffix(inv, " Synchronize"), strings.HasSuffix(inv, " CreateContainer"):
		case strings.Contains(inv, " Synchronize error: ") && strings.Contains(inv, "ResourceExhausted"):
			split++ // the runtime's own attempt at one message, before it splits
		default:
			t.Errorf("the runtime invoked %q", inv)
		}
	}
	if split == 0 {
		t.Error("the runtime synchronized 30000 containers in one message: the split was not exercised")
	}

	scrape := plugin.scrape()
	expectSample(t, scrape, fmt.Sprintf("rdma_device_plugin_nri_memlock_adjustments_total %d", adjusted))
	expectSample(t, scrape, "rdma_device_plugin_nri_errors_total 0")
	expectSample(t, scrape, "rdma_device_plugin_nri_registrations_total 1")
	expectSample(t, scrape, "rdma_device_plugin_nri_connected 1")

	// SIGTERM: a clean stop.
	plugin.cmd.Process.Signal(syscall.SIGTERM)
	if err := plugin.cmd.Wait(); err != nil {
		t.Errorf("plugin exit after SIGTERM: %v", err)
	}
}

// TestNRIConfiguredMemlock: --memlock sets the soft limit, and a higher hard limit is kept.
func TestNRIConfiguredMemlock(t *testing.T) {
	socket := filepath.Join(socketDir(t), "nri.sock")
	runtime := startRuntime(t, socket, 0)
	startPlugin(t, socket, "--memlock", "64Gi")
	runtime.waitAdded(1)
	const gi64 = uint64(64) << 30
	if got := runtime.create("a", uverbsDP, nil, nil); fmt.Sprint(got) != fmt.Sprint([]uint64{gi64, gi64}) {
		t.Errorf("adjustment %v, want 64Gi/64Gi", got)
	}
	if got := runtime.create("b", uverbsDP, nil, []uint64{8 << 20, unlimited}); fmt.Sprint(got) != fmt.Sprint([]uint64{gi64, unlimited}) {
		t.Errorf("adjustment %v, want 64Gi/unlimited", got)
	}
}

// TestNRIRuntimeRestarts: the plugin waits for a runtime that is not there yet, and connects
// again after the runtime crashes (SIGKILL) and after it stops cleanly; the next container is
// adjusted each time.
func TestNRIRuntimeRestarts(t *testing.T) {
	socket := filepath.Join(socketDir(t), "nri.sock")
	plugin := startPlugin(t, socket)
	if line, _ := plugin.log.wait(regexp.MustCompile(`waiting for the runtime's NRI socket`), 0, deadline); line == "" {
		t.Fatal("the plugin did not say it waits for the socket")
	}
	runtime := startRuntime(t, socket, 0)
	runtime.waitAdded(1)
	if got := runtime.create("first", uverbsDP, nil, nil); got == nil {
		t.Error("first runtime: not adjusted")
	}

	runtime.kill()
	runtime = startRuntime(t, socket, 0)
	runtime.waitAdded(1)
	if got := runtime.create("after-crash", uverbsDP, nil, nil); got == nil {
		t.Error("after the runtime crashed: not adjusted")
	}

	runtime.stop()
	runtime = startRuntime(t, socket, 0)
	runtime.waitAdded(1)
	if got := runtime.create("after-stop", uverbsDP, nil, nil); got == nil {
		t.Error("after the runtime stopped: not adjusted")
	}
	expectSample(t, plugin.scrape(), "rdma_device_plugin_nri_registrations_total 3")
}

// TestNRIContainersAreCreatedWithoutThePlugin: a killed plugin never stops containers from
// being created; a restarted one registers and adjusts again.
func TestNRIContainersAreCreatedWithoutThePlugin(t *testing.T) {
	socket := filepath.Join(socketDir(t), "nri.sock")
	runtime := startRuntime(t, socket, 0)
	plugin := startPlugin(t, socket)
	runtime.waitAdded(1)
	plugin.kill()
	if got := runtime.create("while-gone", uverbsDP, nil, nil); got != nil {
		t.Errorf("adjusted %v with the plugin killed", got)
	}
	startPlugin(t, socket)
	runtime.waitAdded(2)
	if got := runtime.create("after-restart", uverbsDP, nil, nil); got == nil {
		t.Error("the restarted plugin did not adjust")
	}
}

// TestNRITwoInstancesOnANode: two instances on one node (pods of both DaemonSets while a
// relabelled node swaps them) are harmless when configured alike: the runtime calls them in turn
// and hands the second the container as the first adjusted it, so the second leaves the limit
// alone. (Two that set different limits both claim RLIMIT_MEMLOCK, and the runtime refuses the
// container: docs/nri.md says to keep --memlock one value per cluster.)
func TestNRITwoInstancesOnANode(t *testing.T) {
	socket := filepath.Join(socketDir(t), "nri.sock")
	runtime := startRuntime(t, socket, 0)
	first := startPlugin(t, socket)
	runtime.waitAdded(1)
	second := startPlugin(t, socket)
	runtime.waitAdded(2)
	if got := runtime.create("both-running", uverbsDP, nil, nil); fmt.Sprint(got) != fmt.Sprint([]uint64{unlimited, unlimited}) {
		t.Errorf("with two instances: adjustment %v, want unlimited/unlimited", got)
	}
	// Each instance logs the container once, raised or left alone, after it answered the
	// runtime: both lines are awaited before the raises are counted.
	decided := regexp.MustCompile(`container ml/trainer-0/both-running \(`)
	for _, p := range []*pluginProc{first, second} {
		if line, _ := p.log.wait(decided, 0, deadline); line == "" {
			t.Errorf("an instance logged nothing of both-running within %v", deadline)
		}
	}
	logged := regexp.MustCompile(`raised RLIMIT_MEMLOCK of container ml/trainer-0/both-running `)
	if n := first.log.count(logged) + second.log.count(logged); n != 1 {
		t.Errorf("%d instances raised the limit, want 1", n)
	}
	first.kill()
	if got := runtime.create("second-only", uverbsDP, nil, nil); got == nil {
		t.Error("the second instance did not adjust after the first exited")
	}

	// Configured apart: the runtime's conflict, which the docs warn about.
	socket = filepath.Join(socketDir(t), "nri.sock")
	runtime = startRuntime(t, socket, 0)
	startPlugin(t, socket, "--memlock=64Gi", "--nri-plugin-index=10")
	startPlugin(t, socket)
	runtime.waitAdded(2)
	reply := runtime.do(runtimeCommand{Op: "create", Name: "two-limits", Devices: uverbsDP}, false)
	if !strings.Contains(reply.Error, "both tried to set") {
		t.Errorf("two instances with different limits: the runtime answered %+v, want its conflict error", reply)
	}
}

// TestNRIBadFlags: a bad value exits 2 naming the flag, before any connection.
func TestNRIBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--memlock", "0"}, "--memlock"},
		{[]string{"--memlock", "lots"}, "--memlock"},
		{[]string{"--nri-plugin-index", "5"}, "--nri-plugin-index"},
		{[]string{"--nri-plugin-name", "a/b"}, "--nri-plugin-name"},
		{[]string{"--nri-socket", "/" + strings.Repeat("x", 120)}, "--nri-socket"},
	} {
		cmd := exec.Command(binary(t), append([]string{"nri"}, c.args...)...)
		out, err := cmd.CombinedOutput()
		code := -1
		if exit, ok := err.(*exec.ExitError); ok {
			code = exit.ExitCode()
		}
		if code != 2 || !strings.Contains(string(out), c.flag) {
			t.Errorf("nri %v: exit %d, output %q; want 2 naming %s", c.args, code, out, c.flag)
		}
	}
}
