#pragma once

// An HTTP GET through libcurl, as a scraper makes one, and the lines of what it read: for the
// tests of the metrics endpoint.

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace rdp::testing {

struct HttpResponse {
  long code = 0;  // 0 when the request failed (no connection, timeout)
  std::string body;
  std::string content_type;
};

HttpResponse HttpGet(const std::string& url, absl::Duration timeout = absl::Seconds(10));

// The non-empty lines of a scrape, and whether one of them is exactly `line`.
std::vector<std::string> Lines(const std::string& text);
bool HasLine(const std::string& text, const std::string& line);

}  // namespace rdp::testing
