package controlplane

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"

	"github.com/rdma-device-plugin/rdma-device-plugin/test/kubelet"
)

// TestDRALoad measures what DRA drivers cost the API server (docs/dra.md, "API load"). Run by
// hand, not in CI (it takes about a quarter of an hour):
//
//	RDP_DRA_LOAD=1 test/kubelet/run.sh --control-plane -run TestDRALoad -timeout 40m
//
// RDP_DRA_LOAD_NODES (50) driver processes of $RDP_BINARY, one per Node, each registered by a
// kubelet plugin manager of its own, publish the same fixture's HCAs to one kube-apiserver (on
// an embedded etcd, nothing else running against it) through a TCP proxy. Once every node's
// slices are there, the steady state: the server's apiserver_request_total over
// RDP_DRA_LOAD_MINUTES (10) minutes, for the resources the drivers use, per node and hour. Then an
// API server outage as its clients see a restart: the proxy resets every connection and every
// new one for RDP_DRA_LOAD_OUTAGE (60s); after it, the requests until every driver says it is in
// sync again, how long that took, and when the drivers came back (the spread of their first
// successful exchange: lockstep shows as one spike). The figures are logged and written to
// $RDP_DRA_LOAD_OUT (JSON) when set.
func TestDRALoad(t *testing.T) {
	if os.Getenv("RDP_DRA_LOAD") == "" {
		t.Skip("a benchmark run by hand: RDP_DRA_LOAD=1 (docs/dra.md, \"API load\")")
	}
	nodes := kubelet.EnvInt(t, "RDP_DRA_LOAD_NODES", 50)
	window := time.Duration(kubelet.EnvInt(t, "RDP_DRA_LOAD_MINUTES", 10)) * time.Minute
	outage, err := time.ParseDuration(envOr("RDP_DRA_LOAD_OUTAGE", "60s"))
	if err != nil {
		t.Fatal(err)
	}
	cp := startBareAPIServer(t)
	ctx := context.Background()
	proxy := startOutageProxy(t, strings.TrimPrefix(cp.Config.Host, "https://"))
	tokenFile := draServiceAccount(t, cp)
	kubeconfig := writeJSONKubeconfig(t, cp, map[string]any{"tokenFile": tokenFile})
	if err := retargetKubeconfig(kubeconfig, "https://"+proxy.addr()); err != nil {
		t.Fatal(err)
	}
	discovery := draFixtureNode(t, "dgx-h100-like.xml")

	var drivers []*loadDriver
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("load-node-%03d", i)
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		drivers = append(drivers, startLoadDriver(t, name, kubeconfig, discovery))
	}
	start := time.Now()
	waitFor(t, 10*time.Minute, "every node's slices published", func(ctx context.Context) (bool, string, error) {
		list, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		seen := map[string]bool{}
		for _, s := range list.Items {
			if s.Spec.NodeName != nil {
				seen[*s.Spec.NodeName] = true
			}
		}
		return len(seen) == nodes, fmt.Sprintf("%d of %d nodes", len(seen), nodes), nil
	})
	t.Logf("%d drivers published in %v", nodes, time.Since(start).Round(time.Second))

	// Steady state: nothing changes; no request of the test's own in the window but the two
	// scrapes of /metrics (not a resource: not counted).
	before := requestCounts(t, cp)
	conns0 := proxy.accepted()
	time.Sleep(window)
	after := requestCounts(t, cp)
	steady := diffCounts(after, before)
	total := 0
	for _, n := range steady {
		total += n
	}
	perNodeHour := float64(total) / float64(nodes) / window.Hours()
	t.Logf("steady state over %v: %d requests (%v), %.1f per node-hour; %d new connections",
		window, total, steady, perNodeHour, proxy.accepted()-conns0)

	// The outage, then back: requests and time until every driver is in sync again.
	cut := time.Now()
	proxy.setDown(true)
	time.Sleep(outage)
	beforeBack := requestCounts(t, cp)
	proxy.setDown(false)
	back := time.Now()
	var converged []time.Duration
	waitFor(t, 10*time.Minute, "every driver in sync again after the outage", func(context.Context) (bool, string, error) {
		converged = converged[:0]
		for _, d := range drivers {
			if at, ok := d.syncedAfter(cut); ok {
				converged = append(converged, at.Sub(back))
			}
		}
		return len(converged) == nodes, fmt.Sprintf("%d of %d", len(converged), nodes), nil
	})
	last := converged[0]
	for _, c := range converged {
		if c > last {
			last = c
		}
	}
	// Requests from the end of the outage until the last driver was in sync, and a few seconds
	// more for writes in flight.
	time.Sleep(5 * time.Second)
	recovery := diffCounts(requestCounts(t, cp), beforeBack)
	recoveryTotal := 0
	for _, n := range recovery {
		recoveryTotal += n
	}
	sort.Slice(converged, func(i, j int) bool { return converged[i] < converged[j] })
	attempts := proxy.attemptsSince(cut, time.Second)
	t.Logf("outage %v: every driver in sync %v after it ended (min %v, median %v); %d requests (%v); "+
		"connection attempts per second from the cut: %v",
		outage, last.Round(100*time.Millisecond), converged[0].Round(100*time.Millisecond),
		converged[len(converged)/2].Round(100*time.Millisecond), recoveryTotal, recovery, attempts)

	if out := os.Getenv("RDP_DRA_LOAD_OUT"); out != "" {
		var secs []float64
		for _, c := range converged {
			secs = append(secs, c.Seconds())
		}
		b, _ := json.MarshalIndent(map[string]any{
			"binary": draBinary(t), "nodes": nodes, "windowMinutes": window.Minutes(),
			"steadyRequests": steady, "steadyPerNodeHour": perNodeHour,
			"steadyNewConnections": proxy.accepted() - conns0,
			"outageSeconds":        outage.Seconds(), "recoveryRequests": recovery,
			"recoveryTotal": recoveryTotal, "convergedSeconds": secs,
			"attemptsPerSecondFromCut": attempts,
		}, "", "  ")
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Error(err)
		}
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// startBareAPIServer: etcd and the kube-apiserver as Start runs them, and nothing else (no
// controller or scheduler), so that the server's request counts are the drivers'.
func startBareAPIServer(t *testing.T) *ControlPlane {
	t.Helper()
	etcd := testserver.RunEtcd(t, nil)
	prefix := make([]byte, 8)
	if _, err := rand.Read(prefix); err != nil {
		t.Fatal(err)
	}
	storage := storagebackend.NewDefaultConfig("/registry-"+hex.EncodeToString(prefix), nil)
	storage.Transport.ServerList = etcd.Endpoints()
	server, err := kubeapiservertesting.StartTestServer(t,
		&kubeapiservertesting.TestServerInstanceOptions{EnableCertAuth: true, DisableInvariantChecks: true},
		[]string{"--authorization-mode=RBAC"}, storage)
	if err != nil {
		t.Fatalf("kube-apiserver: %v", err)
	}
	t.Cleanup(server.TearDownFn)
	cfg := rest.CopyConfig(server.ClientConfig)
	cfg.QPS, cfg.Burst = -1, 0
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &ControlPlane{Config: cfg, Client: client}
}

// retargetKubeconfig points a JSON kubeconfig's cluster at server.
func retargetKubeconfig(path, server string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		return err
	}
	for _, c := range doc["clusters"].([]any) {
		c.(map[string]any)["cluster"].(map[string]any)["server"] = server
	}
	if b, err = json.Marshal(doc); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

var requestLine = regexp.MustCompile(`^apiserver_request_total\{(.*)\} ([0-9.e+]+)$`)

// requestCounts: the server's apiserver_request_total by "VERB resource" for the resources a
// driver uses.
func requestCounts(t *testing.T, cp *ControlPlane) map[string]int {
	t.Helper()
	raw, err := cp.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	out := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		m := requestLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, kv := range strings.Split(m[1], ",") {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = strings.Trim(v, `"`)
		}
		switch labels["resource"] {
		case "resourceslices", "nodes", "resourceclaims", "pods":
		default:
			continue
		}
		n, _ := strconv.ParseFloat(m[2], 64)
		out[labels["verb"]+" "+labels["resource"]] += int(n)
	}
	return out
}

func diffCounts(after, before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// outageProxy forwards TCP connections to the API server; while down, it resets every
// connection it has and every new one at once, as a restarting server looks to a client.
type outageProxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	down     bool
	conns    map[net.Conn]bool
	attempts []time.Time // every connection accepted
}

func startOutageProxy(t *testing.T, target string) *outageProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &outageProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close() })
	go p.serve()
	return p
}

func (p *outageProxy) addr() string { return p.ln.Addr().String() }

func (p *outageProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.attempts = append(p.attempts, time.Now())
		down := p.down
		if !down {
			p.conns[c] = true
		}
		p.mu.Unlock()
		if down {
			reset(c)
			continue
		}
		go p.forward(c)
	}
}

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // RST, not FIN
	}
	c.Close()
}

func (p *outageProxy) forward(c net.Conn) {
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		c.Close()
	}()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(s, c); done <- struct{}{} }()
	go func() { io.Copy(c, s); done <- struct{}{} }()
	<-done
}

func (p *outageProxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			reset(c)
		}
	}
}

func (p *outageProxy) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.attempts)
}

// attemptsSince: connections accepted per `bucket` from `since` to now.
func (p *outageProxy) attemptsSince(since time.Time, bucket time.Duration) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := int(time.Since(since)/bucket) + 1
	out := make([]int, n)
	for _, a := range p.attempts {
		if a.Before(since) {
			continue
		}
		if i := int(a.Sub(since) / bucket); i < n {
			out[i]++
		}
	}
	for len(out) > 0 && out[len(out)-1] == 0 {
		out = out[:len(out)-1]
	}
	return out
}

// loadDriver: one driver process and the kubelet plugin manager that registers it.
type loadDriver struct {
	log string
}

// The line a driver logs when it is in sync with the API server again after failing.
var syncedAgain = regexp.MustCompile(`^(\S+) .*(ResourceSlices published again after|in sync with the API server again)`)

// syncedAfter: when the driver last said it was in sync again, if after `since`.
func (d *loadDriver) syncedAfter(since time.Time) (time.Time, bool) {
	f, err := os.Open(d.log)
	if err != nil {
		return time.Time{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	var at time.Time
	found := false
	for sc.Scan() {
		m := syncedAgain.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if ts, err := time.Parse(time.RFC3339Nano, m[1]); err == nil && ts.After(since) {
			at, found = ts, true
		}
	}
	return at, found
}

func startLoadDriver(t *testing.T, node, kubeconfig string, discovery []string) *loadDriver {
	t.Helper()
	root := shortDir(t)
	// The kubelet side: a plugin manager with the DRA handler (no API client: it wipes nothing).
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	handler := draplugin.NewDRAPluginManager(ctx, nil, nil, nil, 30*time.Second)
	pm := pluginmanager.NewPluginManager(filepath.Join(root, "plugins_registry"), &record.FakeRecorder{})
	pm.AddHandler(registerapi.DRAPlugin, handler)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pm.Run(ctx, allSourcesReady{}, ctx.Done())
	}()
	p := startDRAProcess(t, append([]string{"dra", "--node-name", node, "--kubeconfig", kubeconfig,
		"--kubelet-dir", root, "--cdi-root", filepath.Join(root, "cdi"), "--log-level", "info"}, discovery...))
	t.Cleanup(func() {
		cancel()
		<-done
		handler.Stop()
	})
	return &loadDriver{log: p.log.Name()}
}
