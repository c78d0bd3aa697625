// Package nri drives the built `rdma-device-plugin nri` with the container runtime's side of NRI
// as containerd 2.4.2 runs it: github.com/containerd/nri's adaptation (v0.12.3, pinned in
// ../go.mod) listening on a real unix socket in a temp dir. No containerd and no root needed.
//
// The runtime runs in a child process (this test binary re-executed with $RDP_NRI_RUNTIME set),
// so that "containerd restarts" is what it is on a node: the process dies, the plugin's
// connection ends, a new process makes the socket again. The test talks to the child through its
// stdin and stdout, one JSON object per line (runtimeCommand, runtimeReply).
package nri

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"
)

// Environment of the runtime child.
const (
	runtimeSocketEnv   = "RDP_NRI_RUNTIME"          // the socket to listen on; set: we are the child
	runtimeExistingEnv = "RDP_NRI_RUNTIME_EXISTING" // containers to report at Synchronize
)

// runtimeCommand is one request to the runtime child.
type runtimeCommand struct {
	Op string `json:"op"` // "wait", "create", "start", "invocations"

	Plugins   int   `json:"plugins,omitempty"`    // wait: until this many plugins were added
	TimeoutMs int64 `json:"timeout_ms,omitempty"` // wait: give up after this long

	Name    string   `json:"name,omitempty"`    // create/start: the container
	Devices []string `json:"devices,omitempty"` // create: its Linux device nodes
	CDI     []string `json:"cdi,omitempty"`     // create: its CDI devices
	// create: the RLIMIT_MEMLOCK {soft, hard} its spec already has, if any.
	Memlock []uint64 `json:"memlock,omitempty"`
}

// runtimeReply answers one runtimeCommand.
type runtimeReply struct {
	Error       string             `json:"error,omitempty"`
	Plugins     int                `json:"plugins"`               // connected now
	Added       int                `json:"added"`                 // plugins connected and synchronized so far
	Rlimits     []*api.POSIXRlimit `json:"rlimits,omitempty"`     // create: the adjustment's
	LatencyUs   int64              `json:"latency_us,omitempty"`  // create: the runtime's call
	Invocations []string           `json:"invocations,omitempty"` // "<plugin> <operation>"
}

// runtimeMetrics is the adaptation's Metrics: the plugin count and every plugin invocation; and
// the plugins added: the runtime logs "plugin %q connected and synchronized" once a plugin is in
// the list its calls go through (its count cannot say it: a closed plugin leaves the count only
// at the runtime's next call).
type runtimeMetrics struct {
	mu          sync.Mutex
	changed     *sync.Cond
	plugins     int
	added       int
	invocations []string
}

func (m *runtimeMetrics) RecordPluginInvocation(plugin, op string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	entry := plugin + " " + op
	if err != nil {
		entry += " error: " + err.Error()
	}
	m.invocations = append(m.invocations, entry)
}
func (m *runtimeMetrics) RecordPluginLatency(string, string, time.Duration) {}
func (m *runtimeMetrics) RecordPluginAdjustments(string, string, *adaptation.ContainerAdjustment, int, int) {
}
func (m *runtimeMetrics) UpdatePluginCount(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.plugins = n
	m.changed.Broadcast()
}

// Levels and Fire make runtimeMetrics a logrus hook: the runtime's "connected and synchronized".
func (m *runtimeMetrics) Levels() []logrus.Level { return logrus.AllLevels }
func (m *runtimeMetrics) Fire(e *logrus.Entry) error {
	if strings.HasSuffix(e.Message, "connected and synchronized") {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.added++
		m.changed.Broadcast()
	}
	return nil
}

// waitAdded blocks until at least n plugins were added, or the timeout passes.
func (m *runtimeMetrics) waitAdded(n int, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.changed.Broadcast()
	})
	defer timer.Stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.added < n && time.Now().Before(deadline) {
		m.changed.Wait()
	}
	return m.added
}

// existingContainers makes n containers for Synchronize, ten per pod, every tenth with an HCA,
// each carrying an annotation of ~200 bytes: 30000 of them exceed ttrpc's 4 MiB, and the runtime
// splits the synchronization into parts (SynchronizeRequest.more). (Ten per pod as on a node: the
// runtime's split scales the pods and the containers per part by the same factor, and one pod
// with thousands of containers rounds the pods to zero and never ends.)
func existingContainers(n int) ([]*api.PodSandbox, []*api.Container) {
	var pods []*api.PodSandbox
	var containers []*api.Container
	for i := 0; i < n; i++ {
		if i%10 == 0 {
			id := fmt.Sprintf("pod-existing-%05d", i/10)
			pods = append(pods, &api.PodSandbox{Id: id, Name: id, Namespace: "default", Uid: "uid-" + id})
		}
		c := &api.Container{
			Id:           fmt.Sprintf("existing-%06d", i),
			PodSandboxId: pods[len(pods)-1].Id,
			Name:         fmt.Sprintf("c%d", i),
			State:        api.ContainerState_CONTAINER_RUNNING,
			Annotations:  map[string]string{"filler": strings.Repeat("x", 200)},
			Linux:        &api.LinuxContainer{},
		}
		if i%10 == 0 {
			c.Linux.Devices = []*api.LinuxDevice{{Path: "/dev/infiniband/uverbs0", Type: "c", Major: 231, Minor: 192}}
		}
		containers = append(containers, c)
	}
	return pods, containers
}

// RuntimeMain runs the runtime child: the adaptation on $RDP_NRI_RUNTIME, commands from stdin.
// It returns the process's exit code.
func RuntimeMain() int {
	socket := os.Getenv(runtimeSocketEnv)
	var existing int
	fmt.Sscan(os.Getenv(runtimeExistingEnv), &existing)
	pods, containers := existingContainers(existing)
	empty, err := os.MkdirTemp("", "rdpt-nri-plugins-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(empty)

	m := &runtimeMetrics{}
	m.changed = sync.NewCond(&m.mu)
	logrus.AddHook(m)
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, pods, containers)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	r, err := adaptation.New("containerd", "v2.4.2", syncFn, update,
		adaptation.WithSocketPath(socket),
		adaptation.WithPluginPath(filepath.Join(empty, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(empty, "conf.d")),
		adaptation.WithMetrics(m))
	if err == nil {
		err = r.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "runtime:", err)
		return 1
	}
	defer r.Stop()

	out := json.NewEncoder(os.Stdout)
	out.Encode(runtimeReply{}) // ready: listening
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var cmd runtimeCommand
		if err := json.Unmarshal(in.Bytes(), &cmd); err != nil {
			out.Encode(runtimeReply{Error: err.Error()})
			continue
		}
		out.Encode(serve(r, m, cmd))
	}
	return 0
}

func serve(r *adaptation.Adaptation, m *runtimeMetrics, cmd runtimeCommand) runtimeReply {
	ctx := context.Background()
	pod := &api.PodSandbox{Id: "pod-1", Name: "trainer-0", Namespace: "ml", Uid: "uid-1"}
	ctr := &api.Container{
		Id:           "ctr-" + cmd.Name,
		PodSandboxId: pod.Id,
		Name:         cmd.Name,
		State:        api.ContainerState_CONTAINER_CREATED,
		Linux:        &api.LinuxContainer{},
	}
	for _, path := range cmd.Devices {
		ctr.Linux.Devices = append(ctr.Linux.Devices, &api.LinuxDevice{Path: path, Type: "c", Major: 231})
	}
	for _, name := range cmd.CDI {
		ctr.CDIDevices = append(ctr.CDIDevices, &api.CDIDevice{Name: name})
	}
	if len(cmd.Memlock) == 2 {
		ctr.Rlimits = []*api.POSIXRlimit{{Type: "RLIMIT_MEMLOCK", Soft: cmd.Memlock[0], Hard: cmd.Memlock[1]}}
	}
	var reply runtimeReply
	switch cmd.Op {
	case "wait":
		m.waitAdded(cmd.Plugins, time.Duration(cmd.TimeoutMs)*time.Millisecond)
	case "create":
		start := time.Now()
		resp, err := r.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr})
		reply.LatencyUs = time.Since(start).Microseconds()
		if err != nil {
			reply.Error = err.Error()
		} else if resp.GetAdjust() != nil {
			reply.Rlimits = resp.GetAdjust().GetRlimits()
		}
	case "start":
		// An event the plugin did not subscribe to: the runtime must not call it.
		if err := r.StartContainer(ctx, &api.StartContainerRequest{Pod: pod, Container: ctr}); err != nil {
			reply.Error = err.Error()
		}
		if _, err := r.UpdateContainer(ctx, &api.UpdateContainerRequest{Pod: pod, Container: ctr}); err != nil {
			reply.Error = err.Error()
		}
		if err := r.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: ctr}); err != nil {
			reply.Error = err.Error()
		}
	case "invocations":
	default:
		reply.Error = "unknown op " + cmd.Op
	}
	m.mu.Lock()
	reply.Plugins = m.plugins
	reply.Added = m.added
	reply.Invocations = append([]string(nil), m.invocations...)
	m.mu.Unlock()
	return reply
}
