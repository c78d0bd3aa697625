// The paths of this build tree that the tests use (test/support/temp_dir.h). Compiled with them
// as its own definitions (CMakeLists.txt): the only translation unit whose compile depends on
// where the tree is, so that ccache serves every other one to a clone in another directory.
#include "test/support/temp_dir.h"

namespace rdp::testing {

std::string TestData(const std::string& name) { return std::string(RDP_TEST_DATA) + "/" + name; }

std::string PluginBinary() { return RDP_BINARY; }

}  // namespace rdp::testing
