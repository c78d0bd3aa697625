package kubelet

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// GPUResource is what the harness's GPU plugin advertises.
const GPUResource = "nvidia.com/gpu"

// GPUPlugin is a minimal device plugin for the fixture's GPUs: one device per GPU, ID = PCI
// address, NUMA TopologyInfo from the fixture. It has no GetPreferredAllocation, as the
// NVIDIA plugin without its own topology policy, so the device manager picks GPUs itself.
type GPUPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	Socket  string
	devices []*pluginapi.Device

	mu        sync.Mutex
	srv       *grpc.Server
	allocated [][]string // device IDs of each Allocate container request, in call order
	allocTime []time.Time
}

// NewGPUPlugin builds the plugin for a node; Start serves and registers it.
func NewGPUPlugin(n *Node) *GPUPlugin {
	p := &GPUPlugin{Socket: filepath.Join(PluginDir, "harness-gpu.sock")}
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
	return Register(filepath.Base(p.Socket), GPUResource, &pluginapi.DevicePluginOptions{})
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

// AllocatedAt returns when the GPU plugin was asked to Allocate a container's GPUs (zero if
// never).
func (p *GPUPlugin) AllocatedAt(ids []string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	want := strings.Join(sorted(ids), ",")
	for i, a := range p.allocated {
		if strings.Join(sorted(a), ",") == want {
			return p.allocTime[i]
		}
	}
	return time.Time{}
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
	return &pluginapi.DevicePluginOptions{}, nil
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
		p.allocated = append(p.allocated, append([]string(nil), c.DevicesIds...))
		p.allocTime = append(p.allocTime, time.Now())
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")}})
	}
	return resp, nil
}

func (p *GPUPlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
