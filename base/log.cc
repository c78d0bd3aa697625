#include "base/log.h"

#include <mutex>

#include "spdlog/sinks/stdout_color_sinks.h"

namespace rdp {
namespace {

std::mutex& LogMutex() {
  static std::mutex mu;
  return mu;
}
spdlog::level::level_enum& Level() {
  static spdlog::level::level_enum level = spdlog::level::info;
  return level;
}

}  // namespace

std::shared_ptr<spdlog::logger> Logger(const std::string& module) {
  std::lock_guard<std::mutex> lock(LogMutex());
  if (auto existing = spdlog::get(module)) return existing;
  auto logger = spdlog::stderr_color_mt(module);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %^%l%$ %n: %v", spdlog::pattern_time_type::utc);
  logger->set_level(Level());
  return logger;
}

bool SetLogLevel(const std::string& level) {
  auto parsed = spdlog::level::from_str(level);
  // from_str maps anything unknown to "off"; only accept "off" when asked for.
  if (parsed == spdlog::level::off && level != "off") return false;
  std::lock_guard<std::mutex> lock(LogMutex());
  Level() = parsed;
  spdlog::apply_all([parsed](const std::shared_ptr<spdlog::logger>& l) { l->set_level(parsed); });
  return true;
}

}  // namespace rdp
