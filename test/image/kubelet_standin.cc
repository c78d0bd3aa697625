// The kubelet's side of scripts/image-test.sh, on the host: serves the Registration service on
// <device-plugins>/kubelet.sock and the pod-resources List on --pod-resources-socket (the
// project's KubeletSim and FakePodResources, real gRPC on real unix sockets), waits for the
// containerised plugin to register through the bind-mounted directory, follows its ListAndWatch,
// and makes a GetPreferredAllocation and an Allocate against the plugin's socket in that same
// directory. Every step prints one line; the last is "ok" (then it keeps serving until SIGTERM
// or SIGINT, exit 0) or "FAIL: <why>" (exit 1). Flags: --help.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "sim/fake_pod_resources.h"
#include "sim/kubelet_sim.h"

namespace {

namespace fs = std::filesystem;
using rdp::sim::KubeletSim;

struct Flags {
  std::string device_plugins;        // host directory mounted as the kubelet's device-plugins
  std::string pod_resources_socket;  // host path of the pod-resources socket
  std::string dev_root;              // fixture root whose dev/infiniband the plugin sees
  std::string mode = "exclusive";
  std::string resource = "rdma/hca";
  std::string endpoint;              // the plugin's socket name
  int devices = 0;                   // devices ListAndWatch must list, all Healthy
  std::string timeout = "120s";      // for each wait
};

int Fail(const std::string& why) {
  std::cout << "FAIL: " << why << std::endl;
  return 1;
}

// Checks one Allocate answer: device specs under /dev/infiniband that exist in the fixture
// (so the plugin read the mounted tree), rdma_cm among them, the HCA environment set.
std::string CheckAllocate(const v1beta1::ContainerAllocateResponse& r, const Flags& f,
                          const std::vector<std::string>& ids, int* uverbs) {
  std::set<std::string> paths;
  for (const auto& d : r.devices()) {
    if (!absl::StartsWith(d.host_path(), "/dev/infiniband/") ||
        d.container_path() != d.host_path() || d.permissions() != "rw") {
      return absl::StrCat("device spec ", d.host_path(), " -> ", d.container_path(), " (",
                          d.permissions(), ")");
    }
    const fs::path in_fixture = fs::path(f.dev_root) / d.host_path().substr(1);
    std::error_code ec;
    if (!fs::exists(in_fixture, ec)) {
      return absl::StrCat("device spec ", d.host_path(), " not in the fixture (", in_fixture.string(), ")");
    }
    paths.insert(d.host_path());
    if (absl::StartsWith(d.host_path(), "/dev/infiniband/uverbs")) ++*uverbs;
  }
  if (!paths.count("/dev/infiniband/rdma_cm")) return "no /dev/infiniband/rdma_cm device spec";
  const auto& envs = r.envs();
  for (const char* key : {"RDMA_HCA_NAMES", "RDMA_HCA_PCI", "NCCL_IB_HCA"}) {
    if (!envs.count(key) || envs.at(key).empty()) return absl::StrCat("no ", key, " in the envs");
  }
  if (f.mode == "exclusive" && envs.at("RDMA_HCA_PCI") != absl::StrJoin(ids, ",")) {
    return absl::StrCat("RDMA_HCA_PCI=", envs.at("RDMA_HCA_PCI"), " for devices ",
                        absl::StrJoin(ids, ","));
  }
  return "";
}

int Run(const Flags& f, const sigset_t& stop) {
  absl::Duration timeout;
  if (!absl::ParseDuration(f.timeout, &timeout) || timeout <= absl::ZeroDuration()) {
    return Fail("--timeout " + f.timeout);
  }
  KubeletSim kubelet(f.device_plugins);
  if (absl::Status s = kubelet.Start(); !s.ok()) return Fail(s.ToString());
  rdp::sim::FakePodResources pods(f.pod_resources_socket);  // no pod holds anything
  if (absl::Status s = pods.Start(); !s.ok()) return Fail(s.ToString());
  std::cout << "listening on " << kubelet.dir() << "/kubelet.sock and " << f.pod_resources_socket
            << std::endl;

  auto reg = kubelet.WaitForRegistration(0, timeout);
  if (!reg) return Fail(absl::StrCat("no registration within ", f.timeout));
  std::cout << "registered: version=" << reg->version << " endpoint=" << reg->endpoint
            << " resource=" << reg->resource_name << " get_preferred_allocation_available="
            << (reg->get_preferred_allocation_available ? "true" : "false") << std::endl;
  if (reg->resource_name != f.resource) return Fail("resource " + reg->resource_name);
  if (reg->endpoint != f.endpoint) return Fail("endpoint " + reg->endpoint);
  if (!fs::is_socket(fs::path(f.device_plugins) / reg->endpoint)) {
    return Fail("no socket " + reg->endpoint + " in " + f.device_plugins);
  }

  auto healthy = [](const KubeletSim::Devices& d) {
    return std::all_of(d.begin(), d.end(), [](const auto& x) { return x.health() == "Healthy"; });
  };
  auto devices = kubelet.WaitForDevices(
      [&](const KubeletSim::Devices& d) {
        return static_cast<int>(d.size()) == f.devices && healthy(d);
      },
      timeout);
  if (!devices) {
    auto last = kubelet.WaitForDevices([](const auto&) { return true; }, absl::ZeroDuration());
    return Fail(absl::StrCat("ListAndWatch did not list ", f.devices, " Healthy devices within ",
                             f.timeout, " (last list: ", last ? last->size() : 0, " devices",
                             last && !healthy(*last) ? ", not all Healthy" : "", ")"));
  }
  std::vector<std::string> ids;
  for (const auto& d : *devices) ids.push_back(d.id());
  std::cout << "ListAndWatch: " << ids.size() << " devices, all Healthy (" << ids.front()
            << " ... " << ids.back() << ")" << std::endl;

  auto stub = kubelet.PluginStub();
  std::vector<std::string> chosen = {ids.front()};
  if (f.mode == "exclusive") {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    v1beta1::PreferredAllocationResponse response;
    grpc::Status status = stub->GetPreferredAllocation(
        &context, rdp::sim::PreferredRequest(ids, {}, 2), &response);
    if (!status.ok()) return Fail("GetPreferredAllocation: " + status.error_message());
    if (response.container_responses_size() != 1) return Fail("GetPreferredAllocation: no answer");
    const auto& got = response.container_responses(0).deviceids();
    chosen.assign(got.begin(), got.end());
    std::cout << "GetPreferredAllocation(size=2, available=" << ids.size()
              << ") -> " << absl::StrJoin(chosen, ",") << std::endl;
    const std::set<std::string> distinct(chosen.begin(), chosen.end());
    if (distinct.size() != 2 ||
        !std::all_of(chosen.begin(), chosen.end(), [&](const std::string& id) {
          return std::find(ids.begin(), ids.end(), id) != ids.end();
        })) {
      return Fail("GetPreferredAllocation did not choose 2 of the listed devices");
    }
  }

  v1beta1::AllocateRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : chosen) c->add_devices_ids(id);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1beta1::AllocateResponse response;
  grpc::Status status = stub->Allocate(&context, request, &response);
  if (!status.ok()) return Fail("Allocate: " + status.error_message());
  if (response.container_responses_size() != 1) return Fail("Allocate: no container response");
  const auto& r = response.container_responses(0);
  int uverbs = 0;
  if (std::string bad = CheckAllocate(r, f, chosen, &uverbs); !bad.empty()) {
    return Fail("Allocate: " + bad);
  }
  // Exclusive: one uverbs per HCA allocated; shared: every HCA's.
  const int want_uverbs = f.mode == "exclusive" ? static_cast<int>(chosen.size()) : -1;
  if (want_uverbs >= 0 && uverbs != want_uverbs) {
    return Fail(absl::StrCat("Allocate: ", uverbs, " uverbs devices for ", want_uverbs, " HCAs"));
  }
  std::cout << "Allocate(" << absl::StrJoin(chosen, ",") << ") -> " << r.devices_size()
            << " device specs (" << uverbs << " uverbs), RDMA_HCA_NAMES="
            << r.envs().at("RDMA_HCA_NAMES") << std::endl;
  std::cout << "ok" << std::endl;

  int signo = 0;
  sigwait(&stop, &signo);
  pods.Stop();
  kubelet.Stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread: SIGTERM and SIGINT are taken by sigwait only.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  Flags f;
  CLI::App app{"Kubelet stand-in for scripts/image-test.sh"};
  app.add_option("--device-plugins", f.device_plugins, "Device-plugin directory")->required();
  app.add_option("--pod-resources-socket", f.pod_resources_socket, "Pod-resources socket path")
      ->required();
  app.add_option("--dev-root", f.dev_root, "Fixture root with dev/infiniband")->required();
  app.add_option("--mode", f.mode, "exclusive or shared")
      ->check(CLI::IsMember({"exclusive", "shared"}));
  app.add_option("--resource", f.resource, "Resource name the plugin must register");
  app.add_option("--endpoint", f.endpoint, "Socket name the plugin must register")->required();
  app.add_option("--devices", f.devices, "Devices ListAndWatch must list")->required();
  app.add_option("--timeout", f.timeout, "Deadline of each wait");
  CLI11_PARSE(app, argc, argv);
  return Run(f, stop);
}
