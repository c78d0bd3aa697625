#include "cmd/dra_serve_cmd.h"

#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/env.h"
#include "base/log.h"
#include "cmd/discovery_flags.h"
#include "dra/cdi.h"
#include "dra/checkpoint.h"
#include "dra/dra_server.h"
#include "dra/driver.h"
#include "dra/model.h"
#include "server/config.h"
#include "topology/discovery.h"

namespace rdp::cmd {
namespace {

struct DraFlags {
  DiscoveryFlags discovery;
  std::string kubelet_dir = "/var/lib/kubelet";
  std::string driver_name = dra::kDefaultDriverName;
  std::string node_name;
  std::string cdi_root = dra::kDefaultCdiRoot;
  std::string kubeconfig;
  std::string mode = "exclusive";
  // dra prepare-local
  std::string claim_ns = "default";
  std::string claim_name = "local";
  std::string claim_uid;
  std::vector<std::string> devices;
};

std::shared_ptr<spdlog::logger> Log() { return Logger("dra"); }

// WIRING POINT (dra-api): the API server's claims. dra/claim_reader.h (ApiClaimReader, on branch
// dra-api) replaces this with a client built from --kubeconfig or the in-cluster service account;
// until then every claim that is not in the checkpoint fails with Unavailable, which the
// kubelet retries (Unprepare and claims already prepared work).
class NoApiClaimReader final : public dra::ClaimReader {
 public:
  absl::StatusOr<std::vector<dra::AllocatedDevice>> Read(const dra::ClaimRef&,
                                                         const std::string&,
                                                         absl::Time) override {
    return absl::UnavailableError("this build has no API-server client (dra/claim_reader.h)");
  }
};

// `dra prepare-local`: the claim given on the command line, allocated as given.
class StaticClaimReader final : public dra::ClaimReader {
 public:
  StaticClaimReader(std::string uid, std::vector<dra::AllocatedDevice> devices)
      : uid_(std::move(uid)), devices_(std::move(devices)) {}
  absl::StatusOr<std::vector<dra::AllocatedDevice>> Read(const dra::ClaimRef& ref,
                                                         const std::string&,
                                                         absl::Time) override {
    if (ref.uid != uid_) return absl::NotFoundError(absl::StrCat("no claim with uid ", ref.uid));
    return devices_;
  }

 private:
  const std::string uid_;
  const std::vector<dra::AllocatedDevice> devices_;
};

struct Resolved {
  topology::DiscoveryOptions discovery;
  dra::DriverConfig driver;
  dra::DraServerConfig server;
};

absl::StatusOr<Resolved> Resolve(DraFlags& f) {
  Resolved r;
  auto discovery = f.discovery.Options();
  if (!discovery.ok()) return discovery.status();
  r.discovery = *discovery;
  if (absl::StatusOr<server::Mode> mode = server::ParseMode(f.mode); !mode.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--mode: ", mode.status().message()));
  }
  if (f.node_name.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) == 0) f.node_name = host;
  }
  if (f.node_name.empty()) {
    return absl::InvalidArgumentError("--node-name (or NODE_NAME) is required");
  }
  if (f.driver_name.empty() || f.driver_name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--driver-name '", f.driver_name, "': not a DNS subdomain"));
  }
  if (f.kubelet_dir.empty() || f.cdi_root.empty()) {
    return absl::InvalidArgumentError("--kubelet-dir and --cdi-root must not be empty");
  }
  r.driver.driver_name = f.driver_name;
  r.driver.node_name = f.node_name;
  r.server.kubelet_dir = f.kubelet_dir;
  r.server.driver_name = f.driver_name;
  return r;
}

// The node as the driver sees it: a snapshot from discovery at start, discovered again when a
// claim names a device it lacks (an HCA hot-plugged since), at most once per
// kRediscoverInterval.
constexpr absl::Duration kRediscoverInterval = absl::Seconds(2);

class NodeSnapshot {
 public:
  NodeSnapshot(topology::DiscoveryOptions options, std::shared_ptr<Env> env)
      : discoverer_(std::move(options), std::move(env)) {}

  absl::Status Init() {
    absl::StatusOr<topology::TopologyPtr> t = discoverer_.Discover();
    if (!t.ok()) return t.status();
    absl::MutexLock lock(&mu_);
    current_ = *t;
    return absl::OkStatus();
  }
  topology::TopologyPtr Current() const {
    absl::MutexLock lock(&mu_);
    return current_;
  }
  // A fresh snapshot, or null when the last try was too recent or discovery failed.
  topology::TopologyPtr Rediscover() {
    absl::MutexLock lock(&mu_);
    if (absl::Now() - last_try_ < kRediscoverInterval) return nullptr;
    last_try_ = absl::Now();
    absl::StatusOr<topology::TopologyPtr> t = discoverer_.Discover();
    if (!t.ok()) {
      Log()->warn("discovering the node again failed: {}", t.status().ToString());
      return nullptr;
    }
    current_ = *t;
    return current_;
  }

 private:
  topology::Discoverer discoverer_;
  mutable absl::Mutex mu_;
  topology::TopologyPtr current_ ABSL_GUARDED_BY(mu_);
  absl::Time last_try_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The pieces every DRA run needs: the node, the CDI directory, the checkpoint, the driver.
struct Node {
  std::shared_ptr<Env> env;
  std::unique_ptr<NodeSnapshot> snapshot;
  std::unique_ptr<dra::CdiStore> cdi;
  std::unique_ptr<dra::Checkpoint> checkpoint;
  std::unique_ptr<dra::Driver> driver;
};

Node StartNode(const DraFlags& f, const Resolved& r, dra::ClaimReader& reader) {
  Node n;
  n.env = NewNodeEnv(r.discovery.Roots());
  n.snapshot = std::make_unique<NodeSnapshot>(r.discovery, n.env);
  if (absl::Status s = n.snapshot->Init(); !s.ok()) {
    Log()->error("discovery failed: {}", std::string(s.message()));
    Exit(1);
  }
  n.cdi = std::make_unique<dra::CdiStore>(f.cdi_root, r.driver.driver_name);
  n.checkpoint = std::make_unique<dra::Checkpoint>(
      (std::filesystem::path(r.server.PluginDir()) / dra::kCheckpointFile).string());
  NodeSnapshot* snapshot = n.snapshot.get();
  n.driver = std::make_unique<dra::Driver>(
      r.driver, reader, *n.cdi, *n.checkpoint, [snapshot] { return snapshot->Current(); }, n.env,
      [snapshot] { return snapshot->Rediscover(); });
  if (absl::Status s = n.driver->Start(); !s.ok()) {
    Log()->error("cannot start: {}", s.ToString());
    Exit(1);
  }
  return n;
}

int Serve(const DraFlags& f, const Resolved& r) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  const int signals = ::signalfd(-1, &stop, SFD_CLOEXEC);
  if (signals < 0) {
    Log()->error("cannot start: signalfd: {}", std::strerror(errno));
    return 1;
  }
  NoApiClaimReader reader;  // WIRING POINT (dra-api), see above; f.kubeconfig goes to it
  if (!f.kubeconfig.empty()) {
    Log()->warn("--kubeconfig {} is not used: this build has no API-server client", f.kubeconfig);
  }
  Node node = StartNode(f, r, reader);
  Log()->info("DRA driver {} on node {} ({} HCA(s)), CDI specs in {}, mode {}",
              r.driver.driver_name, r.driver.node_name, node.snapshot->Current()->hcas().size(),
              f.cdi_root,
              f.mode);
  dra::DraServer server(r.server, node.driver.get());
  if (absl::Status s = server.Start(); !s.ok()) {
    Log()->error("cannot start: {}", s.ToString());
    ::close(signals);
    return 1;
  }
  const absl::Status why = server.Wait(signals);
  if (why.ok()) {
    struct signalfd_siginfo info = {};
    const bool got = ::read(signals, &info, sizeof info) == static_cast<ssize_t>(sizeof info);
    Log()->info("{} received: stopping", got && info.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
  }
  ::close(signals);
  server.Stop();
  Log()->info("stopped; removed {} and {}", r.server.RegistrationSocket(), r.server.DraSocket());
  if (!why.ok()) {
    Log()->error("exiting: {}", std::string(why.message()));
    return 1;
  }
  return 0;
}

// Prepares one claim given on the command line (its devices allocated from this node's pool)
// through the driver, as NodePrepareResources would, and prints the answer as JSON.
int PrepareLocal(const DraFlags& f, const Resolved& r) {
  std::vector<dra::AllocatedDevice> devices;
  for (const std::string& d : f.devices) devices.push_back({"hca", r.driver.node_name, d});
  StaticClaimReader reader(f.claim_uid, devices);
  Node node = StartNode(f, r, reader);
  auto results = node.driver->Prepare({{f.claim_ns, f.claim_uid, f.claim_name}});
  const auto& result = results.begin()->second;
  if (!result.ok()) {
    std::cout << nlohmann::json({{"error", result.status().ToString()}}).dump(2) << "\n";
    return 1;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const dra::PreparedDevice& d : *result) {
    out.push_back({{"requestNames", d.requests},
                   {"poolName", d.pool},
                   {"deviceName", d.device},
                   {"cdiDeviceIds", d.cdi_ids}});
  }
  std::cout << nlohmann::json({{"devices", out}, {"cdiSpec", node.cdi->PathOf(f.claim_uid)}})
                   .dump(2)
            << "\n";
  return 0;
}

void AddCommonFlags(CLI::App* app, DraFlags& f) {
  app->add_option("--kubelet-dir", f.kubelet_dir,
                  "The kubelet's root directory (plugins/ and plugins_registry/ below it)")
      ->envname("RDP_KUBELET_DIR")
      ->capture_default_str();
  app->add_option("--driver-name", f.driver_name, "The DRA driver name")
      ->envname("RDP_DRIVER_NAME")
      ->capture_default_str();
  app->add_option("--node-name", f.node_name, "This node's name: our pool (default: host name)")
      ->envname("NODE_NAME");
  app->add_option("--cdi-root", f.cdi_root, "Where the claims' CDI spec files are written")
      ->envname("RDP_CDI_ROOT")
      ->capture_default_str();
}

}  // namespace

void AddDraServeFlags(CLI::App* dra) {
  auto f = std::make_shared<DraFlags>();
  f->discovery.Register(dra);
  AddCommonFlags(dra, *f);
  dra->add_option("--kubeconfig", f->kubeconfig,
                  "kubeconfig for the API server (default: the in-cluster service account)")
      ->envname("KUBECONFIG");
  dra->add_option("--mode", f->mode, "shared or exclusive")
      ->envname("RDP_MODE")
      ->capture_default_str();
  dra->callback([f, dra] {
    if (!dra->get_subcommands().empty()) return;  // `dra slices` and the like
    absl::StatusOr<Resolved> r = Resolve(*f);
    if (!r.ok()) {
      Log()->error("{}", std::string(r.status().message()));
      Exit(kExitUsage);
    }
    if (int code = Serve(*f, *r); code != 0) Exit(code);
  });

  CLI::App* local = dra->add_subcommand(
      "prepare-local",
      "Prepare one claim given here (devices of this node's pool) as NodePrepareResources "
      "would: write its CDI spec and checkpoint entry, print the answer");
  local->group("");  // hidden: a tool for tests and debugging
  local->fallthrough();  // `dra`'s flags after it too
  local->add_option("--claim-uid", f->claim_uid, "The claim's UID")->required();
  local->add_option("--claim-namespace", f->claim_ns, "The claim's namespace")
      ->capture_default_str();
  local->add_option("--claim-name", f->claim_name, "The claim's name")->capture_default_str();
  local->add_option("--device", f->devices, "A device name of our pool (repeatable)")
      ->required();
  local->callback([f] {
    absl::StatusOr<Resolved> r = Resolve(*f);
    if (!r.ok()) {
      Log()->error("{}", std::string(r.status().message()));
      Exit(kExitUsage);
    }
    if (int code = PrepareLocal(*f, *r); code != 0) Exit(code);
  });
}

}  // namespace rdp::cmd
