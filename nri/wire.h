#pragma once

// The bytes of an NRI connection (github.com/containerd/nri pkg/net/multiplex, ttrpc's
// PROTOCOL.md): one unix stream (the trunk) carries frames of several logical connections, each
// frame an 8-byte header (connection ID, payload length: uint32 big-endian) and its payload; each
// logical connection is a byte stream of ttrpc messages, each a 10-byte header (data length,
// stream ID: uint32 big-endian; message type, flags: one byte each) and at most 4 MiB of data.
// Pure: no I/O, no protobuf.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace rdp::nri {

// The runtime calls the plugin's services on this logical connection...
inline constexpr std::uint32_t kPluginServiceConn = 1;
// ... and serves the plugin's calls (RegisterPlugin) on this one.
inline constexpr std::uint32_t kRuntimeServiceConn = 2;

inline constexpr std::size_t kMuxHeaderSize = 8;
inline constexpr std::size_t kTtrpcHeaderSize = 10;
inline constexpr std::size_t kTtrpcMaxData = 4u << 20;
// The largest mux payload the runtime writes (a whole ttrpc message) and so accepts reading.
inline constexpr std::size_t kMuxMaxPayload = kTtrpcHeaderSize + kTtrpcMaxData;
// The largest payload we put in one mux frame. The runtime's ttrpc reads a logical connection
// through a 4 KiB bufio.Reader, and its mux hands each frame whole to one Read (ENOMEM, and the
// connection is lost, when the frame exceeds the buffer given): frames of at most 4 KiB always fit.
inline constexpr std::size_t kMuxWriteChunk = 4096;

enum class MessageType : std::uint8_t { kRequest = 1, kResponse = 2, kData = 3 };

// ttrpc flags: a Data message that ends the sender's side; one without data.
inline constexpr std::uint8_t kFlagRemoteClosed = 0x1;
inline constexpr std::uint8_t kFlagNoData = 0x4;

struct TtrpcMessage {
  std::uint32_t stream_id = 0;  // odd: initiated by the connection's client
  MessageType type = MessageType::kRequest;
  std::uint8_t flags = 0;
  std::string data;  // a serialized ttrpc.Request or ttrpc.Response (or stream data)
};

// Appends `message` to `out` as the mux frames of logical connection `conn`: its ttrpc header and
// data, split into payloads of at most kMuxWriteChunk bytes. The caller keeps data within
// kTtrpcMaxData.
void AppendFrames(std::uint32_t conn, const TtrpcMessage& message, std::string* out);

// Reads the trunk: feed it the bytes as they arrive; it yields whole ttrpc messages with their
// logical connection, in order. Frames of connections other than kPluginServiceConn and
// kRuntimeServiceConn are dropped, as the runtime's mux drops frames of connections it has not
// opened. Not thread-safe.
class TrunkDecoder {
 public:
  // Takes bytes read from the trunk. DataLoss naming the limit when a mux payload or a ttrpc
  // message is larger than the protocol allows (a ttrpc header whose reserved first byte is not
  // zero is one): the stream cannot be trusted any more and the connection must be dropped.
  // After an error every call fails.
  absl::Status Feed(std::string_view bytes);

  struct Message {
    std::uint32_t conn = 0;
    TtrpcMessage message;
  };
  // The next whole message, if one has arrived.
  std::optional<Message> Next();

 private:
  absl::Status DecodeConn(std::uint32_t conn, std::string& stream);

  std::string trunk_;
  std::map<std::uint32_t, std::string> conns_;  // each logical connection's undecoded bytes
  std::deque<Message> ready_;
  absl::Status error_;
};

}  // namespace rdp::nri
