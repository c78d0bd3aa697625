#pragma once

// Shared pieces of the DRA driver tests: a fake node (SysfsFixture, four HCAs, RoCE ones
// without umad), its topology from sysfs, a fake ClaimReader, and a Driver over them.

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "dra/cdi.h"
#include "dra/checkpoint.h"
#include "dra/claim_reader.h"
#include "dra/driver.h"
#include "dra/metadata.h"
#include "dra/model.h"
#include "node/node.h"
#include "gtest/gtest.h"
#include "test/support/test_node.h"
#include "topology/discovery.h"

namespace rdp::dra::testing {

inline constexpr char kDriver[] = "rdma.example.com";
inline constexpr char kNode[] = "node-a";
// Device names of rdp::testing::FourCards().
inline constexpr char kHca0[] = "hca-0000-1a-00-0";  // mlx5_0: uverbs0, umad0, issm0
inline constexpr char kHca1[] = "hca-0000-3a-00-0";  // mlx5_1: uverbs1, umad1, issm1

// Claims by UID; counts the reads; Unavailable for every claim while `down`. Each claim is
// reserved for a pod of its own with one container using it whole (the common case), unless
// SetReserved and SetPod say which pods and containers use what.
class FakeClaimReader : public ClaimReader {
 public:
  absl::StatusOr<ClaimAllocation> Read(const ClaimRef& ref, const std::string& driver,
                                       absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    ++reads_;
    deadlines_.push_back(deadline);
    last_driver_ = driver;
    if (down_) return absl::UnavailableError("connection refused");
    std::string uid = ref.uid;
    if (uid.empty()) {  // by name
      for (const auto& [u, name] : names_) {
        if (name == ref.name) uid = u;
      }
    }
    auto it = claims_.find(uid);
    if (it == claims_.end()) return absl::NotFoundError("resourceclaims \"x\" not found");
    if (!it->second.ok()) return it->second.status();
    ClaimAllocation out{uid, *it->second, {}, {}};
    if (auto p = pod_claim_names_.find(uid); p != pod_claim_names_.end()) {
      out.pod_claim_name = p->second;
    }
    if (auto p = reserved_.find(uid); p != reserved_.end()) {
      out.reserved_for = p->second;
    } else {
      out.reserved_for = {{ref.ns, "pod-" + NameOf(uid, ref.name), "pod-uid-" + uid}};
    }
    return out;
  }
  absl::StatusOr<PodClaims> ReadPod(const PodRef& pod, absl::Time) override {
    absl::MutexLock lock(&mu_);
    ++pod_reads_;
    if (down_) return absl::UnavailableError("connection refused");
    if (auto it = pod_errors_.find(pod.uid); it != pod_errors_.end()) return it->second;
    if (auto it = pods_.find(pod.uid); it != pods_.end()) return it->second;
    // The default pod of a claim: one container using it whole.
    for (const auto& [uid, name] : names_) {
      if (pod.uid == "pod-uid-" + uid) return PodClaims{pod, {{"c", {{name, ""}}}}};
    }
    if (pod.uid.rfind("pod-uid-", 0) == 0) {
      return PodClaims{pod, {{"c", {{pod.name.substr(4), ""}}}}};
    }
    return absl::NotFoundError("pods \"x\" not found");
  }
  void Set(const std::string& uid, absl::StatusOr<std::vector<AllocatedDevice>> devices) {
    absl::MutexLock lock(&mu_);
    claims_.insert_or_assign(uid, std::move(devices));
  }
  // The claim's name (for reads by name and the pods that use it by name).
  void SetName(const std::string& uid, const std::string& name) {
    absl::MutexLock lock(&mu_);
    names_[uid] = name;
  }
  // The claim was made from a template: the pod calls it `pod_claim_name`.
  void SetPodClaimName(const std::string& uid, const std::string& pod_claim_name) {
    absl::MutexLock lock(&mu_);
    pod_claim_names_[uid] = pod_claim_name;
  }
  // The claim is reserved for `pods`; ReadPod answers them as SetPod set them.
  void SetReserved(const std::string& uid, std::vector<PodRef> pods) {
    absl::MutexLock lock(&mu_);
    reserved_[uid] = std::move(pods);
  }
  void SetPod(const PodClaims& pod) {
    absl::MutexLock lock(&mu_);
    pods_[pod.pod.uid] = pod;
  }
  // ReadPod answers the pod with what the API client makes of this Pod object.
  void SetPodObject(const nlohmann::json& pod) { SetPod(ParsePodClaims(pod)); }
  void SetPodError(const std::string& pod_uid, absl::Status error) {
    absl::MutexLock lock(&mu_);
    pod_errors_[pod_uid] = std::move(error);
  }
  void SetDown(bool down) {
    absl::MutexLock lock(&mu_);
    down_ = down;
  }
  int reads() const {
    absl::MutexLock lock(&mu_);
    return reads_;
  }
  int pod_reads() const {
    absl::MutexLock lock(&mu_);
    return pod_reads_;
  }
  std::vector<absl::Time> deadlines() const {
    absl::MutexLock lock(&mu_);
    return deadlines_;
  }
  std::string last_driver() const {
    absl::MutexLock lock(&mu_);
    return last_driver_;
  }

 private:
  std::string NameOf(const std::string& uid, const std::string& fallback) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = names_.find(uid);
    return it != names_.end() ? it->second : fallback;
  }

  mutable absl::Mutex mu_;
  std::map<std::string, absl::StatusOr<std::vector<AllocatedDevice>>> claims_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> names_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> pod_claim_names_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<PodRef>> reserved_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, PodClaims> pods_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> pod_errors_ ABSL_GUARDED_BY(mu_);
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  int reads_ ABSL_GUARDED_BY(mu_) = 0;
  int pod_reads_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
  std::string last_driver_ ABSL_GUARDED_BY(mu_);
};

inline AllocatedDevice Dev(const std::string& device, const std::string& request = "hca") {
  return {request, kNode, device, ""};
}

// Claim UIDs as the API server makes them (UUIDs).
inline constexpr char kUid1[] = "0c1a1e00-0000-4000-8000-000000000001";
inline constexpr char kUid2[] = "0c1a1e00-0000-4000-8000-000000000002";
inline constexpr char kUid3[] = "0c1a1e00-0000-4000-8000-000000000003";

// A node (four HCAs, rdma_cm), a CDI dir and a plugin dir in a temp dir, and a Driver.
class DraNode {
 public:
  // The node core reads the fixture (`cards`: FourCards() unless given): discovery from sysfs
  // (counted), no rate limit on Rediscover.
  explicit DraNode(const std::vector<sim::FixtureHca>& cards = rdp::testing::FourCards())
      : node_(cards), env_(node_.NodeEnv()) {
    node::Options options;
    options.rediscover_interval = absl::ZeroDuration();
    options.logger = "dra";
    node::Sources sources;
    sources.env = env_;
    sources.scan = [env = env_] { return topology::ReadSysfsHcas(*env); };
    sources.discover = [this]() -> absl::StatusOr<topology::TopologyPtr> {
      ++discoveries_;
      if (topology::TopologyPtr t = ReadTopology()) return t;
      return absl::NotFoundError("no sysfs");
    };
    core_ = std::make_unique<node::Node>(options, std::move(sources));
    EXPECT_TRUE(core_->Init().ok());
    NewDriver();
  }

  // A driver as after a plugin restart: a new CdiStore, Checkpoint and Driver on the same dirs.
  void NewDriver() {
    driver_.reset();
    cdi_ = std::make_unique<CdiStore>(cdi_dir(), kDriver);
    metadata_ = std::make_unique<MetadataStore>(metadata_dir());
    checkpoint_ = std::make_unique<Checkpoint>(checkpoint_path());
    DriverConfig config;
    config.driver_name = kDriver;
    config.node_name = kNode;
    config.api_timeout = absl::Seconds(1);
    config.kubelet_state = kubelet_state_;
    if (configure_) configure_(config);
    ClaimReader& reader = reader_override_ ? *reader_override_ : reader_;
    driver_ = std::make_unique<Driver>(config, reader, *cdi_, *metadata_, *checkpoint_, *core_,
                                       status_);
    ASSERT_TRUE(driver_->Start().ok());
  }

  // The kubelet's DRA checkpoint the next NewDriver's driver reads at start ("": none).
  void SetKubeletState(std::string path) { kubelet_state_ = std::move(path); }
  // What the next NewDriver's driver reads claims and pods through (not owned; null:
  // reader()).
  void SetReader(ClaimReader* r) { reader_override_ = r; }
  // Where the next NewDriver's driver writes claims' status.devices (not owned).
  void SetStatusWriter(ClaimStatusWriter* w) { status_ = w; }
  // Changes the next NewDriver's driver config after the defaults above are set.
  void Configure(std::function<void(DriverConfig&)> edit) { configure_ = std::move(edit); }
  // Discoveries of the node so far, the first included.
  int discoveries() const { return discoveries_; }
  // The node's topology read from sysfs now.
  topology::TopologyPtr ReadTopology() const {
    auto hcas = topology::ReadSysfsHcas(*env_);
    if (!hcas.ok()) return nullptr;
    return std::make_shared<const topology::Topology>(std::vector<int>{0, 1}, *hcas,
                                                      std::vector<topology::Gpu>{});
  }

  Driver& driver() { return *driver_; }
  FakeClaimReader& reader() { return reader_; }
  CdiStore& cdi() { return *cdi_; }
  MetadataStore& metadata() { return *metadata_; }
  rdp::testing::TestNode& node() { return node_; }
  Env& env() { return *env_; }
  const topology::Topology& topology() const { return *core_->Now()->topology; }
  node::Node& core() { return *core_; }
  std::string cdi_dir() const { return node_.dir().Sub("cdi"); }
  std::string plugin_dir() const { return node_.dir().Sub("plugins/" + std::string(kDriver)); }
  std::string metadata_dir() const { return plugin_dir() + "/" + kMetadataSubDir; }
  std::string checkpoint_path() const { return plugin_dir() + "/" + kCheckpointFile; }
  std::string root() const { return node_.dir().path(); }

  // The files in the CDI dir (names), sorted.
  std::vector<std::string> CdiFiles() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(cdi_dir(), ec)) {
      out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  rdp::testing::TestNode node_;
  std::shared_ptr<Env> env_;
  std::atomic<int> discoveries_{0};
  std::unique_ptr<node::Node> core_;
  FakeClaimReader reader_;
  std::unique_ptr<CdiStore> cdi_;
  std::unique_ptr<MetadataStore> metadata_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Driver> driver_;
  ClaimStatusWriter* status_ = nullptr;
  ClaimReader* reader_override_ = nullptr;
  std::function<void(DriverConfig&)> configure_;
  std::string kubelet_state_;
};

// The file at `path` as JSON (discarded when it is not).
inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, false);
}

// The CDI device of the claim's request in its spec (null, and a test failure, when there is
// none).
inline nlohmann::json SpecDevice(DraNode& n, const std::string& uid, const std::string& request) {
  const nlohmann::json spec = ReadJson(n.cdi().PathOf(uid));
  for (const auto& d : spec["devices"]) {
    if (d["name"] == CdiDeviceName(uid, request)) return d;
  }
  ADD_FAILURE() << "no device " << CdiDeviceName(uid, request) << " in " << spec.dump();
  return nullptr;
}

// The env of a request's CDI device, KEY -> value.
inline std::map<std::string, std::string> SpecEnv(DraNode& n, const std::string& uid,
                                                  const std::string& request = "hca") {
  std::map<std::string, std::string> out;
  const nlohmann::json device = SpecDevice(n, uid, request);
  for (const auto& kv : device["containerEdits"]["env"]) {
    const std::string s = kv.get<std::string>();
    out[s.substr(0, s.find('='))] = s.substr(s.find('=') + 1);
  }
  return out;
}

}  // namespace rdp::dra::testing
