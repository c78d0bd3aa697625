#include "sim/http_get.h"

#include "kube/transport.h"

namespace rdp::sim {

HttpResponse HttpGet(const std::string& url, absl::Duration timeout) {
  kube::HttpRequest request;
  request.method = "GET";
  request.url = url;
  request.timeout = timeout;
  absl::StatusOr<kube::HttpResponse> got = kube::NewCurlTransport({})->RoundTrip(request);
  HttpResponse r;
  if (got.ok()) {
    r.code = got->status;
    r.body = std::move(got->body);
    r.content_type = std::move(got->content_type);
  }
  return r;
}

}  // namespace rdp::sim
