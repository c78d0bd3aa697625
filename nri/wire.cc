#include "nri/wire.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace rdp::nri {
namespace {

void PutU32(std::uint32_t v, char* p) {
  p[0] = static_cast<char>(v >> 24);
  p[1] = static_cast<char>(v >> 16);
  p[2] = static_cast<char>(v >> 8);
  p[3] = static_cast<char>(v);
}

std::uint32_t GetU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (std::uint32_t{u[0]} << 24) | (std::uint32_t{u[1]} << 16) | (std::uint32_t{u[2]} << 8) |
         std::uint32_t{u[3]};
}

}  // namespace

void AppendFrames(std::uint32_t conn, const TtrpcMessage& message, std::string* out) {
  std::string bytes(kTtrpcHeaderSize, '\0');
  PutU32(static_cast<std::uint32_t>(message.data.size()), bytes.data());
  PutU32(message.stream_id, bytes.data() + 4);
  bytes[8] = static_cast<char>(message.type);
  bytes[9] = static_cast<char>(message.flags);
  bytes += message.data;
  for (std::size_t at = 0; at < bytes.size(); at += kMuxWriteChunk) {
    const std::size_t n = std::min(kMuxWriteChunk, bytes.size() - at);
    char header[kMuxHeaderSize];
    PutU32(conn, header);
    PutU32(static_cast<std::uint32_t>(n), header + 4);
    out->append(header, kMuxHeaderSize);
    out->append(bytes, at, n);
  }
}

absl::Status TrunkDecoder::Feed(std::string_view bytes) {
  if (!error_.ok()) return error_;
  trunk_.append(bytes);
  std::size_t at = 0;
  while (trunk_.size() - at >= kMuxHeaderSize) {
    const std::uint32_t conn = GetU32(trunk_.data() + at);
    const std::uint32_t size = GetU32(trunk_.data() + at + 4);
    if (size > kMuxMaxPayload) {
      error_ = absl::DataLossError(absl::StrCat("a mux frame of ", size,
                                                " bytes: more than the protocol's ",
                                                kMuxMaxPayload));
      return error_;
    }
    if (trunk_.size() - at - kMuxHeaderSize < size) break;
    if (conn == kPluginServiceConn || conn == kRuntimeServiceConn) {
      std::string& stream = conns_[conn];
      stream.append(trunk_, at + kMuxHeaderSize, size);
      if (absl::Status s = DecodeConn(conn, stream); !s.ok()) {
        error_ = s;
        return error_;
      }
    }
    at += kMuxHeaderSize + size;
  }
  trunk_.erase(0, at);
  return absl::OkStatus();
}

absl::Status TrunkDecoder::DecodeConn(std::uint32_t conn, std::string& stream) {
  std::size_t at = 0;
  while (stream.size() - at >= kTtrpcHeaderSize) {
    const char* h = stream.data() + at;
    const std::uint32_t length = GetU32(h);
    if (length > kTtrpcMaxData) {
      return absl::DataLossError(absl::StrCat("a ttrpc message of ", length,
                                              " bytes on connection ", conn,
                                              ": more than the protocol's ", kTtrpcMaxData));
    }
    if (stream.size() - at - kTtrpcHeaderSize < length) break;
    Message m;
    m.conn = conn;
    m.message.stream_id = GetU32(h + 4);
    m.message.type = static_cast<MessageType>(static_cast<unsigned char>(h[8]));
    m.message.flags = static_cast<std::uint8_t>(h[9]);
    m.message.data.assign(stream, at + kTtrpcHeaderSize, length);
    ready_.push_back(std::move(m));
    at += kTtrpcHeaderSize + length;
  }
  stream.erase(0, at);
  return absl::OkStatus();
}

std::optional<TrunkDecoder::Message> TrunkDecoder::Next() {
  if (ready_.empty()) return std::nullopt;
  Message m = std::move(ready_.front());
  ready_.pop_front();
  return m;
}

}  // namespace rdp::nri
