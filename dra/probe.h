#pragma once

// `rdma-device-plugin probe --dra [--ready]`: is the DRA driver answering the kubelet (the
// chart's startup and liveness probes in DRA mode), and has the kubelet registered it (with
// --ready: the readiness probe)?

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace rdp::dra {

// The registration socket the driver serves and the kubelet's plugin watcher finds.
std::string RegistrationSocket(const std::string& kubelet_dir, const std::string& driver);

// GetInfo on RegistrationSocket(kubelet_dir, driver), which must name a DRAPlugin called
// `driver`, then an empty NodeUnprepareResources on the endpoint it gives: both served, each
// within `timeout`. With `registered`, also grpc.health.v1.Health/Check on the endpoint, which
// must say SERVING: the kubelet has the driver registered (FailedPrecondition saying so
// otherwise). OK when all answer; otherwise an error naming the socket and what failed.
absl::Status Probe(const std::string& kubelet_dir, const std::string& driver,
                   absl::Duration timeout, bool registered = false);

}  // namespace rdp::dra
