package kubelet

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// ResourceHCA is what our plugin advertises.
const ResourceHCA = "rdma/hca"

// Env is one node under test: the fixture, a kubelet, the GPU plugin and our plugin.
type Env struct {
	T       *testing.T
	Binary  string
	Dir     string
	Node    *Node
	Sys     *Sysfs
	Kubelet *Kubelet
	GPU     *GPUPlugin
	Plugin  *Plugin
	Tap     *Tap
	Opts    EnvOptions

	logFile *os.File
}

// EnvOptions chooses the kubelet's policy and scope and how our plugin runs.
type EnvOptions struct {
	Policy, Scope string
	Mode          string   // shared or exclusive; "" starts no plugin
	Tap           bool     // record kubelet <-> plugin traffic (see Tap)
	TapMode       TapMode  // with Tap: who answers GetPreferredAllocation (default: our plugin)
	PackGPUs      bool     // the GPU plugin answers GetPreferredAllocation (PackGPUs)
	XML           string   // the node's hwloc export; default dgx-h100-like
	NamedNode     string   // instead of XML: a node the binary lays out by name (dgx-roles)
	Extra         []string // more flags for serve
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// fixtureXML is the node every test runs on: 2 NUMA nodes, 8 GPUs, 9 HCAs.
func fixtureXML() string { return filepath.Join(repoRoot(), "test", "data", "dgx-h100-like.xml") }

func binaryPath() string {
	if bin := os.Getenv("RDP_BINARY"); bin != "" {
		return bin
	}
	return filepath.Join(repoRoot(), "build", "cmd", "rdma-device-plugin")
}

// pluginBinary returns $RDP_BINARY (run.sh sets it) or skips the test.
func pluginBinary(t *testing.T) string {
	t.Helper()
	bin := binaryPath()
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no plugin binary at %s (set RDP_BINARY)", bin)
	}
	out, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
	if !strings.Contains(string(out), "--pod-resources-socket") {
		t.Skipf("%s has no `serve --pod-resources-socket`: build the server first", bin)
	}
	return bin
}

// NewEnv lays out the fixture and starts a kubelet, the GPU plugin and (when opts.Mode is
// set) our plugin, and waits until the kubelet lists both resources. Everything stops at the
// end of the test. Call Isolate first.
func NewEnv(t *testing.T, opts EnvOptions) *Env {
	t.Helper()
	if os.Getenv(isolatedEnv) == "" {
		t.Fatal("NewEnv outside an isolated test: call Isolate(t) first")
	}
	if opts.Policy == "" {
		opts.Policy = "none"
	}
	e := &Env{T: t, Dir: shortTempDir(t), Opts: opts}
	err := e.layOut()
	if err != nil {
		t.Fatal(err)
	}
	if e.logFile, err = os.Create(filepath.Join(e.Dir, "kubelet.log")); err != nil {
		t.Fatal(err)
	}
	// Components that log through klog's global logger (the registration server) write there too.
	klog.SetLogger(e.logger())
	t.Cleanup(func() { e.stopAll() })
	e.StartKubelet(nil)
	e.GPU = NewGPUPlugin(e.Node)
	e.GPU.Pack = opts.PackGPUs
	if err := e.GPU.Start(); err != nil {
		t.Fatal(err)
	}
	e.WaitCapacity(GPUResource, int64(len(e.Node.GPUs)), int64(len(e.Node.GPUs)), 10*time.Second)
	if opts.Tap {
		if e.Tap, err = StartTap(mkdir(t, filepath.Join(e.Dir, "tap"))); err != nil {
			t.Fatal(err)
		}
		e.Tap.SetMode(opts.TapMode)
	}
	if opts.Mode != "" {
		e.StartPlugin(opts.Mode, opts.Extra...)
		want := int64(1000)
		if opts.Mode == "exclusive" {
			want = int64(len(e.Node.HCAs))
		}
		e.WaitCapacity(ResourceHCA, want, want, 15*time.Second)
	}
	return e
}

// layOut lays the node of e.Opts out under <Dir>/node and sets e.Node, e.Sys and e.Opts.XML: a
// named node by the binary, else the export (default dgx-h100-like) by the binary when it can,
// by the harness when it cannot or when RDP_FIXTURE=go.
func (e *Env) layOut() error {
	root := filepath.Join(e.Dir, "node")
	bin := binaryPath()
	var err error
	if e.Opts.NamedNode != "" {
		if !BinaryWritesFixtures(bin) {
			e.T.Skipf("%s has no `fixture` subcommand to lay out node %s", bin, e.Opts.NamedNode)
		}
		if e.Node, e.Sys, err = WriteNamedNodeWithBinary(bin, e.Opts.NamedNode, root); err == nil {
			e.Opts.XML = e.Node.XML
		}
		return err
	}
	if e.Opts.XML == "" {
		e.Opts.XML = fixtureXML()
	}
	if e.Node, err = LoadNode(e.Opts.XML); err != nil {
		return err
	}
	if os.Getenv("RDP_FIXTURE") != "go" && BinaryWritesFixtures(bin) {
		e.Sys, err = WriteSysfsWithBinary(bin, root, e.Node)
	} else {
		e.Sys, err = WriteSysfs(root, e.Node)
	}
	return err
}

// shortTempDir is a temp dir whose name does not grow with the test's: the plugin serves unix
// sockets below it (a path has at most 107 bytes), and t.TempDir keeps up to 64 bytes of a
// subtest's name.
func shortTempDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "rdp-kt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(d); err != nil {
			t.Errorf("removing %s: %v", d, err)
		}
	})
	return d
}

func mkdir(t *testing.T, d string) string {
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// Logger writes the kubelet's logs (verbosity 4) to kubelet.log in the test's directory.
func (e *Env) logger() logr.Logger {
	f := e.logFile
	return funcr.New(func(prefix, args string) {
		fmt.Fprintf(f, "%s %s %s\n", time.Now().Format("15:04:05.000000"), prefix, args)
	}, funcr.Options{Verbosity: 4})
}

// StartKubelet starts a kubelet on the node (pods: those of a previous kubelet, or none).
func (e *Env) StartKubelet(pods *PodStore) {
	e.T.Helper()
	k, err := StartKubelet(KubeletConfig{Policy: e.Opts.Policy, Scope: e.Opts.Scope,
		NUMANodes: e.Node.NUMANodes, PodResourcesSocket: filepath.Join(e.Dir, "pod-resources.sock"),
		Pods: pods, Logger: e.logger()})
	if err != nil {
		e.T.Fatal(err)
	}
	e.Kubelet = k
}

// StartPlugin starts our binary in a mode; it replaces e.Plugin.
func (e *Env) StartPlugin(mode string, extra ...string) *Plugin {
	e.T.Helper()
	e.Binary = pluginBinary(e.T)
	dir, socket := PluginDir, filepath.Join(PluginDir, "rdma-hca.sock")
	if e.Tap != nil {
		dir, socket = e.Tap.Dir, filepath.Join(e.Tap.Dir, "rdma-hca.sock")
	}
	args := ServeArgs(mode, dir, filepath.Join(e.Dir, "pod-resources.sock"), e.Sys, e.Node, extra...)
	p, err := StartPlugin(e.Binary, socket, filepath.Join(e.Dir, "plugin.log"), args...)
	if err != nil {
		e.T.Fatal(err)
	}
	e.Plugin = p
	return p
}

func (e *Env) stopAll() {
	if e.Plugin != nil {
		if err := e.Plugin.Stop(); err != nil {
			e.T.Errorf("plugin stop: %v", err)
		}
	}
	if e.Tap != nil {
		e.Tap.Stop()
	}
	if e.GPU != nil {
		e.GPU.Stop()
	}
	if e.Kubelet != nil {
		e.Kubelet.Stop()
	}
	if e.T.Failed() {
		for _, name := range []string{"plugin.log", "kubelet.log"} {
			data, _ := os.ReadFile(filepath.Join(e.Dir, name))
			e.T.Logf("---- %s (last lines) ----\n%s", name, tail(string(data), 60))
		}
	}
	e.logFile.Close()
}

// Eventually polls cond every 20 ms until it holds or timeout passes; cond's message says
// what was seen last.
func Eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last seen: %s", what, timeout, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitCapacity waits until the kubelet reports a resource's capacity and allocatable.
func (e *Env) WaitCapacity(resource string, capacity, allocatable int64, timeout time.Duration) {
	e.T.Helper()
	Eventually(e.T, timeout, fmt.Sprintf("%s capacity %d allocatable %d", resource, capacity, allocatable),
		func() (bool, string) {
			c, a := e.Kubelet.Capacity(resource)
			return c == capacity && a == allocatable, fmt.Sprintf("capacity %d allocatable %d", c, a)
		})
}

var podSeq atomic.Int64

// Ctr is one container of a test pod: a name and extended-resource limits.
type Ctr struct {
	Name   string
	Limits map[string]int64
	Init   bool // an init container (runs to completion before the others)
}

// NewPod builds a pod whose containers ask for extended resources (requests = limits).
func NewPod(name string, containers ...Ctr) *v1.Pod {
	n := podSeq.Add(1)
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
		UID: types.UID(fmt.Sprintf("%s-uid-%d", name, n))}}
	for _, c := range containers {
		rl := v1.ResourceList{}
		for r, q := range c.Limits {
			rl[v1.ResourceName(r)] = *resource.NewQuantity(q, resource.DecimalSI)
		}
		ctr := v1.Container{Name: c.Name, Image: "example/rdma:1",
			Resources: v1.ResourceRequirements{Limits: rl, Requests: rl}}
		if c.Init {
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, ctr)
		} else {
			pod.Spec.Containers = append(pod.Spec.Containers, ctr)
		}
	}
	// The kubelet gets pods decoded from the API server's JSON, whose map keys are sorted; that
	// insertion order is the order the device manager usually walks a container's limits in
	// (see docs/conformance.md). Decode the same way.
	data, err := json.Marshal(pod)
	if err != nil {
		panic(err)
	}
	decoded := &v1.Pod{}
	if err := json.Unmarshal(data, decoded); err != nil {
		panic(err)
	}
	return decoded
}

// MustAdmit admits a pod and fails the test if it is rejected or took 5 s or more (the
// bound the plugin promises: a kubelet call never waits on pod-resources for long).
func (e *Env) MustAdmit(pod *v1.Pod) Admission {
	e.T.Helper()
	a := e.Kubelet.Admit(pod)
	if !a.Admit {
		e.T.Fatalf("pod %s rejected: %s: %s", pod.Name, a.Reason, a.Message)
	}
	if a.Took >= 5*time.Second {
		e.T.Fatalf("admitting %s took %v (bound: 5s)", pod.Name, a.Took)
	}
	return a
}

// AdmitGPUPair admits pod `name` of one container "c" with 1 GPU + 1 HCA (Tap on) and returns
// the one GetPreferredAllocation exchange it caused and the container's GPU; it fails the test
// if there was not exactly one such exchange or GPU.
func (e *Env) AdmitGPUPair(name string) (*Exchange, GPU) {
	e.T.Helper()
	pod := NewPod(name, Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1, GPUResource: 1}})
	before := len(e.Tap.Exchanges())
	e.MustAdmit(pod)
	xs := e.Tap.Exchanges()[before:]
	gpus := e.Kubelet.Devices(pod, "c", GPUResource)
	if len(xs) != 1 || xs[0].GPA == nil || len(gpus) != 1 {
		e.T.Fatalf("%s: exchanges %+v, GPUs %v", name, xs, gpus)
	}
	g, _ := e.Node.GPUByPCI(gpus[0])
	return &xs[0], g
}
