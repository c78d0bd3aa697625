#pragma once

// `rdma-device-plugin nri` on a node: one thread that connects to the runtime's NRI socket,
// registers, answers the runtime's calls (nri/session.h) and, whenever the connection ends (the
// runtime restarted, was upgraded, dropped us), connects again: at once when the socket is
// re-created (an inotify watch of its directory, re-added when the directory comes back; the
// runtime binds before it listens, so a connection refused just then is tried again after the
// shortest backoff), and otherwise after a backoff from 100 ms doubling to config.max_backoff.
//
// Two instances on one node (pods of both DaemonSets while a relabelled node swaps them) are
// harmless as long as they are configured alike: the runtime calls plugins in turn and hands the
// second the container as the first adjusted it, so the second finds RLIMIT_MEMLOCK raised and
// leaves it (DecideMemlock never sets what is already there). Two that set different limits would
// make the runtime refuse the container ("plugins ... both tried to set rlimit"). No sleeps: the thread
// waits in poll(2) on the connection, the watch and a stop eventfd.
//
// Calls are answered as they arrive, on that thread, without blocking: answering is pure
// computation on the request, and writes are non-blocking (queued until the socket takes them),
// so a CreateContainer is answered well within the runtime's 2 s timeout.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "nri/memlock.h"
#include "nri/service.h"
#include "nri/session.h"
#include "serving/fatal_latch.h"

namespace rdp::nri {

struct PluginConfig {
  std::string socket_path = "/var/run/nri/nri.sock";  // the runtime's (NRI's default)
  Registration registration;
  std::uint64_t memlock = kUnlimited;  // RLIMIT_MEMLOCK for containers with our devices
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // A connection that is not registered, configured and synchronized this long after it was
  // made is dropped and made again (the runtime gives a plugin 5 s to register).
  absl::Duration setup_timeout = absl::Seconds(10);
};

// InvalidArgument naming the flag for a socket path a unix socket cannot have (empty, too long
// for sockaddr_un) and for a registration the runtime would refuse.
absl::Status ValidateConfig(const PluginConfig& config);

class NriPlugin {
 public:
  // `metrics` must outlive the plugin. They are updated before the plugin answers the runtime's
  // next call: once the runtime has the answer to Synchronize, registrations counts the
  // connection and connected is true.
  NriPlugin(PluginConfig config, NriMetrics* metrics);
  ~NriPlugin();  // Stop()
  NriPlugin(const NriPlugin&) = delete;
  NriPlugin& operator=(const NriPlugin&) = delete;

  // Starts the connection thread; the runtime need not be there yet. Internal when the thread's
  // descriptors cannot be made.
  absl::Status Start();
  // Closes the connection (the runtime then forgets the plugin) and joins the thread. Idempotent.
  void Stop();
  // Blocks until `stop_fd` is readable (OK) or the thread could not go on (its error).
  absl::Status Wait(int stop_fd);

 private:
  void Loop();
  // Runs one connection until it ends; true when it got as far as synchronized.
  bool RunConnection(int fd);
  // Waits up to `timeout` for the stop eventfd or the socket's (re)appearance.
  enum class Woken { kStop, kAppeared, kTimeout };
  Woken WaitToConnect(absl::Duration timeout);
  void Watch();
  void Fatal(const absl::Status& status);  // the thread cannot go on: ends the process's Wait

  const PluginConfig config_;
  NriMetrics* const metrics_;
  serving::FatalLatch fatal_;
  bool stopping_ = false;   // Stop() only
  bool stop_seen_ = false;  // connection thread only: the stop eventfd was readable
  int stop_fd_ = -1;
  int inotify_fd_ = -1;
  int watch_ = -1;  // connection thread only
  std::thread thread_;
};

}  // namespace rdp::nri
