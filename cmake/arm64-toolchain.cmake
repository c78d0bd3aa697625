# Cross-compiling for linux/arm64 (aarch64: Grace, Graviton, Ampere) on a Debian amd64 machine:
# `scripts/build.sh --arch arm64`. The compiler is crossbuild-essential-arm64's; the libraries
# are Debian's :arm64 packages (Multi-Arch: same, installed beside the amd64 ones by
# `scripts/install-deps.sh --arch arm64`), found through their multiarch directory
# /usr/lib/aarch64-linux-gnu; protoc and grpc_cpp_plugin are the machine's own (amd64) programs.
# Test programs run under qemu-aarch64-static (Debian's qemu-user-static), which finds the arm64
# loader and libraries where multiarch installed them.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Programs (protoc, grpc_cpp_plugin, python3, go) are the build machine's; libraries, headers and
# packages' CMake files are the target's, which CMAKE_LIBRARY_ARCHITECTURE selects.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# pkg-config (hwloc): the arm64 .pc files, not the machine's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
find_program(RDP_QEMU_AARCH64 qemu-aarch64-static)
if(RDP_QEMU_AARCH64)
  # ctest (and gtest_discover_tests) run the arm64 test programs through it; QEMU_LD_PREFIX
  # is "/", where libc6:arm64 put /lib/ld-linux-aarch64.so.1.
  set(CMAKE_CROSSCOMPILING_EMULATOR ${RDP_QEMU_AARCH64})
endif()
