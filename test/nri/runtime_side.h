#pragma once

// The runtime's side of an NRI connection, as far as the tests need it: the calls it makes
// (ttrpc requests on kPluginServiceConn), its answer to RegisterPlugin, and the decoding of what
// the plugin sent. Built on nri/wire.h; the real runtime (github.com/containerd/nri's adaptation)
// drives the binary in test/kubelet/nri.

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nri/wire.h"
#include "proto/nri.pb.h"
#include "proto/ttrpc.pb.h"

namespace rdp::nri::testing {

namespace api = ::nri::pkg::api::v1alpha1;

// The bytes of a call of the Plugin service on stream `stream`.
inline std::string Call(std::uint32_t stream, const std::string& method,
                        const std::string& payload, std::uint32_t conn = kPluginServiceConn) {
  ::ttrpc::Request req;
  req.set_service("nri.pkg.api.v1alpha1.Plugin");
  req.set_method(method);
  req.set_payload(payload);
  std::string out;
  AppendFrames(conn, {stream, MessageType::kRequest, 0, req.SerializeAsString()}, &out);
  return out;
}

// The runtime's answer to RegisterPlugin: `code` 0 accepts.
inline std::string RegisterAnswer(int code = 0, const std::string& message = "") {
  ::ttrpc::Response resp;
  resp.mutable_status()->set_code(code);
  resp.mutable_status()->set_message(message);
  if (code == 0) resp.set_payload(api::Empty().SerializeAsString());
  std::string out;
  AppendFrames(kRuntimeServiceConn, {1, MessageType::kResponse, 0, resp.SerializeAsString()}, &out);
  return out;
}

struct Sent {
  std::uint32_t conn = 0;
  TtrpcMessage message;
  ::ttrpc::Request request;    // when message.type is a request
  ::ttrpc::Response response;  // when it is a response
};

// Every message in `bytes` (what the plugin wrote), decoded.
inline std::vector<Sent> Decode(const std::string& bytes) {
  TrunkDecoder decoder;
  EXPECT_TRUE(decoder.Feed(bytes).ok());
  std::vector<Sent> out;
  while (auto m = decoder.Next()) {
    Sent s;
    s.conn = m->conn;
    s.message = m->message;
    if (m->message.type == MessageType::kRequest) {
      EXPECT_TRUE(s.request.ParseFromString(m->message.data));
    } else {
      EXPECT_TRUE(s.response.ParseFromString(m->message.data));
    }
    out.push_back(std::move(s));
  }
  // Framed again, the messages are the bytes: nothing is left of a message written in part.
  std::string again;
  for (const Sent& s : out) AppendFrames(s.conn, s.message, &again);
  EXPECT_EQ(again, bytes) << "the plugin wrote part of a message";
  return out;
}

// A CreateContainerRequest for a container with these device nodes.
inline api::CreateContainerRequest Creating(const std::string& name,
                                            const std::vector<std::string>& devices) {
  api::CreateContainerRequest req;
  req.mutable_pod()->set_id("pod-1");
  req.mutable_pod()->set_name("trainer-0");
  req.mutable_pod()->set_namespace_("ml");
  req.mutable_container()->set_id("0123456789abcdef0123");
  req.mutable_container()->set_pod_sandbox_id("pod-1");
  req.mutable_container()->set_name(name);
  for (const std::string& path : devices) {
    api::LinuxDevice* d = req.mutable_container()->mutable_linux()->add_devices();
    d->set_path(path);
    d->set_type("c");
  }
  return req;
}

}  // namespace rdp::nri::testing
