package kubelet

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Plugin is one run of the rdma-device-plugin binary. Its stdout and stderr are kept (and
// copied to LogFile) so tests can wait for the log lines users grep for.
type Plugin struct {
	Binary  string
	Args    []string
	Socket  string // where the plugin serves
	LogFile string

	cmd    *exec.Cmd
	exited chan struct{}
	err    error

	mu    sync.Mutex
	cond  *sync.Cond
	lines []string
}

// StartPlugin starts the binary with args (the first being the subcommand).
func StartPlugin(binary, socket, logFile string, args ...string) (*Plugin, error) {
	p := &Plugin{Binary: binary, Args: args, Socket: socket, LogFile: logFile,
		exited: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "### %s %s\n", binary, strings.Join(args, " "))
	pr, pw := io.Pipe()
	p.cmd = exec.Command(binary, args...)
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	p.cmd.Env = append(os.Environ(), "NODE_NAME=fixture-node")
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			fmt.Fprintln(f, sc.Text())
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.cond.Broadcast()
			p.mu.Unlock()
		}
		f.Close()
	}()
	go func() {
		p.err = p.cmd.Wait()
		pw.Close()
		close(p.exited)
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	return p, nil
}

// WaitLog waits until the n-th log line containing s appears (n counts from 1 over the whole
// run), the process exits, or timeout passes.
func (p *Plugin) WaitLog(s string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer timer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.countLocked(s) >= n {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("plugin exited (%v) before logging %q", p.err, s)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %q (#%d) in the plugin's log after %v", s, n, timeout)
		}
		p.cond.Wait()
	}
}

// Count returns how many log lines contain s so far.
func (p *Plugin) Count(s string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.countLocked(s)
}

func (p *Plugin) countLocked(s string) int {
	n := 0
	for _, l := range p.lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// Lines returns the log lines containing s.
func (p *Plugin) Lines(s string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, l := range p.lines {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// Stop sends SIGTERM and waits for a clean exit.
func (p *Plugin) Stop() error {
	if p.Exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("plugin ignored SIGTERM for 10s")
	}
	if p.err != nil {
		return fmt.Errorf("plugin exit after SIGTERM: %v", p.err)
	}
	return nil
}

// Kill ends the plugin with SIGKILL, as a crash or an OOM kill does.
func (p *Plugin) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Exited reports whether the process has ended.
func (p *Plugin) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Client dials the plugin's own socket: the DevicePlugin service as the kubelet sees it.
func (p *Plugin) Client() (pluginapi.DevicePluginClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+p.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return pluginapi.NewDevicePluginClient(conn), func() { conn.Close() }, nil
}

// PreferredAllocation asks the plugin directly, with a deadline.
func (p *Plugin) PreferredAllocation(available, mustInclude []string, size int) ([]string, error) {
	c, closeFn, err := p.Client()
	if err != nil {
		return nil, err
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: available, MustIncludeDeviceIDs: mustInclude,
			AllocationSize: int32(size)}}})
	if err != nil {
		return nil, err
	}
	if len(resp.ContainerResponses) != 1 {
		return nil, fmt.Errorf("%d container responses", len(resp.ContainerResponses))
	}
	return resp.ContainerResponses[0].DeviceIDs, nil
}

// ServeArgs are the flags every test passes to `serve`; extra ones are appended.
func ServeArgs(mode, kubeletDir, podResourcesSocket string, sys *Sysfs, n *Node, extra ...string) []string {
	return append([]string{"serve",
		"--mode", mode,
		"--kubelet-dir", kubeletDir,
		"--socket-name", "rdma-hca.sock",
		"--pod-resources-socket", podResourcesSocket,
		"--sysfs-root", sys.Root,
		"--dev-root", sys.Root,
		"--proc-root", sys.Root,
		"--topology-xml", n.XML,
		"--health-interval", "200ms",
		"--node-name", "fixture-node",
		"--log-level", "debug",
	}, extra...)
}
