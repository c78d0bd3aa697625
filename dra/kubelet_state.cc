#include "dra/kubelet_state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace rdp::dra {
namespace {

constexpr char kKind[] = "DRACheckpoint";
constexpr char kApiVersion[] = "checkpoint.dra.kubelet.k8s.io/v1";

std::array<std::uint32_t, 256> CrcTable() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < table.size(); ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

// The file's bytes and modification time, both of the one inode opened (the kubelet renames a
// new file over it).
absl::Status ReadWithTime(const std::string& path, std::string& text, absl::Time& written) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(err)));
  }
  absl::Status s;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    s = absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  } else {
    written = absl::TimeFromTimespec(st.st_mtim);
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        s = absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
      }
      if (n <= 0) break;
      text.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return s;
}

}  // namespace

std::uint32_t Crc32Ieee(std::string_view data) {
  static const std::array<std::uint32_t, 256> table = CrcTable();
  std::uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

absl::StatusOr<KubeletClaims> ReadKubeletClaims(const std::string& path,
                                                std::string_view driver) {
  KubeletClaims out;
  out.path = path;
  std::string text;
  if (absl::Status s = ReadWithTime(path, text, out.written); !s.ok()) return s;
  auto bad = [&path](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why));
  };
  const nlohmann::json file = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (file.is_discarded() || !file.is_object()) return bad("not a JSON object");
  if (file.contains("version") || file.contains("entries")) {
    return absl::UnimplementedError(absl::StrCat(
        path, ": a DRA checkpoint of a kubelet before 1.32 (\"version\"/\"entries\"), whose "
              "checksum cannot be verified here"));
  }
  if (!file.contains("Data") || !file["Data"].is_string() || !file.contains("Checksum") ||
      !file["Checksum"].is_number_unsigned() ||
      file["Checksum"].get<std::uint64_t>() > std::numeric_limits<std::uint32_t>::max()) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": not a kubelet DRA checkpoint of a format we know (no string "
                           "\"Data\" and 32-bit \"Checksum\")"));
  }
  const std::string& data = file["Data"].get_ref<const std::string&>();
  const std::uint32_t want = file["Checksum"].get<std::uint32_t>();
  if (const std::uint32_t got = Crc32Ieee(data); got != want) {
    return bad(absl::StrCat("checksum mismatch (file says ", want, ", its data has ", got, ")"));
  }
  const nlohmann::json d = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (d.is_discarded() || !d.is_object()) return bad("its Data is not a JSON object");
  const std::string kind = d.value("kind", "");
  const std::string api_version = d.value("apiVersion", "");
  if (kind != kKind || api_version != kApiVersion) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": kind '", kind, "' apiVersion '", api_version, "', not ", kKind,
                     " ", kApiVersion));
  }
  const auto list = d.find("ClaimInfoStateList");
  if (list == d.end() || list->is_null()) return out;  // the kubelet holds no claim
  if (!list->is_array()) return bad("ClaimInfoStateList is not a list");
  for (const nlohmann::json& claim : *list) {
    if (!claim.is_object() || !claim.contains("ClaimUID") || !claim["ClaimUID"].is_string()) {
      return bad("a ClaimInfoStateList entry without a ClaimUID");
    }
    const auto drivers = claim.find("DriverState");
    if (drivers == claim.end() || drivers->is_null()) continue;
    if (!drivers->is_object()) return bad("a DriverState that is not an object");
    if (drivers->contains(std::string(driver))) out.uids.insert(claim["ClaimUID"].get<std::string>());
  }
  return out;
}

}  // namespace rdp::dra
