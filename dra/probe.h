#pragma once

// `rdma-device-plugin probe --dra`: is the DRA driver answering the kubelet? The chart's
// liveness/readiness probe in DRA mode.

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace rdp::dra {

// The registration socket the driver serves and the kubelet's plugin watcher finds.
std::string RegistrationSocket(const std::string& kubelet_dir, const std::string& driver);

// GetInfo on RegistrationSocket(kubelet_dir, driver), which must name a DRAPlugin called
// `driver`, then an empty NodeUnprepareResources on the endpoint it gives: both served, each
// within `timeout`. OK when both answer; otherwise an error naming the socket and what failed.
absl::Status Probe(const std::string& kubelet_dir, const std::string& driver,
                   absl::Duration timeout);

}  // namespace rdp::dra
