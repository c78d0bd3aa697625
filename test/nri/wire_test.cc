#include "nri/wire.h"

#include <string>

#include "gtest/gtest.h"

namespace rdp::nri {
namespace {

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

TEST(NriWireTest, OneSmallMessageIsOneFrame) {
  std::string out;
  AppendFrames(kRuntimeServiceConn, {1, MessageType::kRequest, 0, "abc"}, &out);
  // mux: conn 2, 13 bytes; ttrpc: length 3, stream 1, request, no flags; data.
  EXPECT_EQ(out, Bytes({0, 0, 0, 2, 0, 0, 0, 13, 0, 0, 0, 3, 0, 0, 0, 1, 1, 0}) + "abc");
}

TEST(NriWireTest, LargeMessagesAreSplitIntoFramesTheRuntimesReaderTakes) {
  const std::string data(10000, 'x');
  std::string out;
  AppendFrames(kPluginServiceConn, {7, MessageType::kResponse, 0, data}, &out);
  // 10010 bytes of ttrpc message: 4096 + 4096 + 1818, each with its 8-byte header.
  ASSERT_EQ(out.size(), 10010u + 3 * kMuxHeaderSize);
  std::size_t at = 0;
  for (std::size_t want : {4096u, 4096u, 1818u}) {
    EXPECT_EQ(out.substr(at, 4), Bytes({0, 0, 0, 1}));
    const auto* p = reinterpret_cast<const unsigned char*>(out.data() + at + 4);
    EXPECT_EQ((std::size_t{p[2]} << 8) | p[3], want);
    at += kMuxHeaderSize + want;
  }
  TrunkDecoder decoder;
  ASSERT_TRUE(decoder.Feed(out).ok());
  auto m = decoder.Next();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->conn, kPluginServiceConn);
  EXPECT_EQ(m->message.stream_id, 7u);
  EXPECT_EQ(m->message.type, MessageType::kResponse);
  EXPECT_EQ(m->message.data, data);
  EXPECT_FALSE(decoder.Next().has_value());
  // Nothing of the message is held back: the same bytes again make the same message.
  ASSERT_TRUE(decoder.Feed(out).ok());
  m = decoder.Next();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->message.stream_id, 7u);
  EXPECT_EQ(m->message.data, data);
  EXPECT_FALSE(decoder.Next().has_value());
}

TEST(NriWireTest, MessagesArriveWholeWhateverTheReadBoundaries) {
  std::string out;
  AppendFrames(kPluginServiceConn, {1, MessageType::kRequest, 0, std::string(5000, 'a')}, &out);
  AppendFrames(kRuntimeServiceConn, {1, MessageType::kResponse, 0, ""}, &out);
  AppendFrames(kPluginServiceConn, {3, MessageType::kRequest, 0, "b"}, &out);
  TrunkDecoder decoder;
  std::vector<TrunkDecoder::Message> got;
  for (char c : out) {  // one byte at a time
    ASSERT_TRUE(decoder.Feed(std::string_view(&c, 1)).ok());
    while (auto m = decoder.Next()) got.push_back(*m);
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].message.data.size(), 5000u);
  EXPECT_EQ(got[1].conn, kRuntimeServiceConn);
  EXPECT_EQ(got[1].message.data, "");
  EXPECT_EQ(got[2].message.stream_id, 3u);
  EXPECT_EQ(got[2].message.data, "b");
}

TEST(NriWireTest, InterleavedConnectionsAreReassembledApart) {
  std::string a, b;
  AppendFrames(kPluginServiceConn, {1, MessageType::kRequest, 0, std::string(5000, 'a')}, &a);
  AppendFrames(kRuntimeServiceConn, {1, MessageType::kResponse, 0, "r"}, &b);
  // a's first frame, then b whole, then a's second frame.
  const std::size_t first = kMuxHeaderSize + kMuxWriteChunk;
  TrunkDecoder decoder;
  ASSERT_TRUE(decoder.Feed(a.substr(0, first) + b + a.substr(first)).ok());
  auto m1 = decoder.Next();
  auto m2 = decoder.Next();
  ASSERT_TRUE(m1 && m2);
  EXPECT_EQ(m1->conn, kRuntimeServiceConn);
  EXPECT_EQ(m2->conn, kPluginServiceConn);
  EXPECT_EQ(m2->message.data, std::string(5000, 'a'));
}

TEST(NriWireTest, FramesOfOtherConnectionsAreDropped) {
  std::string out;
  AppendFrames(5, {1, MessageType::kRequest, 0, "x"}, &out);
  AppendFrames(kPluginServiceConn, {1, MessageType::kRequest, 0, "y"}, &out);
  TrunkDecoder decoder;
  ASSERT_TRUE(decoder.Feed(out).ok());
  auto m = decoder.Next();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->message.data, "y");
  EXPECT_FALSE(decoder.Next().has_value());
}

TEST(NriWireTest, OversizedFramesAndMessagesEndTheConnection) {
  {
    TrunkDecoder decoder;
    // A mux payload of 0x01000000 bytes: more than 4 MiB + 10.
    const absl::Status s = decoder.Feed(Bytes({0, 0, 0, 1, 1, 0, 0, 0}));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("mux frame"), std::string::npos) << s;
    EXPECT_FALSE(decoder.Feed("").ok());  // and stays failed
  }
  {
    TrunkDecoder decoder;
    // A ttrpc header announcing 4 MiB + 1 of data (0x00400001).
    const absl::Status s = decoder.Feed(Bytes({0, 0, 0, 1, 0, 0, 0, 10,  //
                                               0, 0x40, 0, 1, 0, 0, 0, 1, 1, 0}));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("ttrpc message"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace rdp::nri
