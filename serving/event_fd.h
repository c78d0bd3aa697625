#pragma once

// Wake-ups between threads through an eventfd: a serving lifecycle's poll(2) loop waits on
// several (stop, a background thread's fatal error, a rescan request) beside inotify
// descriptors and signalfds.

namespace rdp::serving {

// A new non-blocking, close-on-exec eventfd; -1 with errno set on failure.
int NewEventFd();
// Makes `fd` readable. Never blocks; a failure (the counter at its maximum) is logged.
void SignalEventFd(int fd);
// Reads `fd` until it is no longer readable.
void DrainEventFd(int fd);

}  // namespace rdp::serving
