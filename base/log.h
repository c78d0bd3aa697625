#pragma once

// One spdlog logger per module ("topology", "allocator", "server", ...), all writing to stderr
// with the same pattern and level. The level is set once from --log-level.

#include <memory>
#include <string>

#include "spdlog/spdlog.h"

namespace rdp {

// The module's logger, created on first use. Thread-safe.
std::shared_ptr<spdlog::logger> Logger(const std::string& module);

// "trace", "debug", "info", "warn", "error", "off". Returns false for an unknown level.
bool SetLogLevel(const std::string& level);

}  // namespace rdp
