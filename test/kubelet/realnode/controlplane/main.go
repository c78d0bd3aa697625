// Command controlplane runs the harness's control plane (../../controlplane: kube-apiserver on an
// embedded etcd, the scheduler, the DaemonSet, garbage-collector and service-account
// controllers) as a long-running process for the real node (scripts/real-node.sh,
// docs/real-node.md), with what a real kubelet needs of it:
//   - client certificates from a CA of its own: the kubelet's (system:node:<node>, group
//     system:nodes, authorized by the Node authorizer) and the API server's towards the kubelet
//     (--kubelet-client-certificate, bound to system:kubelet-api-admin), so that `kubectl logs` and
//     `kubectl exec` reach the kubelet's authenticated, authorizing endpoint;
//   - the root CA publisher (each namespace's kube-root-ca.crt), so that pods' service-account
//     volumes verify the API server at https://127.0.0.1:<port>;
//   - the resource-claim controller (claims released and deallocated when their pods are gone);
//   - the part of the cloud-node and node-lifecycle controllers a lone local node needs: the
//     kubelet runs with --cloud-provider=external (it refuses 127.0.0.1 as --node-ip, and any
//     address it would pick itself is the machine's own), so this process gives the node the
//     address 127.0.0.1, lifts the uninitialized taint, and lifts the not-ready taint that
//     admission puts on a new node once the kubelet reports Ready.
//
// It writes the admin kubeconfig (--kubeconfig), the kubelet's (--dir/kubelet.kubeconfig) and,
// last, --dir/ready holding the API server's URL; SIGTERM or SIGINT stops everything and exits 0.
package main

import (
	"context"
	"crypto"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/certificates/rootcacertpublisher"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
	testutil "k8s.io/kubernetes/test/utils"

	"github.com/rdma-device-plugin/rdma-device-plugin/test/kubelet/controlplane"
)

const (
	uninitializedTaint = "node.cloudprovider.kubernetes.io/uninitialized"
	apiserverClientCN  = "kube-apiserver-kubelet-client"
)

func main() {
	dir := flag.String("dir", "", "directory for certificates, the kubelet's kubeconfig and the ready file (required)")
	kubeconfig := flag.String("kubeconfig", "", "where to write the admin kubeconfig (required)")
	node := flag.String("node-name", "", "the kubelet's node name (required)")
	flag.Parse()
	for name, v := range map[string]string{"--dir": *dir, "--kubeconfig": *kubeconfig, "--node-name": *node} {
		if v == "" {
			fmt.Fprintf(os.Stderr, "controlplane: %s is required\n", name)
			os.Exit(2)
		}
	}
	tb := newProcessTB()
	code := 0
	func() {
		defer func() {
			if r := recover(); r != nil && r != errFatal {
				panic(r)
			} else if r != nil {
				code = 1
			}
		}()
		run(tb, *dir, *kubeconfig, *node)
	}()
	tb.runCleanups()
	os.Exit(code)
}

// run starts everything, writes the ready file and returns at SIGTERM/SIGINT.
func run(tb *processTB, dir, kubeconfig, node string) {
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		tb.Fatal(err)
	}
	ca, caKey := newCA(tb, pki)
	writeClientCert(tb, pki, "kubelet-client", "system:node:"+node, []string{"system:nodes"}, ca, caKey)
	writeClientCert(tb, pki, "apiserver-kubelet-client", apiserverClientCN, nil, ca, caKey)

	cp := controlplane.StartWith(tb, controlplane.Options{
		Flags: []string{
			"--authorization-mode=Node,RBAC",
			"--client-ca-file=" + filepath.Join(pki, "ca.crt"),
			"--kubelet-client-certificate=" + filepath.Join(pki, "apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + filepath.Join(pki, "apiserver-kubelet-client.key"),
			"--kubelet-preferred-address-types=InternalIP",
			// As kubeadm's clusters: privileged pods (the tests' hostPath leak case).
			"--allow-privileged=true",
		},
		Kubeconfig:  kubeconfig,
		KubeletRuns: true,
	})
	// Cancelled when the cleanups start, before the informers below are shut down.
	ctx := tb.Context()

	// The API server reaches the kubelet as kube-apiserver-kubelet-client (logs, exec).
	_, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-apiserver-kubelet-api-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: apiserverClientCN}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatalf("kubelet API binding: %v", err)
	}

	servingCA, err := os.ReadFile(filepath.Join(cp.CertDir, "apiserver.crt"))
	if err != nil {
		tb.Fatalf("the API server's serving certificate: %v", err)
	}
	writeKubeletKubeconfig(tb, filepath.Join(dir, "kubelet.kubeconfig"), cp.Config.Host, servingCA, pki)

	factory := informers.NewSharedInformerFactory(cp.Client, 0)
	publisher, err := rootcacertpublisher.NewPublisher(factory.Core().V1().ConfigMaps(),
		factory.Core().V1().Namespaces(), cp.Client, servingCA)
	if err != nil {
		tb.Fatalf("root CA publisher: %v", err)
	}
	// The resource-claim controller, as kube-controller-manager runs it: claims of pods that are
	// gone are released (status.reservedFor) and deallocated, the claims the scheduler made for
	// extended-resource requests and from templates deleted with their pods.
	claims, err := resourceclaim.NewController(klog.Background(), cp.Client, factory.Core().V1().Pods(),
		factory.Scheduling().V1beta1().PodGroups(), factory.Resource().V1().ResourceClaims(),
		factory.Resource().V1().ResourceClaimTemplates())
	if err != nil {
		tb.Fatalf("resource-claim controller: %v", err)
	}
	watchNode(ctx, cp.Client, factory, node)
	factory.Start(ctx.Done())
	tb.Cleanup(factory.Shutdown)
	go publisher.Run(ctx, 1)
	go claims.Run(ctx, 2)

	ready := filepath.Join(dir, "ready")
	if err := os.WriteFile(ready+".tmp", []byte(cp.Config.Host+"\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(ready+".tmp", ready); err != nil {
		tb.Fatal(err)
	}
	klog.Infof("control plane ready at %s", cp.Config.Host)
	sig := <-stop
	klog.Infof("%v: stopping", sig)
	_ = os.Remove(ready)
}

// newCA writes a client CA (ca.crt, ca.key) under pki.
func newCA(tb *processTB, pki string) (*x509.Certificate, crypto.Signer) {
	key, err := testutil.NewPrivateKey()
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: "rdp-real-node-client-ca"}, key)
	if err != nil {
		tb.Fatal(err)
	}
	writePair(tb, pki, "ca", ca, key)
	return ca, key
}

// writeClientCert writes <name>.crt and <name>.key: a client certificate for cn in groups.
func writeClientCert(tb *processTB, pki, name, cn string, groups []string, ca *x509.Certificate, caKey crypto.Signer) {
	key, err := testutil.NewPrivateKey()
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := testutil.NewSignedCert(&certutil.Config{CommonName: cn, Organization: groups,
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, key, ca, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	writePair(tb, pki, name, cert, key)
}

func writePair(tb *processTB, pki, name string, cert *x509.Certificate, key crypto.Signer) {
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		tb.Fatal(err)
	}
	if err := certutil.WriteCert(filepath.Join(pki, name+".crt"), testutil.EncodeCertPEM(cert)); err != nil {
		tb.Fatal(err)
	}
	if err := keyutil.WriteKey(filepath.Join(pki, name+".key"), keyPEM); err != nil {
		tb.Fatal(err)
	}
}

// writeKubeletKubeconfig: the kubelet's identity (client certificate) against the API server's
// address, verified with its serving CA.
func writeKubeletKubeconfig(tb *processTB, path, host string, servingCA []byte, pki string) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["real-node"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: servingCA}
	kc.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{
		ClientCertificate: filepath.Join(pki, "kubelet-client.crt"),
		ClientKey:         filepath.Join(pki, "kubelet-client.key"),
	}
	kc.Contexts["kubelet"] = &clientcmdapi.Context{Cluster: "real-node", AuthInfo: "kubelet"}
	kc.CurrentContext = "kubelet"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		tb.Fatalf("kubelet kubeconfig: %v", err)
	}
}

// watchNode does for the node what a cloud-node controller and the node-lifecycle controller
// would: the address 127.0.0.1 (InternalIP) and its name (Hostname) while it has no InternalIP
// (an external cloud provider's kubelet gives it only its Hostname), no
// uninitialized taint, and no not-ready NoSchedule taint while it is Ready.
func watchNode(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory, name string) {
	var mu sync.Mutex // one update at a time
	update := func(obj interface{}) {
		n, ok := obj.(*v1.Node)
		if !ok || n.Name != name {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		internal := false
		for _, a := range n.Status.Addresses {
			internal = internal || a.Type == v1.NodeInternalIP
		}
		if !internal {
			n = n.DeepCopy()
			n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"},
				{Type: v1.NodeHostName, Address: name}}
			if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
				if !apierrors.IsConflict(err) && ctx.Err() == nil {
					klog.ErrorS(err, "setting the node's address")
				}
				return // the next event retries
			}
			return
		}
		ready := false
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				ready = true
			}
		}
		var keep []v1.Taint
		for _, t := range n.Spec.Taints {
			if t.Key == uninitializedTaint || (ready && t.Key == v1.TaintNodeNotReady && t.Effect == v1.TaintEffectNoSchedule) {
				continue
			}
			keep = append(keep, t)
		}
		if len(keep) == len(n.Spec.Taints) {
			return
		}
		n = n.DeepCopy()
		n.Spec.Taints = keep
		if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) && ctx.Err() == nil {
			klog.ErrorS(err, "updating the node's taints")
		}
	}
	// A conflict means the kubelet changed the node meanwhile: that change's event retries.
	_, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, cur interface{}) { update(cur) },
	})
	if err != nil {
		klog.Fatal(err)
	}
}
