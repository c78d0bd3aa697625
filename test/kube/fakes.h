#pragma once

// Test doubles for kube/: a clock that only moves when told or slept on, a Transport answered by
// a function, and answers as the API server writes them.

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "kube/client.h"
#include "kube/config.h"
#include "kube/transport.h"
#include "nlohmann/json.hpp"

namespace rdp::kube::testing {

class FakeClock : public Clock {
 public:
  absl::Time Now() override { return now_; }
  // Moves time on at once, unless the wait is already ended (a Shutdown).
  bool SleepFor(absl::Duration d, WaitEnder& ender) override {
    if (ender.Ended()) return true;
    sleeps.push_back(d);
    now_ += d;
    return false;
  }
  void Advance(absl::Duration d) { now_ += d; }

  std::vector<absl::Duration> sleeps;

 private:
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

// Every exchange is recorded and answered by `handler` (which must be thread-safe when the
// client is used from several threads; the record is).
class FuncTransport : public Transport {
 public:
  using Handler = std::function<absl::StatusOr<HttpResponse>(const HttpRequest&)>;
  explicit FuncTransport(Handler handler) : handler_(std::move(handler)) {}
  absl::StatusOr<HttpResponse> RoundTrip(const HttpRequest& request) override {
    {
      absl::MutexLock lock(mu_.get());
      requests->push_back(request);
    }
    return handler_(request);
  }
  // A stream: `stream_handler` (Unimplemented when unset), recorded as RoundTrip's are.
  using StreamHandler = std::function<absl::StatusOr<HttpResponse>(
      const HttpRequest&, const std::function<void(int)>&,
      const std::function<bool(std::string_view)>&)>;
  absl::StatusOr<HttpResponse> Stream(
      const HttpRequest& request, const std::function<void(int)>& on_open,
      const std::function<bool(std::string_view)>& on_data) override {
    {
      absl::MutexLock lock(mu_.get());
      requests->push_back(request);
    }
    if (!stream_handler) return Transport::Stream(request, on_open, on_data);
    return stream_handler(request, on_open, on_data);
  }
  StreamHandler stream_handler;
  // Shared so that a test keeps reading it after the client took the transport.
  std::shared_ptr<std::vector<HttpRequest>> requests =
      std::make_shared<std::vector<HttpRequest>>();

 private:
  Handler handler_;
  std::unique_ptr<absl::Mutex> mu_ = std::make_unique<absl::Mutex>();
};

// An environment of these variables only.
inline GetEnvFunc Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// <root>/var/run/secrets/kubernetes.io/serviceaccount with a token and a CA, as a pod has it;
// its path.
inline std::string ServiceAccount(const std::string& root) {
  const std::string dir = root + "/var/run/secrets/kubernetes.io/serviceaccount";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/token") << "sa-token\n";
  std::ofstream(dir + "/ca.crt") << "-----BEGIN CERTIFICATE-----\n";
  return dir;
}

inline HttpResponse Json(int status, const nlohmann::json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump();
  return r;
}

// A metav1.Status body as the API server sends it with an error.
inline HttpResponse StatusBody(int status, const std::string& reason, const std::string& message) {
  return Json(status, {{"kind", "Status"},
                       {"apiVersion", "v1"},
                       {"status", "Failure"},
                       {"reason", reason},
                       {"message", message},
                       {"code", status}});
}

}  // namespace rdp::kube::testing
