#pragma once

// An HTTP GET through libcurl, as a scraper makes one: for the tests of the metrics endpoint.

#include <string>

#include "absl/time/time.h"

namespace rdp::testing {

struct HttpResponse {
  long code = 0;  // 0 when the request failed (no connection, timeout)
  std::string body;
  std::string content_type;
};

HttpResponse HttpGet(const std::string& url, absl::Duration timeout = absl::Seconds(10));

}  // namespace rdp::testing
