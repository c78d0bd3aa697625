package realnode

import (
	"strings"
	"testing"
)

// TestRealNodeScriptFlags: a bad flag of real-node.sh exits 2 with a message naming it, before
// anything starts.
func TestRealNodeScriptFlags(t *testing.T) {
	for _, x := range []struct {
		args []string
		name string
	}{
		{[]string{"up", "--driver", "cdi"}, "--driver"},
		{[]string{"up", "--mode", "exclusiv"}, "--mode"},
		{[]string{"up", "--node", "/nonexistent"}, "--node"},
		{[]string{"up", "--named-node"}, "--named-node"},
		{[]string{"up", "--named-node", "../dgx-roles"}, "--named-node"},
		{[]string{"up", "--named-node", "dgx-nope"}, "dgx-roles"}, // the fixture's usage error, naming the known nodes
		{[]string{"up", "--values", "/nonexistent.yaml"}, "--values"},
		{[]string{"up", "--values"}, "--values"},
		{[]string{"up", "--mode"}, "--mode"},
		{[]string{"up", "--bogus"}, "--bogus"},
		{[]string{"down", "--now"}, "--now"},
		{[]string{"restart", "etcd"}, "etcd"},
		{[]string{"launch"}, "launch"},
	} {
		out, code := script(x.args...)
		t.Logf("real-node.sh %s: exit %d: %s", strings.Join(x.args, " "), code, strings.TrimSpace(out))
		if code != 2 || !strings.Contains(out, x.name) {
			t.Errorf("real-node.sh %s: exit %d, %q; want exit 2 naming %s", strings.Join(x.args, " "), code, out, x.name)
		}
	}
}
