package kubelet

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// GPUResource is what the harness's GPU plugin advertises.
const GPUResource = "nvidia.com/gpu"

// GPUPlugin is a minimal device plugin for the fixture's GPUs: one device per GPU, ID = PCI
// address, NUMA TopologyInfo from the fixture. By default it has no GetPreferredAllocation, as
// the NVIDIA plugin without its own topology policy, so the device manager picks GPUs itself;
// with Pack set (before Start) it answers GetPreferredAllocation with PackGPUs, as NVIDIA's
// plugin does with its aligned allocation policy.
type GPUPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	Socket  string
	Pack    bool
	node    *Node
	devices []*pluginapi.Device

	mu        sync.Mutex
	srv       *grpc.Server
	allocs    []GPUAllocation // each Allocate container request, in call order
	preferred int             // GetPreferredAllocation container requests answered
}

// GPUAllocation is one container's Allocate as the GPU plugin received it.
type GPUAllocation struct {
	IDs []string
	At  time.Time
	Seq int64 // its place in the harness's call order (NextCallSeq)
}

// NewGPUPlugin builds the plugin for a node; Start serves and registers it.
func NewGPUPlugin(n *Node) *GPUPlugin {
	p := &GPUPlugin{Socket: filepath.Join(PluginDir, "harness-gpu.sock"), node: n}
	for _, g := range n.GPUs {
		d := &pluginapi.Device{ID: g.PCI, Health: pluginapi.Healthy}
		if g.NUMA >= 0 {
			d.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(g.NUMA)}}}
		}
		p.devices = append(p.devices, d)
	}
	return p
}

// Start serves on PluginDir and registers with the kubelet; call it again after a kubelet
// restart (the kubelet wipes the directory and forgets its plugins).
func (p *GPUPlugin) Start() error {
	p.Stop()
	_ = os.Remove(p.Socket)
	ln, err := net.Listen("unix", p.Socket)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(ln) }()
	p.mu.Lock()
	p.srv = srv
	p.mu.Unlock()
	return Register(filepath.Base(p.Socket), GPUResource, p.options())
}

func (p *GPUPlugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: p.Pack}
}

// Stop stops serving.
func (p *GPUPlugin) Stop() {
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// AllocatedAt returns when the GPU plugin was first asked to Allocate a container's GPUs (zero
// if never).
func (p *GPUPlugin) AllocatedAt(ids []string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	want := strings.Join(sorted(ids), ",")
	for _, a := range p.allocs {
		if strings.Join(a.IDs, ",") == want {
			return a.At
		}
	}
	return time.Time{}
}

// Allocations returns the Allocate container requests from the n-th on (0: all).
func (p *GPUPlugin) Allocations(n int) []GPUAllocation {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > len(p.allocs) {
		return nil
	}
	return append([]GPUAllocation(nil), p.allocs[n:]...)
}

// Preferred returns how many GetPreferredAllocation container requests the plugin answered.
func (p *GPUPlugin) Preferred() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.preferred
}

// Register calls the kubelet's Registration service, as a device plugin does.
func Register(endpoint, resource string, opts *pluginapi.DevicePluginOptions) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(PluginDir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource, Options: opts})
	if err != nil {
		return fmt.Errorf("register %s: %w", resource, err)
	}
	return nil
}

func (p *GPUPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

func (p *GPUPlugin) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	if !p.Pack {
		return nil, status.Error(codes.Unimplemented, "GetPreferredAllocation is off (Pack unset)")
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range r.ContainerRequests {
		ids := PackGPUs(p.node, c.AvailableDeviceIDs, c.MustIncludeDeviceIDs, int(c.AllocationSize))
		resp.ContainerResponses = append(resp.ContainerResponses,
			&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	p.mu.Lock()
	p.preferred += len(r.ContainerRequests)
	p.mu.Unlock()
	return resp, nil
}

func (p *GPUPlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *GPUPlugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range r.ContainerRequests {
		p.allocs = append(p.allocs, GPUAllocation{IDs: sorted(c.DevicesIds), At: time.Now(), Seq: NextCallSeq()})
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")}})
	}
	return resp, nil
}

func (p *GPUPlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// PackGPUs is the harness GPU plugin's GetPreferredAllocation: a simple stand-in for NVIDIA's
// k8s-device-plugin, whose aligned policy (go-gpuallocator) prefers the best-connected set of
// GPUs. Must-include first; the rest are packed into the PCIe tree level by level, from the
// NUMA node through the PCIe root and each bridge down to the GPU: at each level the group
// with the fewest available GPUs that still holds all that is needed (best fit, so that whole
// switches and NUMA nodes stay free for larger requests), and when no group holds it, the
// group with the most, whole, and again for the rest. Ties: the group with the lowest address.
// IDs the node does not know are never chosen. The answer is sorted.
func PackGPUs(n *Node, available, mustInclude []string, size int) []string {
	must := map[string]bool{}
	for _, id := range mustInclude {
		must[id] = true
	}
	var free []GPU
	for _, id := range sorted(available) {
		if g, ok := n.GPUByPCI(id); ok && !must[id] {
			free = append(free, g)
		}
	}
	out := append(sorted(mustInclude), packLevel(free, size-len(mustInclude), 0)...)
	sort.Strings(out)
	return out
}

// packLevel takes need GPUs from gpus (sorted by address), grouping them by their level-th
// key: 0 the NUMA node, 1 the PCIe root, 2.. the bridges from the root port down.
func packLevel(gpus []GPU, need, level int) []string {
	if need <= 0 {
		return nil
	}
	deepest := 0
	for _, g := range gpus {
		deepest = max(deepest, len(g.Bridges)+1)
	}
	if need >= len(gpus) || level > deepest {
		var out []string
		for _, g := range gpus[:min(need, len(gpus))] {
			out = append(out, g.PCI)
		}
		return out
	}
	key := func(g GPU) string {
		switch {
		case level == 0:
			return fmt.Sprint(g.NUMA)
		case level == 1:
			return g.PCIeRoot
		case level-2 < len(g.Bridges):
			return g.Bridges[level-2]
		}
		return g.PCI // below its own chain a GPU is a group of its own
	}
	var order []string // groups by their lowest address
	groups := map[string][]GPU{}
	for _, g := range gpus {
		k := key(g)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], g)
	}
	var out []string
	for need > 0 && len(order) > 0 {
		best := -1
		for i, k := range order { // best fit: the smallest group that holds what is needed
			if len(groups[k]) >= need && (best < 0 || len(groups[k]) < len(groups[order[best]])) {
				best = i
			}
		}
		if best < 0 { // none holds it: the largest, whole
			best = 0
			for i, k := range order {
				if len(groups[k]) > len(groups[order[best]]) {
					best = i
				}
			}
		}
		g := groups[order[best]]
		took := packLevel(g, min(need, len(g)), level+1)
		out = append(out, took...)
		need -= len(took)
		order = append(order[:best], order[best+1:]...)
	}
	return out
}
