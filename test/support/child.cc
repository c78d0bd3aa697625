#include "test/support/child.h"

#include <cstdio>

#include "gtest/gtest.h"

namespace rdp::testing {

Child::~Child() {
  Reap();
  if (!::testing::Test::HasFailure()) return;
  const std::string out = output();
  if (out.empty()) return;
  std::fprintf(stderr, "---- output of %s ----\n%s---- end of output ----\n", binary().c_str(),
               out.substr(out.size() > 16384 ? out.size() - 16384 : 0).c_str());
}

int RunToEnd(const std::string& binary, const std::vector<std::string>& args,
             absl::Duration timeout, Child::Options options) {
  Child child(binary, args, std::move(options));
  return child.Wait(timeout);
}

}  // namespace rdp::testing
