#pragma once

// An HTTP GET through kube/'s transport (libcurl), as a scraper makes one: the demo's scrape of
// the plugin's metrics endpoint, and the tests' (test/support/http_get.h).

#include <string>

#include "absl/time/time.h"

namespace rdp::sim {

struct HttpResponse {
  long code = 0;  // 0 when the request failed (no connection, timeout)
  std::string body;
  std::string content_type;
};

// GET `url`, bounded by `timeout`. Thread-safe.
HttpResponse HttpGet(const std::string& url, absl::Duration timeout = absl::Seconds(10));

}  // namespace rdp::sim
