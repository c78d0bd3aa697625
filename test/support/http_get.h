#pragma once

// An HTTP GET as a scraper makes one (sim/http_get.h) and the lines of what it read: for the
// tests of the metrics endpoint.

#include <string>
#include <vector>

#include "sim/http_get.h"

namespace rdp::testing {

using sim::HttpGet;
using sim::HttpResponse;

// The non-empty lines of a scrape, and whether one of them is exactly `line`.
std::vector<std::string> Lines(const std::string& text);
bool HasLine(const std::string& text, const std::string& line);

}  // namespace rdp::testing
