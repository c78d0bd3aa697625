// ThreadRole (serving/thread_role.h): clang checks at compile time that guarded state is touched
// only in the role; at run time, two holders at once abort.

#include "serving/thread_role.h"

#include <thread>

#include "gtest/gtest.h"

namespace rdp::serving {
namespace {

struct Owned {
  ThreadRole role;
  int value ABSL_GUARDED_BY(role) = 0;
  void Bump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(role) { ++value; }
};

TEST(ThreadRoleTest, HandedFromThreadToThread) {
  Owned owned;
  {
    ThreadRole::Scope scope(&owned.role);
    owned.Bump();
  }
  std::thread t([&owned] {
    ThreadRole::Scope scope(&owned.role);
    owned.Bump();
  });
  t.join();
  ThreadRole::Scope scope(&owned.role);
  EXPECT_EQ(owned.value, 2);
}

// What clang refuses at compile time ("acquiring mutex that is already held"), hidden from it
// here so that the run-time check can be seen.
void HoldTwice(Owned& owned) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  ThreadRole::Scope first(&owned.role);
  ThreadRole::Scope second(&owned.role);
}

TEST(ThreadRoleDeathTest, TwoHoldersAtOnceAbort) {
  Owned owned;
  EXPECT_DEATH(HoldTwice(owned), "");
}

}  // namespace
}  // namespace rdp::serving
