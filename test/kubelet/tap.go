package kubelet

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Tap sits between the kubelet and our plugin and records what they say to each other: the
// plugin runs with --kubelet-dir pointing at the tap's directory, where the tap serves a
// Registration service; on Register the tap serves a forwarding DevicePlugin on
// PluginDir/tap-<endpoint> and registers that with the kubelet. This is how the tests learn
// the GetPreferredAllocation request the device manager really made and the answer our plugin
// really gave (the kubelet logs neither). Used by the allocation tests only: restart tests
// talk to the plugin directly.
type Tap struct {
	Dir string

	mu     sync.Mutex
	reg    *grpc.Server
	fwd    []*grpc.Server
	conns  []*grpc.ClientConn
	events []Exchange
}

// Exchange is what the device manager asked our plugin for one container's allocation: the
// GetPreferredAllocation call (nil when it made none) and the Allocate that followed.
type Exchange struct {
	GPA       *GPARecord
	Allocated []string
}

// GPARecord is one GetPreferredAllocation container request and our plugin's answer.
type GPARecord struct {
	At                     time.Time // when the device manager called
	Available, MustInclude []string
	Size                   int
	Answer                 []string
	Err                    error
}

type tapRegistration struct {
	pluginapi.UnimplementedRegistrationServer
	tap *Tap
}

// StartTap serves the Registration service in dir.
func StartTap(dir string) (*Tap, error) {
	t := &Tap{Dir: dir}
	sock := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	t.reg = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(t.reg, &tapRegistration{tap: t})
	go func() { _ = t.reg.Serve(ln) }()
	return t, nil
}

// Stop stops every server of the tap.
func (t *Tap) Stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reg.Stop()
	for _, s := range t.fwd {
		s.Stop()
	}
	for _, c := range t.conns {
		c.Close()
	}
}

// Exchanges returns the completed exchanges so far, in call order.
func (t *Tap) Exchanges() []Exchange {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Exchange
	for _, e := range t.events {
		if e.Allocated != nil {
			out = append(out, e)
		}
	}
	return out
}

func (r *tapRegistration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	t := r.tap
	conn, err := grpc.NewClient("unix://"+filepath.Join(t.Dir, req.Endpoint),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	endpoint := "tap-" + req.Endpoint
	sock := filepath.Join(PluginDir, endpoint)
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		conn.Close()
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, &tapForward{tap: t, up: pluginapi.NewDevicePluginClient(conn)})
	go func() { _ = srv.Serve(ln) }()
	t.mu.Lock()
	t.fwd = append(t.fwd, srv)
	t.conns = append(t.conns, conn)
	t.mu.Unlock()
	if err := Register(endpoint, req.ResourceName, req.Options); err != nil {
		return nil, err
	}
	return &pluginapi.Empty{}, nil
}

type tapForward struct {
	pluginapi.UnimplementedDevicePluginServer
	tap *Tap
	up  pluginapi.DevicePluginClient
}

func (f *tapForward) GetDevicePluginOptions(ctx context.Context, e *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return f.up.GetDevicePluginOptions(ctx, e)
}

func (f *tapForward) ListAndWatch(e *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	up, err := f.up.ListAndWatch(s.Context(), e)
	if err != nil {
		return err
	}
	for {
		m, err := up.Recv()
		if err != nil {
			return err
		}
		if err := s.Send(m); err != nil {
			return err
		}
	}
}

func (f *tapForward) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	at := time.Now()
	resp, err := f.up.GetPreferredAllocation(ctx, req)
	f.tap.mu.Lock()
	defer f.tap.mu.Unlock()
	for i, c := range req.ContainerRequests {
		rec := GPARecord{At: at, Available: sorted(c.AvailableDeviceIDs), MustInclude: sorted(c.MustIncludeDeviceIDs),
			Size: int(c.AllocationSize), Err: err}
		if err == nil && i < len(resp.ContainerResponses) {
			rec.Answer = sorted(resp.ContainerResponses[i].DeviceIDs)
		}
		f.tap.events = append(f.tap.events, Exchange{GPA: &rec})
	}
	return resp, err
}

func (f *tapForward) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	f.tap.mu.Lock()
	for _, c := range req.ContainerRequests {
		n := len(f.tap.events)
		if n > 0 && f.tap.events[n-1].Allocated == nil {
			f.tap.events[n-1].Allocated = sorted(c.DevicesIds)
		} else {
			f.tap.events = append(f.tap.events, Exchange{Allocated: sorted(c.DevicesIds)})
		}
	}
	f.tap.mu.Unlock()
	return f.up.Allocate(ctx, req)
}

func (f *tapForward) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return f.up.PreStartContainer(ctx, req)
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}
