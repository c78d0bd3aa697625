package kubelet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// The kubelet's own plugin manager (plugin watcher + reconciler) with the kubelet's DRA plugin
// handler registers our binary from its registration socket in plugins_registry/, and the
// kubelet's DRA gRPC client (the one NodePrepareResources goes through at pod start) calls it:
//   - a claim prepared before (by `dra prepare-local`, the driver's own Prepare, so it is in the
//     checkpoint) is answered from the checkpoint with its CDI device ID, without an API server;
//   - a claim the driver does not know gets a per-claim error naming the API server (this build
//     has no API client yet), every claim of the request is answered;
//   - NodeUnprepareResources removes the prepared claim's CDI spec, and succeeds for an unknown
//     claim;
//   - its registration socket removed, and a kubelet restart that wipes plugins_registry/ and
//     plugins/, get the driver registered again (our binary re-creates its sockets).
func TestDRAKubeletPluginManager(t *testing.T) {
	bin, dir, n, sys := draDriverFixture(t)
	ib, _ := usableHCAs(n)
	if len(ib) == 0 {
		t.Fatalf("%s: no usable HCA", n.XML)
	}
	kubeletDir, cdiRoot := filepath.Join(dir, "kubelet"), filepath.Join(dir, "cdi")
	regDir := mkdir(t, filepath.Join(kubeletDir, "plugins_registry"))
	args := draArgs(kubeletDir, cdiRoot, sys, n)

	// A claim prepared before the driver (re)started: in its checkpoint, with its CDI spec.
	const known = "3c1e9a6d-0000-4000-8000-00000000c0de"
	specFile := filepath.Join(cdiRoot, DRADriver+"-hca_"+known+".json")
	local := append(append([]string{"dra", "prepare-local"}, args...),
		"--claim-uid", known, "--claim-namespace", "ns", "--claim-name", "prepared",
		"--device", DRADeviceName(ib[0]))
	if out, err := exec.Command(bin, local...).CombinedOutput(); err != nil {
		t.Fatalf("prepare-local: %v\n%s", err, out)
	}
	if _, err := os.Stat(specFile); err != nil {
		t.Fatal(err)
	}

	draSocket := filepath.Join(kubeletDir, "plugins", DRADriver, "dra.sock")
	p, err := StartPlugin(bin, draSocket, filepath.Join(dir, "plugin.log"), append([]string{"dra"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("driver stop: %v", err)
		}
		if t.Failed() {
			data, _ := os.ReadFile(filepath.Join(dir, "plugin.log"))
			t.Logf("---- plugin.log (last lines) ----\n%s", tail(string(data), 60))
		}
	})

	// The kubelet's side, as the kubelet wires it: the DRA manager as the plugin manager's
	// handler for "DRAPlugin" sockets in plugins_registry/.
	logFile, err := os.Create(filepath.Join(dir, "kubelet.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	e := &Env{T: t, logFile: logFile}
	ctx := klog.NewContext(context.Background(), e.logger())
	var draManager *draplugin.DRAPluginManager
	stopKubelet := func() {}
	startKubelet := func() {
		kctx, cancel := context.WithCancel(ctx)
		draManager = draplugin.NewDRAPluginManager(kctx, nil, nil, nil, 30*time.Second)
		pm := pluginmanager.NewPluginManager(regDir, record.NewFakeRecorder(100))
		pm.AddHandler(registerapi.DRAPlugin, draManager)
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			pm.Run(kctx, config.NewSourcesReady(func(sets.Set[string]) bool { return true }), stop)
		}()
		stopKubelet = func() {
			close(stop)
			<-done
			cancel()
			draManager.Stop()
		}
	}
	startKubelet()
	defer func() { stopKubelet() }()

	const registered = "registered DRA driver " + DRADriver + " with the kubelet"
	if err := p.WaitLog(registered, 1, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	plugin, err := draManager.GetPlugin(DRADriver)
	if err != nil {
		t.Fatal(err)
	}

	call := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		t.Cleanup(cancel)
		return c
	}
	const unknown = "8d2f0000-0000-4000-8000-0000000000ff"
	resp, err := plugin.NodePrepareResources(call(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{
		{Namespace: "ns", Uid: known, Name: "prepared"},
		{Namespace: "ns", Uid: unknown, Name: "new"},
	}})
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	if len(resp.Claims) != 2 {
		t.Fatalf("%d claims answered, want 2: %v", len(resp.Claims), resp)
	}
	k := resp.Claims[known]
	if k.GetError() != "" || len(k.GetDevices()) != 1 {
		t.Fatalf("prepared claim: %v", k)
	}
	d := k.Devices[0]
	if d.PoolName != "fixture-node" || d.DeviceName != DRADeviceName(ib[0]) ||
		strings.Join(d.CdiDeviceIds, ",") != DRADriver+"/hca="+known+"-hca,"+DRADriver+"/hca="+known+"_hca" ||
		strings.Join(d.RequestNames, ",") != "hca" || d.ShareId != nil {
		t.Errorf("prepared claim's device %v", d)
	}
	if u := resp.Claims[unknown]; u.GetError() == "" || !strings.Contains(u.GetError(), "API server") ||
		len(u.GetDevices()) != 0 {
		t.Errorf("claim unknown to the driver, no API server: %v; want an error naming the API server", u)
	}

	uresp, err := plugin.NodeUnprepareResources(call(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{
		{Namespace: "ns", Uid: known, Name: "prepared"},
		{Namespace: "ns", Uid: unknown, Name: "new"},
	}})
	if err != nil {
		t.Fatalf("NodeUnprepareResources: %v", err)
	}
	if len(uresp.Claims) != 2 || uresp.Claims[known].GetError() != "" || uresp.Claims[unknown].GetError() != "" {
		t.Errorf("unprepare: %v; want both claims, no error", uresp)
	}
	if _, err := os.Stat(specFile); !os.IsNotExist(err) {
		t.Errorf("CDI spec %s after unprepare: %v", specFile, err)
	}

	// Our registration socket removed under a running kubelet: the watcher unregisters the
	// driver, the driver serves the socket again, the watcher registers it again.
	start := time.Now()
	if err := os.Remove(filepath.Join(regDir, DRADriver+"-reg.sock")); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitLog(registered, 2, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("registered again %v after the socket was removed", time.Since(start).Round(time.Millisecond))

	// A kubelet restart, the worst case: its plugin directories wiped before the new kubelet's
	// plugin manager starts. The driver serves both sockets again and the new kubelet registers
	// it, and calls it.
	stopKubelet()
	start = time.Now()
	// Each directory moved away at once, then removed: the driver re-creates it meanwhile.
	for i, d := range []string{regDir, filepath.Join(kubeletDir, "plugins")} {
		gone := filepath.Join(dir, fmt.Sprintf("wiped-%d", i))
		if err := os.Rename(d, gone); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(gone); err != nil {
			t.Fatal(err)
		}
	}
	// Both served again, the registration socket last (then the new kubelet finds the endpoint
	// it is told about).
	Eventually(t, 15*time.Second, "the DRA socket and then the registration socket served again", func() (bool, string) {
		lines := p.Lines("dra: serving ")
		return len(p.Lines("dra: serving DRAPlugin")) >= 2 && len(lines) > 0 &&
			strings.Contains(lines[len(lines)-1], "serving Registration"), strings.Join(lines, "\n")
	})
	startKubelet()
	if err := p.WaitLog(registered, 3, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("registered with the restarted kubelet %v after the wipe", time.Since(start).Round(time.Millisecond))
	plugin, err = draManager.GetPlugin(DRADriver)
	if err != nil {
		t.Fatal(err)
	}
	uresp, err = plugin.NodeUnprepareResources(call(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{
		{Namespace: "ns", Uid: unknown, Name: "new"},
	}})
	if err != nil || uresp.Claims[unknown].GetError() != "" {
		t.Errorf("unprepare after the kubelet restart: %v, %v", uresp, err)
	}
}

// TestDRAKubeletHandover: a DaemonSet upgrade with maxSurge, as the kubelet's own plugin manager
// and DRA client see it. A claim is prepared; the old driver is registered; the new one starts on
// the same node and asks for the plugin directory; the old one hands over (its sockets go: the
// plugin watcher unregisters it) and idles; the new one registers and answers the prepared claim
// from the checkpoint (no API server runs here: it could not have read it); stopping the old one afterwards (the
// DaemonSet controller deleting its pod) leaves the new one registered and serving. Before the
// handover the new instance waited for the old one to exit, which under maxSurge never came.
func TestDRAKubeletHandover(t *testing.T) {
	bin, dir, n, sys := draDriverFixture(t)
	ib, _ := usableHCAs(n)
	if len(ib) == 0 {
		t.Fatalf("%s: no usable HCA", n.XML)
	}
	kubeletDir, cdiRoot := filepath.Join(dir, "kubelet"), filepath.Join(dir, "cdi")
	regDir := mkdir(t, filepath.Join(kubeletDir, "plugins_registry"))
	args := draArgs(kubeletDir, cdiRoot, sys, n)
	const known = "3c1e9a6d-0000-4000-8000-0000000ba5e0"
	local := append(append([]string{"dra", "prepare-local"}, args...),
		"--claim-uid", known, "--claim-namespace", "ns", "--claim-name", "prepared",
		"--device", DRADeviceName(ib[0]))
	if out, err := exec.Command(bin, local...).CombinedOutput(); err != nil {
		t.Fatalf("prepare-local: %v\n%s", err, out)
	}

	draSocket := filepath.Join(kubeletDir, "plugins", DRADriver, "dra.sock")
	start := func(name string) *Plugin {
		p, err := StartPlugin(bin, draSocket, filepath.Join(dir, name+".log"), append([]string{"dra"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := p.Stop(); err != nil {
				t.Errorf("%s driver stop: %v", name, err)
			}
			if t.Failed() {
				data, _ := os.ReadFile(filepath.Join(dir, name+".log"))
				t.Logf("---- %s.log (last lines) ----\n%s", name, tail(string(data), 40))
			}
		})
		return p
	}
	oldDriver := start("old")

	logFile, err := os.Create(filepath.Join(dir, "kubelet.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	e := &Env{T: t, logFile: logFile}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), e.logger()))
	draManager := draplugin.NewDRAPluginManager(ctx, nil, nil, nil, 30*time.Second)
	pm := pluginmanager.NewPluginManager(regDir, record.NewFakeRecorder(100))
	pm.AddHandler(registerapi.DRAPlugin, draManager)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		pm.Run(ctx, config.NewSourcesReady(func(sets.Set[string]) bool { return true }), stop)
	}()
	defer func() {
		close(stop)
		<-done
		cancel()
		draManager.Stop()
	}()

	const registered = "registered DRA driver " + DRADriver + " with the kubelet"
	if err := oldDriver.WaitLog(registered, 1, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	prepare := func(what string) {
		t.Helper()
		plugin, err := draManager.GetPlugin(DRADriver)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		c, cancelCall := context.WithTimeout(ctx, 10*time.Second)
		defer cancelCall()
		resp, err := plugin.NodePrepareResources(c, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{
			{Namespace: "ns", Uid: known, Name: "prepared"}}})
		if err != nil {
			t.Fatalf("%s: NodePrepareResources: %v", what, err)
		}
		if r := resp.Claims[known]; r.GetError() != "" || len(r.GetDevices()) != 1 ||
			r.Devices[0].DeviceName != DRADeviceName(ib[0]) {
			t.Fatalf("%s: prepared claim answered %v", what, r)
		}
	}
	prepare("the old driver")

	began := time.Now()
	newDriver := start("new")
	if err := oldDriver.WaitLog("handed over in", 1, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	handed := time.Now()
	if err := newDriver.WaitLog(registered, 1, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	// The gap: from the old driver's sockets going to the new one registered (mostly the plugin
	// manager's reconcile period, once to unregister and once to register).
	t.Logf("the new driver started %v before the old one handed over (%s); registered %v after that",
		handed.Sub(began).Round(time.Millisecond), strings.Join(oldDriver.Lines("handed over in"), ""),
		time.Since(handed).Round(time.Millisecond))
	if err := oldDriver.WaitLog("waiting to be stopped", 1, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if oldDriver.Exited() {
		t.Error("the old driver exited after handing over: the kubelet would restart it")
	}
	Eventually(t, 15*time.Second, "the kubelet's client reaches the new driver", func() (bool, string) {
		plugin, err := draManager.GetPlugin(DRADriver)
		if err != nil {
			return false, err.Error()
		}
		c, cancelCall := context.WithTimeout(ctx, 5*time.Second)
		defer cancelCall()
		resp, err := plugin.NodePrepareResources(c, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{
			{Namespace: "ns", Uid: known, Name: "prepared"}}})
		if err != nil {
			return false, err.Error()
		}
		return resp.Claims[known].GetError() == "", resp.String()
	})

	// The DaemonSet controller deletes the old pod: the new driver stays registered and serving.
	if err := oldDriver.Stop(); err != nil {
		t.Fatalf("old driver: %v", err)
	}
	if _, err := os.Stat(filepath.Join(regDir, DRADriver+"-reg.sock")); err != nil {
		t.Errorf("the new driver's registration socket after the old one stopped: %v", err)
	}
	prepare("the new driver, the old one gone")
	if newDriver.Exited() {
		t.Error("the new driver exited")
	}
}
