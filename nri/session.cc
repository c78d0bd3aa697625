#include "nri/session.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "proto/nri.pb.h"
#include "proto/ttrpc.pb.h"

namespace rdp::nri {
namespace {

namespace api = ::nri::pkg::api::v1alpha1;

constexpr int kInvalidArgument = 3;
// Our one call, RegisterPlugin: the first stream a client opens (client streams are odd).
constexpr std::uint32_t kRegisterStream = 1;
// The NRI version we speak (proto/nri.proto's upstream), sent at registration.
constexpr char kNriVersion[] = "v0.12.3";

}  // namespace

absl::Status ValidateRegistration(const Registration& r) {
  if (r.name.empty()) return absl::InvalidArgumentError("--nri-plugin-name: empty");
  for (char c : r.name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '+' &&
        c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nri-plugin-name '", r.name, "': only letters, digits and _ . + - are allowed"));
    }
  }
  if (r.index.size() != 2 || !std::isdigit(static_cast<unsigned char>(r.index[0])) ||
      !std::isdigit(static_cast<unsigned char>(r.index[1]))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nri-plugin-index '", r.index, "': two digits, such as 50"));
  }
  return absl::OkStatus();
}

std::string Session::Open() {
  api::RegisterPluginRequest req;
  req.set_plugin_name(registration_.name);
  req.set_plugin_idx(registration_.index);
  req.set_nri_version(kNriVersion);
  ::ttrpc::Request call;
  call.set_service(kRuntimeService);
  call.set_method("RegisterPlugin");
  call.set_payload(req.SerializeAsString());
  std::string out;
  AppendFrames(kRuntimeServiceConn,
               {kRegisterStream, MessageType::kRequest, 0, call.SerializeAsString()}, &out);
  return out;
}

absl::Status Session::OnBytes(std::string_view in, std::string* out) {
  if (absl::Status s = decoder_.Feed(in); !s.ok()) return s;
  while (auto next = decoder_.Next()) {
    if (absl::Status s = OnMessage(next->conn, next->message, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Session::OnMessage(std::uint32_t conn, const TtrpcMessage& m, std::string* out) {
  if (conn == kRuntimeServiceConn) {
    // The runtime's answer to our RegisterPlugin (we open no other stream).
    if (m.type != MessageType::kResponse || m.stream_id != kRegisterStream) {
      Logger("nri")->debug("ignoring a message of type {} on stream {} of the runtime's service",
                           static_cast<int>(m.type), m.stream_id);
      return absl::OkStatus();
    }
    ::ttrpc::Response resp;
    if (!resp.ParseFromString(m.data)) {
      return absl::DataLossError("the answer to RegisterPlugin does not parse");
    }
    if (resp.has_status() && resp.status().code() != 0) {
      return absl::FailedPreconditionError(absl::StrCat("the runtime refused the registration: ",
                                                        resp.status().message(), " (code ",
                                                        resp.status().code(), ")"));
    }
    registered_ = true;
    return absl::OkStatus();
  }
  // kPluginServiceConn: the runtime's calls, answered as ttrpc's own server does.
  if (m.stream_id % 2 != 1) {
    Answer(m.stream_id,
           {kInvalidArgument, "StreamID must be odd for client initiated streams", ""}, out);
    return absl::OkStatus();
  }
  if (m.type != MessageType::kRequest) {
    // No method of ours streams.
    Answer(m.stream_id, {kInvalidArgument, "no streaming method is served", ""}, out);
    return absl::OkStatus();
  }
  if (m.stream_id <= last_stream_) {
    Answer(m.stream_id, {kInvalidArgument, "StreamID cannot be re-used and must increment", ""},
           out);
    return absl::OkStatus();
  }
  last_stream_ = m.stream_id;
  ::ttrpc::Request call;
  if (!call.ParseFromString(m.data)) {
    Answer(m.stream_id, {kInvalidArgument, "unmarshal request error", ""}, out);
    return absl::OkStatus();
  }
  Logger("nri")->debug("call {}/{} on stream {}: {} bytes", call.service(), call.method(),
                       m.stream_id, call.payload().size());
  Answer(m.stream_id, service_.Handle(call.service(), call.method(), call.payload()), out);
  return absl::OkStatus();
}

void Session::Answer(std::uint32_t stream_id, const CallResult& result, std::string* out) {
  ::ttrpc::Response resp;
  // ttrpc's server always sends a status, code 0 when OK.
  resp.mutable_status()->set_code(result.code);
  if (result.code != 0) {
    resp.mutable_status()->set_message(result.message);
  } else {
    resp.set_payload(result.payload);
  }
  AppendFrames(kPluginServiceConn,
               {stream_id, MessageType::kResponse, 0, resp.SerializeAsString()}, out);
}

}  // namespace rdp::nri
