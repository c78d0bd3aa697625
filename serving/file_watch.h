#pragma once

// What a server needs to notice that its unix socket, or the directory it lives in, was removed
// or replaced (a kubelet restart wiping its directory): file identities that survive tmpfs's
// inode reuse, and the events of a non-blocking inotify descriptor. Shared by the device-plugin
// lifecycle (PluginServer) and the DRA driver's (dra::DraServer).

#include <sys/inotify.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"

namespace rdp::serving {

// Identity of a file: its device and inode, 0 when it does not exist. No time is in it: a chmod
// or chown (which moves the change time) leaves a socket the same socket. A file removed and
// made again may get the old inode number back (ext4, xfs); callers that must see that watch
// for the removal itself (inotify IN_DELETE): a socket of ours that is gone reads 0.
std::uint64_t FileId(const std::string& path);

// Identity of a directory (device and inode), 0 when there is none (or it is no directory).
std::uint64_t DirId(const std::string& path);

// One inotify event: the watch it belongs to (-1 for IN_Q_OVERFLOW), its mask, and the name of
// the file in the watched directory ("" for the directory itself).
struct InotifyEvent {
  int wd;
  std::uint32_t mask;
  std::string name;
};

// Reads the queued events of a non-blocking inotify descriptor; calls on_event(event) for each.
// An IN_IGNORED can belong to a watch replaced long ago (inotify_rm_watch queues one, and so
// does the removal of a directory no longer watched for): callers compare wd with their watch.
template <typename F>
void ReadInotifyEvents(int fd, F on_event) {
  alignas(struct inotify_event) char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    for (ssize_t off = 0; off < n;) {
      const auto* ev = reinterpret_cast<const struct inotify_event*>(buf + off);
      off += sizeof(struct inotify_event) + ev->len;
      on_event(InotifyEvent{ev->wd, ev->mask,
                            ev->len == 0 ? std::string() : std::string(ev->name)});
    }
  }
}

}  // namespace rdp::serving
