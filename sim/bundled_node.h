#pragma once

// The nodes the tools lay out by name (sim/fixture_node.h), embedded at build time so that the
// demo needs no data files: test/data/dgx-h100-like.xml, the demo's default, and
// test/data/dgx-roles.xml (hwloc exports, see test/data/README.md). "" when the file was missing
// at configure time.

#include <string>

namespace rdp::sim {

const std::string& BundledNodeXml();
const std::string& BundledRolesNodeXml();

}  // namespace rdp::sim
