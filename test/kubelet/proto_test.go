package kubelet

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	nriapi "github.com/containerd/nri/pkg/api"
	"github.com/containerd/ttrpc"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registrationapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// protoDescriptorsEnv names the FileDescriptorSet of proto/*.proto that CMake builds (target
// rdp_proto_descriptors); ctest and run.sh set it.
const protoDescriptorsEnv = "RDP_PROTO_DESCRIPTORS"

const kubeletModule = "k8s.io/kubelet"

// protoUpstream pairs one of our .proto files with the upstream file it follows: the Go module
// and the path in it (which the file's header comment names, with the tag go.mod pins) and that
// file's descriptor as compiled into the module's generated Go code.
type protoUpstream struct {
	ours     string // path in our descriptor set (protoc --proto_path=<repo>)
	module   string
	path     string // path in the module
	upstream protoreflect.FileDescriptor
}

// protoUpstreams: the kubelet's APIs (TestProtoMatchesKubelet).
var protoUpstreams = []protoUpstream{
	{"proto/deviceplugin.proto", kubeletModule, "pkg/apis/deviceplugin/v1beta1/api.proto",
		pluginapi.File_staging_src_k8s_io_kubelet_pkg_apis_deviceplugin_v1beta1_api_proto},
	{"proto/podresources.proto", kubeletModule, "pkg/apis/podresources/v1/api.proto",
		podresourcesapi.File_staging_src_k8s_io_kubelet_pkg_apis_podresources_v1_api_proto},
	{"proto/pluginregistration.proto", kubeletModule, "pkg/apis/pluginregistration/v1/api.proto",
		registrationapi.File_staging_src_k8s_io_kubelet_pkg_apis_pluginregistration_v1_api_proto},
	{"proto/dra.proto", kubeletModule, "pkg/apis/dra/v1/api.proto",
		drapb.File_staging_src_k8s_io_kubelet_pkg_apis_dra_v1_api_proto},
	{"proto/dra_v1beta1.proto", kubeletModule, "pkg/apis/dra/v1beta1/api.proto",
		drapbv1beta1.File_staging_src_k8s_io_kubelet_pkg_apis_dra_v1beta1_api_proto},
	{"proto/dra_health.proto", kubeletModule, "pkg/apis/dra-health/v1/api.proto",
		drahealthv1.File_staging_src_k8s_io_kubelet_pkg_apis_dra_health_v1_api_proto},
	{"proto/dra_health_v1alpha1.proto", kubeletModule, "pkg/apis/dra-health/v1alpha1/api.proto",
		drahealthv1alpha1.File_staging_src_k8s_io_kubelet_pkg_apis_dra_health_v1alpha1_api_proto},
}

// ownProtos are our .proto files that follow no kubelet API: grpc.health.v1 (the DRA driver's
// readiness check), compared with grpc-go's compiled copy instead.
var ownProtos = []struct {
	ours     string
	upstream protoreflect.FileDescriptor
}{
	{"proto/health.proto", healthpb.File_grpc_health_v1_health_proto},
}

// nriProtoUpstreams: the container runtime's NRI API and ttrpc's envelopes (TestProtoMatchesNRI).
var nriProtoUpstreams = []protoUpstream{
	{"proto/nri.proto", "github.com/containerd/nri", "pkg/api/api.proto", nriapi.File_pkg_api_api_proto},
	{"proto/ttrpc.proto", "github.com/containerd/ttrpc", "request.proto", ttrpc.File_request_proto},
	{"proto/rpc_status.proto", "google.golang.org/genproto/googleapis/rpc", "google/rpc/status.proto",
		statuspb.File_google_rpc_status_proto},
}

type serviceRole string

const (
	serves serviceRole = "serves" // the kubelet calls the plugin
	calls  serviceRole = "calls"  // the plugin calls the kubelet
)

// protoServiceRoles says, for every service we declare, what the plugin binary does with it
// (serves DevicePlugin; calls Registration to register and PodResourcesLister for the node's
// pods; in DRA mode serves pluginregistration.Registration, which the kubelet's plugin watcher
// calls, and the DRAPlugin service). It decides which omissions fail (see TestProtoMatchesKubelet); the kubelet simulator's
// test servers do not count.
var protoServiceRoles = map[protoreflect.FullName]serviceRole{
	"v1beta1.DevicePlugin":  serves,
	"v1beta1.Registration":  calls,
	"v1.PodResourcesLister": calls,

	"pluginregistration.Registration":               serves,
	"k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin":      serves,
	"k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin": serves,
	"v1.DRAResourceHealth":                          serves,
	"v1alpha1.DRAResourceHealth":                    serves,
	"grpc.health.v1.Health":                         serves,

	// `rdma-device-plugin nri`: the runtime calls the Plugin service; we call RegisterPlugin.
	"nri.pkg.api.v1alpha1.Plugin":  serves,
	"nri.pkg.api.v1alpha1.Runtime": calls,
}

// nriMethodsCalled are the Plugin methods the runtime calls on every plugin (Configure,
// Synchronize, Shutdown) or on ours, because Configure subscribes to its event
// (CreateContainer). The runtime calls no other method of a plugin that did not subscribe to it.
var nriMethodsCalled = map[protoreflect.FullName]bool{
	"nri.pkg.api.v1alpha1.Plugin.Configure":       true,
	"nri.pkg.api.v1alpha1.Plugin.Synchronize":     true,
	"nri.pkg.api.v1alpha1.Plugin.Shutdown":        true,
	"nri.pkg.api.v1alpha1.Plugin.CreateContainer": true,
}

// TestProtoMatchesKubelet compares our proto/*.proto, as protoc compiled them (the descriptor set
// in $RDP_PROTO_DESCRIPTORS), with the descriptors compiled into the k8s.io/kubelet module that
// go.mod pins: the kubelet's own. Our copies are written by hand, and a field number or type that
// drifts still compiles and still speaks gRPC; the kubelet would just misread us. So:
//
//   - Ours must be a subset of upstream, shape for shape, or the test fails: each file's package
//     and syntax; every message (nested ones and map entries too) and enum under the same full
//     name; every field under the same name with the same number, kind, message or enum type,
//     cardinality, map-ness, presence, packing and oneof; every enum value with the same number;
//     every service and method with the same request and response types and streaming.
//   - What upstream has and we leave out is logged, not failed: proto3 skips unknown fields and
//     defaults absent ones, and our copy need not carry what we do not use. Messages we send (our
//     responses, our requests to the kubelet) may omit fields: the kubelet sees defaults, as from
//     an older plugin. Responses to our calls may omit fields: we read what we declared and need
//     nothing else (at v0.37.2: PodResources.cpu_ids and .memory, ClaimResource.share_id).
//   - Except where leaving it out would let the kubelet's intent pass us by unseen, which fails:
//     a method of a service we serve (the kubelet would get Unimplemented), and a field of a
//     message the kubelet sends to a service we serve, i.e. DevicePlugin's requests and every
//     message reachable through their fields (we would drop it unread).
//
// protoServiceRoles says which services we serve and which we call; a service missing there
// fails.
//
// The header comment of each .proto must name the module, the tag go.mod pins and the file, so
// that a bump of go.mod cannot leave it stale.
func TestProtoMatchesKubelet(t *testing.T) {
	path := os.Getenv(protoDescriptorsEnv)
	if path == "" {
		t.Skipf("$%s is not set: build the CMake target rdp_proto_descriptors and point it at "+
			"<build>/proto/rdp_proto.binpb (ctest and run.sh do)", protoDescriptorsEnv)
	}
	ours := loadDescriptorSet(t, path)

	// Every file of ours must be paired with an upstream one; a new .proto must name its own.
	paired := map[string]bool{}
	for _, p := range append(append([]protoUpstream{}, protoUpstreams...), nriProtoUpstreams...) {
		paired[p.ours] = true
	}
	for _, p := range ownProtos {
		paired[p.ours] = true
	}
	ours.RangeFiles(func(f protoreflect.FileDescriptor) bool {
		if strings.HasPrefix(f.Path(), "proto/") && !paired[f.Path()] {
			t.Errorf("%s is in %s but not in protoUpstreams or nriProtoUpstreams: name the upstream file it follows", f.Path(), path)
		}
		return true
	})
	compareProtos(t, ours, path, protoUpstreams, func(c *protoComparison) {})
	for _, p := range ownProtos {
		t.Run(filepath.Base(p.ours), func(t *testing.T) {
			f, err := ours.FindFileByPath(p.ours)
			if err != nil {
				t.Fatalf("%s: not in %s: %v", p.ours, path, err)
			}
			checkHeader(t, p.ours, p.upstream.Path())
			c := &protoComparison{t: t, where: "google.golang.org/grpc " + p.upstream.Path()}
			c.file(f, p.upstream)
		})
	}
}

// TestProtoMatchesNRI compares proto/nri.proto, proto/ttrpc.proto and proto/rpc_status.proto
// with the descriptors compiled into the github.com/containerd/nri, github.com/containerd/ttrpc
// and genproto modules go.mod pins (the versions containerd v2.4.2 uses), under the rules of
// TestProtoMatchesKubelet with two differences that follow from what the NRI plugin is:
//
//   - The runtime's requests carry the whole pod and container; the plugin declares the few
//     fields it reads (devices, rlimits, names). A field left out is logged, never failed: proto3
//     skips it, and the plugin's decision does not depend on it.
//   - Of the Plugin service, the methods the runtime calls on our plugin (nriMethodsCalled) must
//     be declared; the runtime calls the others only on plugins subscribed to their events.
func TestProtoMatchesNRI(t *testing.T) {
	path := os.Getenv(protoDescriptorsEnv)
	if path == "" {
		t.Skipf("$%s is not set: build the CMake target rdp_proto_descriptors and point it at "+
			"<build>/proto/rdp_proto.binpb (ctest and run.sh do)", protoDescriptorsEnv)
	}
	compareProtos(t, loadDescriptorSet(t, path), path, nriProtoUpstreams, func(c *protoComparison) {
		c.lenientFields = true
		c.requiredMethods = nriMethodsCalled
	})
}

// compareProtos runs one subtest per pair: the header names the module and the tag go.mod pins,
// and the file compares with its upstream (configure adjusts the rules).
func compareProtos(t *testing.T, ours *protoregistry.Files, path string, pairs []protoUpstream,
	configure func(*protoComparison)) {
	for _, p := range pairs {
		t.Run(filepath.Base(p.ours), func(t *testing.T) {
			f, err := ours.FindFileByPath(p.ours)
			if err != nil {
				t.Fatalf("%s: not in %s: %v", p.ours, path, err)
			}
			if !strings.HasSuffix(p.upstream.Path(), p.path) {
				t.Fatalf("the upstream descriptor is %s, not %s", p.upstream.Path(), p.path)
			}
			version := moduleVersion(t, p.module)
			checkHeader(t, p.ours, fmt.Sprintf("Go module %s, tag %s, file %s", p.module, version, p.path))
			c := &protoComparison{t: t, where: fmt.Sprintf("%s %s %s", p.module, version, p.path)}
			configure(c)
			c.file(f, p.upstream)
		})
	}
}

// loadDescriptorSet reads a binary FileDescriptorSet (protoc --descriptor_set_out
// --include_imports) into its own registry: our packages are the kubelet's, so they must not meet
// the kubelet's types in protoregistry.GlobalFiles.
func loadDescriptorSet(t *testing.T, path string) *protoregistry.Files {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("$%s: %v", protoDescriptorsEnv, err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(raw, &set); err != nil {
		t.Fatalf("%s is no FileDescriptorSet: %v", path, err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		t.Fatalf("%s: %v (built with --include_imports?)", path, err)
	}
	return files
}

// moduleVersion is the version of `module` that go.mod pins: its replace directive, else its
// require line. (A test binary records no module versions for debug.ReadBuildInfo.)
func moduleVersion(t *testing.T, module string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot(), "test", "kubelet", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var required, replaced string
	for _, line := range strings.Split(string(src), "\n") {
		line, _, _ = strings.Cut(line, "//")
		f := strings.Fields(line)
		if len(f) > 0 && (f[0] == "require" || f[0] == "replace") {
			f = f[1:]
		}
		switch {
		case len(f) == 2 && f[0] == module:
			required = f[1]
		case len(f) == 4 && f[0] == module && f[1] == "=>" && f[2] == module:
			replaced = f[3]
		}
	}
	if replaced != "" {
		return replaced
	}
	if required == "" {
		t.Fatalf("go.mod does not require %s", module)
	}
	return required
}

// checkHeader wants the upstream named in the comment before `syntax`, wrapped as it may be.
func checkHeader(t *testing.T, ours, want string) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot(), ours))
	if err != nil {
		t.Fatal(err)
	}
	header, _, _ := strings.Cut(string(src), "\nsyntax")
	var words []string
	for _, line := range strings.Split(header, "\n") {
		words = append(words, strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "//"))...)
	}
	if !strings.Contains(strings.Join(words, " "), want) {
		t.Errorf("%s: the header comment does not name its upstream as %q (the version go.mod pins)", ours, want)
	}
}

// protoComparison compares one of our files with its upstream; see TestProtoMatchesKubelet for
// the rules.
type protoComparison struct {
	t     *testing.T
	where string // the upstream file, for messages
	// strict: messages the kubelet sends to a service we serve, directly or through fields.
	strict map[protoreflect.FullName]bool
	// lenientFields: an upstream field we leave out is logged even in a strict message.
	lenientFields bool
	// requiredMethods: when set, the methods of a served service that must be declared (the
	// others are logged); when nil, all of them.
	requiredMethods map[protoreflect.FullName]bool
}

func (c *protoComparison) file(ours, up protoreflect.FileDescriptor) {
	if ours.Package() != up.Package() {
		c.t.Errorf("package %q here, %q in %s", ours.Package(), up.Package(), c.where)
	}
	if ours.Syntax() != up.Syntax() {
		c.t.Errorf("syntax %v here, %v in %s", ours.Syntax(), up.Syntax(), c.where)
	}
	c.strict = map[protoreflect.FullName]bool{}
	for i := 0; i < ours.Services().Len(); i++ {
		s := ours.Services().Get(i)
		if protoServiceRoles[s.FullName()] != serves {
			continue
		}
		for j := 0; j < s.Methods().Len(); j++ {
			c.markStrict(s.Methods().Get(j).Input())
		}
	}
	c.messages(ours.Messages(), up.Messages())
	c.enums(ours.Enums(), up.Enums())
	c.services(ours.Services(), up.Services())
}

func (c *protoComparison) markStrict(m protoreflect.MessageDescriptor) {
	if c.strict[m.FullName()] {
		return
	}
	c.strict[m.FullName()] = true
	for i := 0; i < m.Fields().Len(); i++ {
		if sub := m.Fields().Get(i).Message(); sub != nil {
			c.markStrict(sub)
		}
	}
}

// messages compares the messages declared at one level (a file's, or one message's nested ones).
func (c *protoComparison) messages(ours, up protoreflect.MessageDescriptors) {
	for i := 0; i < ours.Len(); i++ {
		m := ours.Get(i)
		u := up.ByName(m.Name())
		if u == nil {
			c.t.Errorf("message %s: not in %s (renamed or invented?)", m.FullName(), c.where)
			continue
		}
		c.fields(m, u)
		c.messages(m.Messages(), u.Messages())
		c.enums(m.Enums(), u.Enums())
	}
	for i := 0; i < up.Len(); i++ {
		if u := up.Get(i); ours.ByName(u.Name()) == nil {
			c.t.Logf("message %s: upstream only (not declared here)", u.FullName())
		}
	}
}

// fieldShape is everything about a field that the wire or its meaning depends on, besides its
// name: each is compared separately, so that a failure names what differs.
var fieldShape = []struct {
	what string
	of   func(protoreflect.FieldDescriptor) string
}{
	{"number", func(f protoreflect.FieldDescriptor) string { return fmt.Sprint(f.Number()) }},
	{"kind", func(f protoreflect.FieldDescriptor) string { return f.Kind().String() }},
	{"type", func(f protoreflect.FieldDescriptor) string {
		switch {
		case f.Message() != nil:
			return string(f.Message().FullName())
		case f.Enum() != nil:
			return string(f.Enum().FullName())
		}
		return "-"
	}},
	{"cardinality", func(f protoreflect.FieldDescriptor) string { return f.Cardinality().String() }},
	{"map", func(f protoreflect.FieldDescriptor) string { return fmt.Sprint(f.IsMap()) }},
	// proto3 `optional` or not: whether "unset" and "zero" can be told apart.
	{"presence", func(f protoreflect.FieldDescriptor) string { return fmt.Sprint(f.HasPresence()) }},
	{"packed", func(f protoreflect.FieldDescriptor) string { return fmt.Sprint(f.IsPacked()) }},
	{"oneof", func(f protoreflect.FieldDescriptor) string {
		if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() {
			return string(o.Name())
		}
		return "-"
	}},
}

func (c *protoComparison) fields(m, u protoreflect.MessageDescriptor) {
	for i := 0; i < m.Fields().Len(); i++ {
		f := m.Fields().Get(i)
		uf := u.Fields().ByName(f.Name())
		if uf == nil {
			if byNumber := u.Fields().ByNumber(f.Number()); byNumber != nil {
				c.t.Errorf("field %s = %d: not in %s, where %d is %s (renamed?)",
					f.FullName(), f.Number(), c.where, f.Number(), byNumber.Name())
			} else {
				c.t.Errorf("field %s = %d: not in %s", f.FullName(), f.Number(), c.where)
			}
			continue
		}
		for _, s := range fieldShape {
			if here, there := s.of(f), s.of(uf); here != there {
				c.t.Errorf("field %s: %s is %s here, %s in %s", f.FullName(), s.what, here, there, c.where)
			}
		}
	}
	for i := 0; i < u.Fields().Len(); i++ {
		uf := u.Fields().Get(i)
		if m.Fields().ByName(uf.Name()) != nil {
			continue
		}
		if c.strict[m.FullName()] && !c.lenientFields {
			c.t.Errorf("field %s = %d: in %s but not here, and the kubelet sends %s to a service we serve: "+
				"declare it (and decide what the plugin does with it)", uf.FullName(), uf.Number(), c.where, m.Name())
		} else {
			c.t.Logf("field %s = %d: upstream only; allowed, as %s is no request to a service we serve",
				uf.FullName(), uf.Number(), m.Name())
		}
	}
}

func (c *protoComparison) enums(ours, up protoreflect.EnumDescriptors) {
	for i := 0; i < ours.Len(); i++ {
		e := ours.Get(i)
		u := up.ByName(e.Name())
		if u == nil {
			c.t.Errorf("enum %s: not in %s", e.FullName(), c.where)
			continue
		}
		for j := 0; j < e.Values().Len(); j++ {
			v := e.Values().Get(j)
			if uv := u.Values().ByName(v.Name()); uv == nil {
				c.t.Errorf("enum value %s = %d: not in %s", v.FullName(), v.Number(), c.where)
			} else if uv.Number() != v.Number() {
				c.t.Errorf("enum value %s: %d here, %d in %s", v.FullName(), v.Number(), uv.Number(), c.where)
			}
		}
		for j := 0; j < u.Values().Len(); j++ {
			if uv := u.Values().Get(j); e.Values().ByName(uv.Name()) == nil {
				c.t.Logf("enum value %s = %d: upstream only", uv.FullName(), uv.Number())
			}
		}
	}
	for i := 0; i < up.Len(); i++ {
		if u := up.Get(i); ours.ByName(u.Name()) == nil {
			c.t.Logf("enum %s: upstream only", u.FullName())
		}
	}
}

func (c *protoComparison) services(ours, up protoreflect.ServiceDescriptors) {
	for i := 0; i < ours.Len(); i++ {
		s := ours.Get(i)
		role, known := protoServiceRoles[s.FullName()]
		if !known {
			c.t.Errorf("service %s: not in protoServiceRoles: say whether the plugin serves or calls it", s.FullName())
		}
		u := up.ByName(s.Name())
		if u == nil {
			c.t.Errorf("service %s: not in %s", s.FullName(), c.where)
			continue
		}
		for j := 0; j < s.Methods().Len(); j++ {
			m := s.Methods().Get(j)
			um := u.Methods().ByName(m.Name())
			if um == nil {
				c.t.Errorf("method %s: not in %s", m.FullName(), c.where)
				continue
			}
			if here, there := methodSignature(m), methodSignature(um); here != there {
				c.t.Errorf("method %s: %s here, %s in %s", m.FullName(), here, there, c.where)
			}
		}
		for j := 0; j < u.Methods().Len(); j++ {
			um := u.Methods().Get(j)
			switch {
			case s.Methods().ByName(um.Name()) != nil:
			case role == serves && (c.requiredMethods == nil || c.requiredMethods[um.FullName()]):
				c.t.Errorf("method %s: in %s but not here, and we serve %s: the caller would get Unimplemented",
					um.FullName(), c.where, s.Name())
			case role == serves:
				c.t.Logf("method %s: upstream only (the runtime calls it only on plugins subscribed to its event)", um.FullName())
			default:
				c.t.Logf("method %s: upstream only (we call %s and need not call it)", um.FullName(), s.Name())
			}
		}
	}
	for i := 0; i < up.Len(); i++ {
		if u := up.Get(i); ours.ByName(u.Name()) == nil {
			c.t.Logf("service %s: upstream only", u.FullName())
		}
	}
}

// methodSignature renders a method as the .proto would: (stream In) returns (stream Out).
func methodSignature(m protoreflect.MethodDescriptor) string {
	stream := func(on bool) string {
		if on {
			return "stream "
		}
		return ""
	}
	return fmt.Sprintf("(%s%s) returns (%s%s)", stream(m.IsStreamingClient()), m.Input().FullName(),
		stream(m.IsStreamingServer()), m.Output().FullName())
}
