package kubelet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	apisgrpc "k8s.io/kubernetes/pkg/kubelet/apis/grpc"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// Kubelet is the part of a kubelet that device plugins meet, built from the kubelet's own
// packages and wired as pkg/kubelet/cm/container_manager_linux.go wires them: the Topology
// Manager with the device manager as its hint provider and affinity store, the device
// manager's registration server on /var/lib/kubelet/device-plugins/kubelet.sock, and the
// pod-resources v1 server (with the kubelet's rate limit) on a unix socket. The CPU and memory
// managers are absent (policy none), so the device manager is the only hint provider.
type Kubelet struct {
	Policy, Scope      string
	PodResourcesSocket string
	TM                 topologymanager.Manager
	DM                 *devicemanager.ManagerImpl

	ctx    context.Context
	cancel context.CancelFunc
	pods   *PodStore
	prSrv  *grpc.Server
	delay  atomic.Int64 // nanoseconds every pod-resources call hangs (see SetPodResourcesDelay)

	prCalls, prRefused atomic.Int64 // pod-resources calls, and those the rate limit refused
}

// KubeletConfig chooses the Topology Manager policy and scope.
type KubeletConfig struct {
	Policy             string // none, best-effort, restricted, single-numa-node
	Scope              string // container, pod
	NUMANodes          []int
	PodResourcesSocket string
	Pods               *PodStore // shared across a kubelet restart; nil: a new one
	Logger             klog.Logger
}

// alwaysReady is config.SourcesReady that is always ready: the kubelet after it has heard from
// the API server. With it, the device manager garbage-collects devices of pods no longer active.
type alwaysReady struct{}

func (alwaysReady) AddSource(string) {}
func (alwaysReady) AllReady() bool   { return true }

// StartKubelet builds and starts the managers and the pod-resources server.
func StartKubelet(cfg KubeletConfig) (*Kubelet, error) {
	if cfg.Scope == "" {
		cfg.Scope = topologymanager.ContainerTopologyScope
	}
	if cfg.Pods == nil {
		cfg.Pods = NewPodStore()
	}
	logger := cfg.Logger
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	k := &Kubelet{Policy: cfg.Policy, Scope: cfg.Scope, PodResourcesSocket: cfg.PodResourcesSocket,
		ctx: ctx, cancel: cancel, pods: cfg.Pods}
	var machine []cadvisorapi.Node
	for _, id := range cfg.NUMANodes {
		machine = append(machine, cadvisorapi.Node{Id: id})
	}
	var err error
	if k.TM, err = topologymanager.NewManager(logger, machine, cfg.Policy, cfg.Scope, nil); err != nil {
		cancel()
		return nil, fmt.Errorf("topologymanager.NewManager: %w", err)
	}
	if k.DM, err = devicemanager.NewManagerImpl(logger, machine, k.TM); err != nil {
		cancel()
		return nil, fmt.Errorf("devicemanager.NewManagerImpl: %w", err)
	}
	k.TM.AddHintProvider(logger, k.DM)
	// Containers the runtime reports running, as the kubelet passes them after a restart: the
	// admitted pods' containers, all running.
	containers := containermap.NewContainerMap()
	running := sets.New[string]()
	for _, p := range k.pods.Active() {
		for _, c := range p.Spec.Containers {
			id := ContainerID(p, c.Name)
			containers.Add(string(p.UID), c.Name, id)
			running.Insert(id)
		}
	}
	if err := k.DM.Start(logger, k.pods.Active, alwaysReady{}, containers, running); err != nil {
		cancel()
		return nil, fmt.Errorf("device manager Start: %w", err)
	}
	if cfg.PodResourcesSocket != "" {
		if err := k.servePodResources(); err != nil {
			k.Stop()
			return nil, err
		}
	}
	return k, nil
}

func (k *Kubelet) servePodResources() error {
	_ = os.Remove(k.PodResourcesSocket)
	ln, err := net.Listen("unix", k.PodResourcesSocket)
	if err != nil {
		return fmt.Errorf("pod-resources listen: %w", err)
	}
	// As pkg/kubelet/server.ListenAndServePodResources does, minus its os.Exit on error: the
	// kubelet's rate limit (apisgrpc.WithRateLimiter's interceptor and limiter, built here so
	// that a counter can sit in front of it).
	limit := apisgrpc.LimiterUnaryServerInterceptor(rate.NewLimiter(
		rate.Limit(podresources.DefaultQPS), int(podresources.DefaultBurstTokens)))
	k.prSrv = grpc.NewServer(grpc.ChainUnaryInterceptor(k.count, limit, k.hang))
	podresourcesapi.RegisterPodResourcesListerServer(k.prSrv,
		podresources.NewV1PodResourcesServer(k.ctx, podresources.PodResourcesProviders{
			Pods:             k.pods,
			Devices:          devicesProvider{k.DM},
			Cpus:             noCPUs{},
			Memory:           noMemory{},
			DynamicResources: noDRA{},
		}))
	go func() { _ = k.prSrv.Serve(ln) }()
	return nil
}

func (k *Kubelet) count(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	k.prCalls.Add(1)
	resp, err := h(ctx, req)
	if errors.Is(err, apisgrpc.ErrorLimitExceeded) {
		k.prRefused.Add(1)
	}
	return resp, err
}

// PodResourcesCalls returns how many pod-resources calls came, and how many of them the
// kubelet's rate limit (100 QPS, burst 10) refused with ResourceExhausted.
func (k *Kubelet) PodResourcesCalls() (calls, refused int64) {
	return k.prCalls.Load(), k.prRefused.Load()
}

// SetPodResourcesDelay makes every later pod-resources call wait d (or until its caller gives
// up) before it is served: a kubelet too busy to answer.
func (k *Kubelet) SetPodResourcesDelay(d time.Duration) { k.delay.Store(int64(d)) }

func (k *Kubelet) hang(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if d := time.Duration(k.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return h(ctx, req)
}

// Stop stops the registration server (dropping plugin connections) and the pod-resources
// server. The socket directory and the checkpoint stay, as after a kubelet crash.
func (k *Kubelet) Stop() {
	if k.prSrv != nil {
		k.prSrv.Stop()
		_ = os.Remove(k.PodResourcesSocket)
	}
	_ = k.DM.Stop(klog.FromContext(k.ctx))
	k.cancel()
}

// Context carries the kubelet's logger.
func (k *Kubelet) Context() context.Context { return k.ctx }

// Pods is the pod store (the pod manager's view: active pods).
func (k *Kubelet) Pods() *PodStore { return k.pods }

// Admission is the outcome of admitting one pod.
type Admission struct {
	lifecycle.PodAdmitResult
	Took time.Duration
}

// Admit runs the Topology Manager's admission of a pod, which allocates its devices. As the
// kubelet's HandlePodAdditions does, the pod joins the pod manager (the active pods, and so
// the pod-resources List) before admission and leaves it again when rejected.
func (k *Kubelet) Admit(pod *v1.Pod) Admission {
	others := k.pods.Active()
	k.pods.Add(pod)
	start := time.Now()
	res := k.TM.Admit(k.ctx, &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: others,
		Operation: lifecycle.AddOperation})
	took := time.Since(start)
	if !res.Admit {
		k.pods.Remove(pod.UID)
		return Admission{res, took}
	}
	for i := range pod.Spec.Containers {
		k.TM.AddContainer(klog.FromContext(k.ctx), pod, &pod.Spec.Containers[i],
			ContainerID(pod, pod.Spec.Containers[i].Name))
	}
	return Admission{res, took}
}

// RemovePod ends a pod: it leaves the active pods, and its devices are freed the next time
// the device manager garbage-collects (UpdateAllocatedDevices), which we trigger at once.
func (k *Kubelet) RemovePod(pod *v1.Pod) {
	k.pods.Remove(pod.UID)
	for _, c := range pod.Spec.Containers {
		_ = k.TM.RemoveContainer(klog.FromContext(k.ctx), ContainerID(pod, c.Name))
	}
	k.DM.UpdateAllocatedDevices(klog.FromContext(k.ctx))
}

// Devices returns the device IDs of one resource allocated to a container, sorted.
func (k *Kubelet) Devices(pod *v1.Pod, container, resource string) []string {
	var out []string
	for id := range k.DM.GetDevices(string(pod.UID), container)[resource] {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Capacity returns capacity and allocatable of one resource (-1 when absent).
func (k *Kubelet) Capacity(resource string) (capacity, allocatable int64) {
	c, a, _ := k.DM.GetCapacity(klog.FromContext(k.ctx))
	capacity, allocatable = -1, -1
	if q, ok := c[v1.ResourceName(resource)]; ok {
		capacity = q.Value()
	}
	if q, ok := a[v1.ResourceName(resource)]; ok {
		allocatable = q.Value()
	}
	return capacity, allocatable
}

// ContainerID is the fake runtime's container ID.
func ContainerID(pod *v1.Pod, container string) string {
	return string(pod.UID) + "-" + container
}

// PodStore holds the pods bound to the node; all of them are active (none terminal).
type PodStore struct {
	mu   sync.Mutex
	pods []*v1.Pod
}

// NewPodStore returns an empty store.
func NewPodStore() *PodStore { return &PodStore{} }

// Add binds a pod.
func (s *PodStore) Add(p *v1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods = append(s.pods, p)
}

// Remove unbinds a pod.
func (s *PodStore) Remove(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.pods {
		if p.UID == uid {
			s.pods = append(s.pods[:i], s.pods[i+1:]...)
			return
		}
	}
}

// Active lists the active pods (devicemanager.ActivePodsFunc).
func (s *PodStore) Active() []*v1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*v1.Pod(nil), s.pods...)
}

// GetActivePods, GetPods and GetPodByName make the store a podresources.PodsProvider.
func (s *PodStore) GetActivePods() []*v1.Pod { return s.Active() }
func (s *PodStore) GetPods() []*v1.Pod       { return s.Active() }
func (s *PodStore) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, p := range s.Active() {
		if p.Namespace == namespace && p.Name == name {
			return p, true
		}
	}
	return nil, false
}

// devicesProvider adapts the device manager to podresources.DevicesProvider, as
// pkg/kubelet/cm's containerDevicesFromResourceDeviceInstances does: one entry per device and
// NUMA node, or one without topology.
type devicesProvider struct{ dm *devicemanager.ManagerImpl }

func (d devicesProvider) UpdateAllocatedDevices(l klog.Logger) { d.dm.UpdateAllocatedDevices(l) }
func (d devicesProvider) GetDevices(podUID, container string) []*podresourcesapi.ContainerDevices {
	return toContainerDevices(d.dm.GetDevices(podUID, container))
}
func (d devicesProvider) GetAllocatableDevices(l klog.Logger) []*podresourcesapi.ContainerDevices {
	return toContainerDevices(d.dm.GetAllocatableDevices(l))
}

func toContainerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resource, byID := range devs {
		for id, dev := range byID {
			topo := dev.GetTopology()
			if topo == nil {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resource,
					DeviceIds: []string{id}})
				continue
			}
			for _, n := range topo.GetNodes() {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resource,
					DeviceIds: []string{id},
					Topology: &podresourcesapi.TopologyInfo{
						Nodes: []*podresourcesapi.NUMANode{{ID: n.GetID()}}}})
			}
		}
	}
	return out
}

type noCPUs struct{}

func (noCPUs) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (noCPUs) GetPodCPUs(string) []int64              { return nil }
func (noCPUs) GetAllocatableCPUs() []int64            { return nil }

type noMemory struct{}

func (noMemory) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.ContainerMemory {
	return nil
}
func (noMemory) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory { return nil }

type noDRA struct{}

func (noDRA) GetDynamicResources(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}
