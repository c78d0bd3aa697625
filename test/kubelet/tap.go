package kubelet

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
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
// talk to the plugin directly. SetMode lets the quality replay put another HCA policy in our
// plugin's place for GetPreferredAllocation (none, or one written in Go).
type Tap struct {
	Dir string

	mu     sync.Mutex
	reg    *grpc.Server
	fwd    []*grpc.Server
	conns  []*grpc.ClientConn
	events []Exchange
	mode   TapMode
	prefer PreferFunc
}

// TapMode is what the kubelet gets when it asks the tap for a preferred allocation.
type TapMode int

const (
	// TapForward forwards GetPreferredAllocation to our plugin (the default).
	TapForward TapMode = iota
	// TapNoPreference tells the kubelet that the plugin has no GetPreferredAllocation
	// (GetPreferredAllocationAvailable false): the device manager chooses alone, its default.
	TapNoPreference
	// TapAnswer answers GetPreferredAllocation with the tap's own PreferFunc (SetPrefer); our
	// plugin still serves ListAndWatch and Allocate.
	TapAnswer
)

// PreferFunc answers one container's GetPreferredAllocation.
type PreferFunc func(available, mustInclude []string, size int) []string

// Exchange is what the device manager asked our plugin for one container's allocation: the
// GetPreferredAllocation call (nil when it made none) and the Allocate that followed.
type Exchange struct {
	GPA       *GPARecord
	Allocated []string
	AllocSeq  int64 // the Allocate's place in the harness's call order (NextCallSeq)
}

// GPARecord is one GetPreferredAllocation container request and our plugin's answer.
type GPARecord struct {
	At                     time.Time // when the device manager called
	Seq                    int64     // its place in the harness's call order (NextCallSeq)
	Available, MustInclude []string
	Size                   int
	Answer                 []string
	Err                    error
}

// callSeq orders the device-plugin calls the harness's plugins receive (the tap's and the GPU
// plugin's): the device manager makes one container's calls one after the other, so comparing
// two numbers says which resource it allocated first.
var callSeq atomic.Int64

// NextCallSeq returns the next number of the harness's call order.
func NextCallSeq() int64 { return callSeq.Add(1) }

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

// SetMode chooses what the kubelet gets for GetPreferredAllocation; set it before our plugin
// registers (the device manager reads the plugin's options once, when it connects).
func (t *Tap) SetMode(m TapMode) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.mode = m
}

// SetPrefer sets the answer of TapAnswer.
func (t *Tap) SetPrefer(f PreferFunc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.prefer = f
}

func (t *Tap) state() (TapMode, PreferFunc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mode, t.prefer
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
	opts := req.Options
	if mode, _ := t.state(); mode == TapNoPreference && opts != nil {
		opts = &pluginapi.DevicePluginOptions{PreStartRequired: opts.PreStartRequired}
	}
	if err := Register(endpoint, req.ResourceName, opts); err != nil {
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
	opts, err := f.up.GetDevicePluginOptions(ctx, e)
	if mode, _ := f.tap.state(); err == nil && mode == TapNoPreference {
		opts = &pluginapi.DevicePluginOptions{PreStartRequired: opts.PreStartRequired}
	}
	return opts, err
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
	at, seq := time.Now(), NextCallSeq()
	var resp *pluginapi.PreferredAllocationResponse
	var err error
	if mode, prefer := f.tap.state(); mode == TapAnswer && prefer != nil {
		resp = &pluginapi.PreferredAllocationResponse{}
		for _, c := range req.ContainerRequests {
			resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{
				DeviceIDs: prefer(sorted(c.AvailableDeviceIDs), sorted(c.MustIncludeDeviceIDs), int(c.AllocationSize))})
		}
	} else {
		resp, err = f.up.GetPreferredAllocation(ctx, req)
	}
	f.tap.mu.Lock()
	defer f.tap.mu.Unlock()
	for i, c := range req.ContainerRequests {
		rec := GPARecord{At: at, Seq: seq, Available: sorted(c.AvailableDeviceIDs), MustInclude: sorted(c.MustIncludeDeviceIDs),
			Size: int(c.AllocationSize), Err: err}
		if err == nil && i < len(resp.ContainerResponses) {
			rec.Answer = sorted(resp.ContainerResponses[i].DeviceIDs)
		}
		f.tap.events = append(f.tap.events, Exchange{GPA: &rec})
	}
	return resp, err
}

func (f *tapForward) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	seq := NextCallSeq()
	f.tap.mu.Lock()
	for _, c := range req.ContainerRequests {
		n := len(f.tap.events)
		if n > 0 && f.tap.events[n-1].Allocated == nil {
			f.tap.events[n-1].Allocated = sorted(c.DevicesIds)
			f.tap.events[n-1].AllocSeq = seq
		} else {
			f.tap.events = append(f.tap.events, Exchange{Allocated: sorted(c.DevicesIds), AllocSeq: seq})
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
