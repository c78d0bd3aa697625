// Package controlplane runs a real Kubernetes control plane inside a Go test: an embedded etcd
// (k8s.io/apiserver/pkg/storage/etcd3/testserver), the kube-apiserver of the pinned
// k8s.io/kubernetes (cmd/kube-apiserver/app/testing, with its default admission chain: Pod
// Security, ServiceAccount, ...; RBAC authorization), and the controllers a DaemonSet needs: the
// DaemonSet controller, the garbage collector (so that deleting a DaemonSet removes its pods and
// ControllerRevisions), the service-account controller (each namespace's "default") and the
// kube-scheduler with its default profile, which binds each DaemonSet pod to the node its node
// affinity names once the node's taints and resources allow it. There is no kubelet: pods are
// bound but never run, and a pod being deleted is removed at once (finishPodTermination). A kubeconfig is written for helm and other clients. See
// docs/conformance.md.
package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	cacheddiscovery "k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	eventsv1 "k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/klog/v2"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	"k8s.io/kubernetes/pkg/controller/daemon"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
	"k8s.io/kubernetes/pkg/controller/serviceaccount"
	"k8s.io/kubernetes/pkg/scheduler"
	"k8s.io/kubernetes/pkg/scheduler/profile"
)

// ControlPlane is a running API server with its controllers. Everything stops at the end of the
// test that started it (t's cleanups).
type ControlPlane struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	Client kubernetes.Interface
	// Kubeconfig is a file for helm and kubectl with the same identity.
	Kubeconfig string
	// CertDir holds the API server's serving certificate (apiserver.crt: the certificate, then
	// the CA that signed it), which clients reaching it by address (https://127.0.0.1:<port>)
	// verify it with.
	CertDir string
}

// Options change how Start runs the API server.
type Options struct {
	// Flags are appended to the API server's command line; an --authorization-mode among them
	// replaces the default RBAC.
	Flags []string
	// Kubeconfig is where the admin kubeconfig is written; empty: a file in t.TempDir().
	Kubeconfig string
	// KubeletRuns: a real kubelet serves the nodes, stops pods' containers and finishes their
	// termination itself, so the control plane does not delete terminating pods at once.
	KubeletRuns bool
}

// Start starts etcd, the API server and the controllers; it fails the test when any of them
// cannot start.
func Start(t testing.TB) *ControlPlane { return StartWith(t, Options{}) }

// StartWith is Start with options. t may be a process's own testing.TB (the real node's
// long-running control plane): its Cleanup functions run when the process stops.
func StartWith(t testing.TB, o Options) *ControlPlane {
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
		apiserverFlags(o.Flags), storage)
	if err != nil {
		t.Fatalf("kube-apiserver: %v", err)
	}
	t.Cleanup(server.TearDownFn)

	cfg := rest.CopyConfig(server.ClientConfig)
	// The tests poll; client-go's default 5 requests/s would make them wait on the client.
	cfg.QPS, cfg.Burst = -1, 0
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cp := &ControlPlane{Config: cfg, Client: client, CertDir: server.TmpDir}
	cp.Kubeconfig = o.Kubeconfig
	if cp.Kubeconfig == "" {
		cp.Kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	}
	writeKubeconfig(t, cfg, cp.Kubeconfig)

	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	startControllers(t, ctx, cancel, cfg, client, !o.KubeletRuns)
	return cp
}

// apiserverFlags: RBAC authorization unless flags choose the modes (a list flag: given twice,
// its values add up), then flags.
func apiserverFlags(flags []string) []string {
	for _, f := range flags {
		if strings.HasPrefix(f, "--authorization-mode=") {
			return flags
		}
	}
	return append([]string{"--authorization-mode=RBAC"}, flags...)
}

// writeKubeconfig writes cfg (the server's loopback identity: a bearer token, the loopback CA and
// the server name its certificate carries) as the kubeconfig file path.
func writeKubeconfig(t testing.TB, cfg *rest.Config, path string) {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["control-plane"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.TLSClientConfig.CAData,
		TLSServerName:            cfg.TLSClientConfig.ServerName,
	}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["admin"] = &clientcmdapi.Context{Cluster: "control-plane", AuthInfo: "admin"}
	kc.CurrentContext = "admin"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("kubeconfig: %v", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

// startControllers runs the DaemonSet, garbage-collector and service-account controllers as
// kube-controller-manager would (its default worker counts; the GC resyncs discovery every 5 s
// so that it sees resources helm may add), and the scheduler. At the end of the test cancel
// stops them all, then their informers are shut down.
func startControllers(t testing.TB, ctx context.Context, cancel context.CancelFunc, cfg *rest.Config, client kubernetes.Interface, finishTermination bool) {
	t.Helper()
	var factories []interface{ Shutdown() }
	t.Cleanup(func() {
		cancel()
		for _, f := range factories {
			f.Shutdown()
		}
	})
	factory := informers.NewSharedInformerFactory(client, 0)
	ds, err := daemon.NewDaemonSetsController(ctx,
		factory.Apps().V1().DaemonSets(), factory.Apps().V1().ControllerRevisions(),
		factory.Core().V1().Pods(), factory.Core().V1().Nodes(), client,
		flowcontrol.NewBackOff(1*time.Second, 15*time.Minute))
	if err != nil {
		t.Fatalf("daemonset controller: %v", err)
	}
	sa, err := serviceaccount.NewServiceAccountsController(klog.FromContext(ctx),
		factory.Core().V1().ServiceAccounts(), factory.Core().V1().Namespaces(), client,
		serviceaccount.DefaultServiceAccountsControllerOptions())
	if err != nil {
		t.Fatalf("serviceaccount controller: %v", err)
	}

	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	metaFactory := metadatainformer.NewSharedInformerFactory(meta, 0)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cacheddiscovery.NewMemCacheClient(client.Discovery()))
	mapper.Reset()
	started := make(chan struct{})
	gc, err := garbagecollector.NewGarbageCollector(ctx, client, meta, mapper,
		garbagecollector.DefaultIgnoredResources(),
		informerfactory.NewInformerFactory(factory, metaFactory), started)
	if err != nil {
		t.Fatalf("garbage collector: %v", err)
	}

	if finishTermination {
		finishPodTermination(t, ctx, client, factory)
	}
	factories = append(factories, factory, metaFactory)
	factory.Start(ctx.Done())
	metaFactory.Start(ctx.Done())
	close(started)
	const gcSync = 5 * time.Second
	go wait.Until(mapper.Reset, gcSync, ctx.Done())
	go gc.Run(ctx, 20, gcSync)
	go gc.Sync(ctx, client.Discovery(), gcSync)
	go ds.Run(ctx, 2)
	go sa.Run(ctx, 1)

	// kube-scheduler: its own informers (its pod informer drops finished pods), its default
	// profile (taints, node affinity, resources, ...), events recorded to the server.
	schedFactory := scheduler.NewInformerFactory(client, 0, nil)
	factories = append(factories, schedFactory)
	events := eventsv1.NewBroadcaster(&eventsv1.EventSinkImpl{Interface: client.EventsV1()})
	sched, err := scheduler.New(ctx, client, schedFactory, nil, profile.NewRecorderFactory(events),
		scheduler.WithKubeConfig(cfg))
	if err != nil {
		t.Fatalf("scheduler: %v", err)
	}
	events.StartRecordingToSink(ctx.Done())
	t.Cleanup(events.Shutdown)
	schedFactory.Start(ctx.Done())
	schedFactory.WaitForCacheSync(ctx.Done())
	if err := sched.WaitForHandlersSync(ctx); err != nil {
		t.Fatalf("scheduler: %v", err)
	}
	go sched.Run(ctx)
}

// finishPodTermination does the one part of a kubelet's work that the control plane waits for:
// a bound pod that is being deleted stays in the API (Terminating) until its node's kubelet has
// stopped its containers and deletes it with a zero grace period; with no kubelet, DaemonSet
// rolling updates and relabels would wait for ever. No container runs here, so the pod is
// deleted at once, as the kubelet's status manager does (with the pod's UID as precondition).
func finishPodTermination(t testing.TB, ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory) {
	t.Helper()
	finish := func(obj interface{}) {
		pod, ok := obj.(*v1.Pod)
		if !ok || pod.DeletionTimestamp == nil || pod.Spec.NodeName == "" {
			return
		}
		zero := int64(0)
		err := client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: metav1.NewUIDPreconditions(string(pod.UID))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "finishing pod termination", "pod", klog.KObj(pod))
		}
	}
	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    finish,
		UpdateFunc: func(_, cur interface{}) { finish(cur) },
	}); err != nil {
		t.Fatal(err)
	}
}
