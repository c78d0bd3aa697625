package realnode

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// draRollout (rolling upgrade without a gap): the chart's DRA DaemonSet rolled by the
// DaemonSet controller with {maxSurge: 1, maxUnavailable: 0} (the strategy docs/dra.md gives for
// DRA mode) while a pod holds a prepared claim. The new driver pod starts beside the old one and
// the old one hands the node over; a pod created while both exist starts with exactly its HCA;
// the pod that held its claim across the rollout keeps its devices, and its claim is unprepared
// (its CDI spec removed) by the new driver when it is deleted.
func draRollout(t *testing.T, c *cluster) {
	_, before := c.heldClaim("across")

	ds := c.driverDaemonSet()
	old := map[types.UID]bool{}
	for _, p := range c.driverPods(ds) {
		old[p.UID] = true
	}
	one := intstr.FromInt32(1)
	zero := intstr.FromInt32(0)
	ds.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxSurge: &one, MaxUnavailable: &zero}}
	if ds.Spec.Template.Annotations == nil {
		ds.Spec.Template.Annotations = map[string]string{}
	}
	ds.Spec.Template.Annotations["rdma-device-plugin.test/rollout"] = time.Now().Format(time.RFC3339Nano)
	// This node has no pod network: real-node.sh's post-renderer runs the plugin with
	// hostNetwork, where a container port is a host port, and the scheduler places the surge pod
	// only where its ports are free (the old pod's are not: "didn't have free ports for the
	// requested pod ports", and the rollout waits for ever; docs/dra.md, "Upgrades"). So the new
	// template takes other metrics ports, as `helm upgrade --set metrics.port=...` would; with a
	// pod network they need not change.
	for i := range ds.Spec.Template.Spec.Containers {
		movePorts(t, &ds.Spec.Template.Spec.Containers[i])
	}
	if _, err := c.client.AppsV1().DaemonSets(pluginNS).Update(c.ctx(), ds, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating the DaemonSet %s: %v", ds.Name, err)
	}
	start := time.Now()

	// The overlap: the controller's new pod exists while the old one still does.
	eventually(t, podTimeout, "a new driver pod beside the old one", func() (bool, string) {
		var olds, news int
		for _, p := range c.driverPods(ds) {
			if old[p.UID] {
				olds++
			} else {
				news++
			}
		}
		return olds > 0 && news > 0, fmt.Sprintf("%d old, %d new pods", olds, news)
	})
	t.Logf("overlap after %v: both driver pods exist", time.Since(start).Round(time.Millisecond))
	c.claim("during", request("hca", hcaClass, 1))
	c.create(claimPod("during", map[string][]string{"c": {"during"}}))
	c.waitRunning(podTimeout, "during")
	c.checkExactly("during the rollout", c.inside("during", "c"), c.allocated("during", "hca"))

	eventually(t, 2*podTimeout, "the rollout done: one driver pod, of the new template, ready", func() (bool, string) {
		ds, err := c.client.AppsV1().DaemonSets(pluginNS).Get(c.ctx(), ds.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pods := c.driverPods(ds)
		for _, p := range pods {
			if old[p.UID] {
				return false, fmt.Sprintf("the old pod %s is still there (%s)", p.Name, p.Status.Phase)
			}
		}
		s := ds.Status
		return len(pods) == 1 && s.UpdatedNumberScheduled == 1 && s.NumberAvailable == 1 && s.NumberUnavailable == 0,
			fmt.Sprintf("%d pods; updated %d, available %d, unavailable %d", len(pods), s.UpdatedNumberScheduled, s.NumberAvailable, s.NumberUnavailable)
	})
	t.Logf("rollout done after %v", time.Since(start).Round(time.Millisecond))

	now := parseProbe(t, c.execSoon("across", "c", probe))
	if describe(now) != describe(before) {
		t.Errorf("after the rollout, across sees %s, before %s", describe(now), describe(before))
	}
	uids := []string{c.claimUID("across"), c.claimUID("during")}
	c.deletePods(podTimeout, "across", "during")
	eventually(t, podTimeout, "the new driver unprepared both claims (their CDI specs removed)", func() (bool, string) {
		specs := c.cdiSpecs()
		return !containsClaim(specs, uids[0]) && !containsClaim(specs, uids[1]), fmt.Sprint(specs)
	})
}

// driverDaemonSet: the chart's DaemonSet that runs on the node (one per node mode; the node is
// labelled for one of them).
func (c *cluster) driverDaemonSet() *appsv1.DaemonSet {
	c.t.Helper()
	list, err := c.client.AppsV1().DaemonSets(pluginNS).List(c.ctx(), metav1.ListOptions{})
	if err != nil {
		c.t.Fatalf("the plugin's DaemonSets: %v", err)
	}
	var on []*appsv1.DaemonSet
	for i := range list.Items {
		if list.Items[i].Status.DesiredNumberScheduled == 1 {
			on = append(on, &list.Items[i])
		}
	}
	if len(on) != 1 {
		c.t.Fatalf("%d of the plugin's %d DaemonSets run on the node", len(on), len(list.Items))
	}
	return on[0]
}

// driverPods: the DaemonSet's pods that are not being deleted.
func (c *cluster) driverPods(ds *appsv1.DaemonSet) []v1.Pod {
	c.t.Helper()
	selector, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		c.t.Fatalf("the DaemonSet's selector: %v", err)
	}
	list, err := c.client.CoreV1().Pods(pluginNS).List(c.ctx(), metav1.ListOptions{LabelSelector: selector.String()})
	if err != nil {
		c.t.Fatalf("the plugin's pods: %v", err)
	}
	var pods []v1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			pods = append(pods, p)
		}
	}
	return pods
}

// movePorts gives the container's ports new free ones, in its ports and its --metrics-address.
func movePorts(t *testing.T, ctr *v1.Container) {
	t.Helper()
	for i := range ctr.Ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := int32(l.Addr().(*net.TCPAddr).Port)
		l.Close()
		from := fmt.Sprintf(":%d", ctr.Ports[i].ContainerPort)
		for j, a := range ctr.Args {
			if strings.HasPrefix(a, "--metrics-address=") && strings.HasSuffix(a, from) {
				ctr.Args[j] = strings.TrimSuffix(a, from) + fmt.Sprintf(":%d", port)
			}
		}
		ctr.Ports[i].ContainerPort = port
		ctr.Ports[i].HostPort = 0
	}
}

// heldClaim: a claim `name` of one HCA and a pod `name` (restartPolicy Always) whose container
// "c" holds it, running; the HCA allocated and what the container sees (checked).
func (c *cluster) heldClaim(name string) ([]string, inside) {
	c.t.Helper()
	c.claim(name, request("hca", hcaClass, 1))
	p := claimPod(name, map[string][]string{"c": {name}})
	p.Spec.RestartPolicy = v1.RestartPolicyAlways
	c.create(p)
	c.waitRunning(podTimeout, name)
	held := c.allocated(name, "hca")
	in := c.inside(name, "c")
	c.checkExactly(name, in, held)
	return held, in
}
