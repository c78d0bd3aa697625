#pragma once

// The node the demo runs against by default: test/data/dgx-h100-like.xml (an hwloc export, see
// test/data/README.md), embedded at build time so that the demo needs no data files.

#include <string>

namespace rdp::sim {

const std::string& BundledNodeXml();

}  // namespace rdp::sim
