package kubelet

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
)

// helmBinary finds helm: $RDP_HELM, PATH, then the tools/bin that scripts/get-helm.sh fills in
// the build directory the plugin binary came from.
func helmBinary() string {
	if h := os.Getenv("RDP_HELM"); h != "" {
		return h
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h
	}
	for _, h := range []string{
		filepath.Join(filepath.Dir(filepath.Dir(binaryPath())), "tools", "bin", "helm"),
		filepath.Join(repoRoot(), "build", "tools", "bin", "helm"),
	} {
		if _, err := os.Stat(h); err == nil {
			return h
		}
	}
	return ""
}

// testImageRepository stands for the registry an operator pushes to: the chart has no default.
const testImageRepository = "registry.example/rdma-device-plugin"

// Every manifest `helm template` renders decodes strictly (unknown or duplicate fields fail)
// into the k8s.io/api types of the pinned release, under the default values and a few others.
func TestHelmTemplateDecodesStrictly(t *testing.T) {
	helm := helmBinary()
	if helm == "" {
		t.Skip("helm not found (PATH, RDP_HELM, <build>/tools/bin/helm): run scripts/get-helm.sh <build>/tools/bin")
	}
	chart := filepath.Join(repoRoot(), "charts", "rdma-device-plugin")
	if _, err := os.Stat(filepath.Join(chart, "Chart.yaml")); err != nil {
		t.Skipf("no chart at %s", chart)
	}
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
	for name, args := range map[string][]string{
		"defaults":       nil,
		"exclusive-only": {"--set", "modes={exclusive}"},
		"shared-only":    {"--set", "modes={shared}", "--set", "logLevel=debug"},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(helm, append([]string{"template", "rdp", chart, "--namespace", "kube-system",
				"--set", "image.repository=" + testImageRepository}, args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("helm template %v: %v: %s", args, err, stderr.String())
			}
			kinds := map[string]int{}
			for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(out), -1) {
				if strings.TrimSpace(stripComments(doc)) == "" {
					continue
				}
				obj, gvk, err := strict.Decode([]byte(doc), nil, nil)
				if err != nil {
					t.Errorf("strict decode: %v\n%s", err, doc)
					continue
				}
				kinds[gvk.Kind]++
				_ = obj
			}
			if kinds["DaemonSet"] == 0 {
				t.Errorf("no DaemonSet rendered: %v", kinds)
			}
			t.Logf("decoded %v", kinds)
		})
	}
}

// The strict decoder the chart test relies on does reject an unknown field deep in a manifest.
func TestStrictDecoderRejectsUnknownFields(t *testing.T) {
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
	doc := `apiVersion: apps/v1
kind: DaemonSet
metadata: {name: x}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
      - name: c
        image: i
        securityContext: {allowPrivilegeEscalaton: false}
`
	if _, _, err := strict.Decode([]byte(doc), nil, nil); err == nil || !strings.Contains(err.Error(), "allowPrivilegeEscalaton") {
		t.Errorf("a misspelt field decoded: err = %v", err)
	}
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
