#pragma once

// sim::Child (sim/child.h) for tests: when the current test has failed, its destructor prints the
// tail of the child's output.

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "sim/child.h"

namespace rdp::testing {

class Child : public sim::Child {
 public:
  using sim::Child::Child;
  // SIGKILLs a child still running and reaps it; when the current test has failed, prints the
  // tail of its output.
  ~Child() override;
};

// Runs `binary args...` to its end (bounded by `timeout`) and returns its exit code (-1 as Wait).
int RunToEnd(const std::string& binary, const std::vector<std::string>& args,
             absl::Duration timeout = absl::Seconds(20), Child::Options options = {});

}  // namespace rdp::testing
