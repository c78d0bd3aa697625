package kubelet

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The device manager's socket directory is fixed (pluginapi.DevicePluginPath). Every test runs
// in a re-executed copy of the test binary inside its own mount namespace
// (`unshare --mount --propagation private`), where that directory is a fresh tmpfs: no test
// touches the host's /var/lib/kubelet, and tests could run side by side. Re-exec per test
// rather than unshare(2) in-process, because Go's other threads would stay in the old namespace.
const (
	isolatedEnv = "RDP_KUBELET_ISOLATED" // set in the child: we are inside the namespace
	scratchEnv  = "RDP_KUBELET_SCRATCH"  // a directory the parent owns and cleans up
)

// PluginDir is where the device manager listens: /var/lib/kubelet/device-plugins.
var PluginDir = filepath.Clean(pluginapi.DevicePluginPath)

// childTimeout bounds one isolated test process; the slowest scenario takes well under it.
var childTimeout = 5 * time.Minute

var nsOnce sync.Once
var nsErr error

// Isolate must be the first call of every test (and subtest) that starts a kubelet. In the
// parent it re-runs exactly this test in a new mount namespace, relays its output and verdict,
// and returns false: the caller returns at once. In the child it sets the namespace up (once)
// and returns true.
func Isolate(t *testing.T) bool {
	t.Helper()
	if os.Getenv(isolatedEnv) != "" {
		nsOnce.Do(func() { nsErr = setupNamespace(os.Getenv(scratchEnv)) })
		if nsErr != nil {
			t.Fatalf("mount namespace: %v", nsErr)
		}
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the kubelet's device-plugin directory is mounted over in a private mount namespace")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("needs unshare(1) from util-linux")
	}
	var parts []string
	for _, p := range strings.Split(t.Name(), "/") {
		parts = append(parts, "^"+regexp.QuoteMeta(p)+"$")
	}
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, unshare, "--mount", "--propagation", "private", self,
		"-test.run", strings.Join(parts, "/"), "-test.v", "-test.count", "1",
		"-test.timeout", childTimeout.String())
	cmd.Env = append(os.Environ(), isolatedEnv+"=1", scratchEnv+"="+t.TempDir())
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	var sink io.Writer = &out
	if testing.Verbose() {
		sink = io.MultiWriter(&out, &prefixWriter{w: os.Stdout, prefix: "    | "})
	}
	cmd.Stdout, cmd.Stderr = sink, sink
	runErr := cmd.Run()
	text := out.String()
	switch {
	case ctx.Err() != nil:
		t.Fatalf("isolated run timed out after %v:\n%s", childTimeout, tail(text, 80))
	case runErr != nil:
		if !testing.Verbose() {
			t.Log(tail(text, 200))
		}
		t.Fatalf("isolated run failed: %v", runErr)
	case strings.Contains(text, "--- SKIP: "+t.Name()+" "):
		t.Skip(skipReason(text, t.Name()))
	case !strings.Contains(text, "--- PASS: "+t.Name()+" "):
		t.Fatalf("isolated run did not run %s:\n%s", t.Name(), tail(text, 40))
	}
	return false
}

// setupNamespace mounts a tmpfs over PluginDir. When the directory does not exist on this
// machine, /var/lib is overlaid first (upper layer in scratch), so that not even an empty
// directory is created on the host.
func setupNamespace(scratch string) error {
	if os.Getenv(isolatedEnv) == "" {
		return fmt.Errorf("not in an isolated child")
	}
	// unshare --propagation private already made every mount private; make sure.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if _, err := os.Stat(PluginDir); os.IsNotExist(err) {
		if scratch == "" {
			return fmt.Errorf("%s missing and no scratch dir", PluginDir)
		}
		if err := unix.Mount("tmpfs", scratch, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("tmpfs on %s: %w", scratch, err)
		}
		upper, work := filepath.Join(scratch, "upper"), filepath.Join(scratch, "work")
		for _, d := range []string{upper, work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		lower := "/var/lib"
		if err := unix.Mount("overlay", lower, "overlay", 0,
			fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)); err != nil {
			// No overlayfs here (or not over this filesystem): hide /var/lib behind an empty
			// tmpfs instead, in this namespace only. Nothing the test runs lives in /var/lib.
			if err2 := unix.Mount("tmpfs", lower, "tmpfs", 0, "mode=0755"); err2 != nil {
				return fmt.Errorf("overlay on %s: %v; tmpfs: %w", lower, err, err2)
			}
		}
		if err := os.MkdirAll(PluginDir, 0o750); err != nil {
			return err
		}
	}
	if err := unix.Mount("tmpfs", PluginDir, "tmpfs", 0, "mode=0750"); err != nil {
		return fmt.Errorf("tmpfs on %s: %w", PluginDir, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(PluginDir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("%s is not our tmpfs (statfs: %v)", PluginDir, err)
	}
	return nil
}

// ClearPluginDir empties the tmpfs between kubelets of one test (never outside the namespace).
func ClearPluginDir() error {
	if os.Getenv(isolatedEnv) == "" {
		return fmt.Errorf("refusing to clear %s outside the test's mount namespace", PluginDir)
	}
	entries, err := os.ReadDir(PluginDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(PluginDir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func tail(s string, lines int) string {
	all := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(all) > lines {
		all = append([]string{"..."}, all[len(all)-lines:]...)
	}
	return strings.Join(all, "\n")
}

func skipReason(out, name string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	var last string
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "--- SKIP: "+name+" ") {
			if sc.Scan() {
				return strings.TrimSpace(sc.Text())
			}
			return last
		}
		last = strings.TrimSpace(line)
	}
	return "skipped"
}

// prefixWriter indents a child's output so it reads as belonging to the parent test.
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	midway bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var buf bytes.Buffer
	for _, c := range b {
		if !p.midway {
			buf.WriteString(p.prefix)
			p.midway = true
		}
		buf.WriteByte(c)
		if c == '\n' {
			p.midway = false
		}
	}
	_, err := p.w.Write(buf.Bytes())
	return len(b), err
}
