// The main() of a fuzz target in a build without libFuzzer (gcc, or clang without RDP_FUZZ):
// runs LLVMFuzzerTestOneInput once on every file named or found (recursively) in a directory
// named on the command line, so that the seed corpus and every saved finding are replayed by
// ctest under whatever sanitizers the build has. Arguments starting with '-' (libFuzzer flags)
// are ignored. Exit 1 when a path cannot be read; a failing input aborts.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, size_t size);

namespace {

bool Replay(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", file.c_str());
    return false;
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  int inputs = 0;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("-", 0) == 0) continue;
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      std::vector<fs::path> files;
      std::error_code type;
      for (fs::recursive_directory_iterator it(arg, ec), end; !ec && it != end;
           it.increment(ec)) {
        if (it->is_regular_file(type)) files.push_back(it->path());
      }
      if (ec) {
        std::fprintf(stderr, "cannot list %s: %s\n", arg.c_str(), ec.message().c_str());
        ok = false;
      }
      std::sort(files.begin(), files.end());
      for (const auto& f : files) ok = Replay(f) && ok, ++inputs;
    } else {
      ok = Replay(arg) && ok;
      ++inputs;
    }
  }
  std::fprintf(stderr, "%d inputs replayed\n", inputs);
  return ok ? 0 : 1;
}
