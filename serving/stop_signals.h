#pragma once

// SIGTERM and SIGINT as a file descriptor, for the serving subcommands (serve, dra): blocked in
// every thread (gRPC's included: call before starting any), taken from a signalfd.

#include <string>

namespace rdp::serving {

// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread it starts) and returns a
// signalfd that becomes readable when one arrives; -1 with errno set on failure.
int BlockStopSignals();

// The name of the stop signal waiting on `signal_fd` ("SIGINT" or "SIGTERM"), read from it.
std::string ReadStopSignal(int signal_fd);

}  // namespace rdp::serving
