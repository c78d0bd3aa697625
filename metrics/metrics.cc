#include "metrics/metrics.h"

#include <cassert>
#include <cmath>
#include <limits>

#include "fmt/format.h"

namespace rdp::metrics {

Histogram::Histogram(const double* bounds_seconds, std::size_t n) {
  for (std::size_t i = 0; i < n && size_ < kMaxBuckets; ++i) {
    const double b = bounds_seconds[i];
    assert(size_ == 0 || b > bounds_[size_ - 1]);
    bounds_[size_++] = b;
  }
}

void Histogram::Observe(absl::Duration d) {
  const double seconds = absl::ToDoubleSeconds(d);
  std::size_t i = 0;
  while (i < size_ && seconds > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds.assign(bounds_.begin(), bounds_.begin() + size_);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i <= size_; ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(total);
  }
  s.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

// HELP text escapes only backslash and newline.
std::string EscapeHelp(std::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

const char* TypeName(Exposition::Type type) {
  switch (type) {
    case Exposition::Type::kCounter: return "counter";
    case Exposition::Type::kHistogram: return "histogram";
    case Exposition::Type::kGauge:
    case Exposition::Type::kInfo: return "gauge";  // 0.0.4 has no info type
  }
  return "untyped";
}

}  // namespace

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integral values (counts, bytes) exactly, up to 2^53 where doubles stop being exact.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    return fmt::format("{}", static_cast<std::int64_t>(value));
  }
  return fmt::format("{}", value);  // the shortest form that reads back exactly
}

void Exposition::Family(std::string_view name, std::string_view help, Type type) {
  [[maybe_unused]] const bool fresh = seen_.emplace(name).second;
  assert(fresh && "a metric family written twice in one scrape");
  family_ = std::string(name);
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, EscapeHelp(help), name,
                      TypeName(type));
}

void Exposition::Append(const Label* labels, std::size_t n, double value,
                        std::string_view suffix, const Label* extra) {
  assert(!family_.empty() && "a sample before its family");
  out_ += family_;
  out_ += suffix;
  if (n > 0 || extra) {
    out_ += '{';
    bool first = true;
    auto add = [&](const Label& l) {
      if (!first) out_ += ',';
      out_ += l.first;
      out_ += "=\"";
      out_ += EscapeLabelValue(l.second);
      out_ += '"';
      first = false;
    };
    for (std::size_t i = 0; i < n; ++i) add(labels[i]);
    if (extra) add(*extra);
    out_ += '}';
  }
  out_ += ' ';
  out_ += FormatValue(value);
  out_ += '\n';
}

void Exposition::Sample(std::initializer_list<Label> labels, double value,
                        std::string_view suffix) {
  Append(labels.begin(), labels.size(), value, suffix, nullptr);
}

void Exposition::Sample(const std::vector<Label>& labels, double value,
                        std::string_view suffix) {
  Append(labels.data(), labels.size(), value, suffix, nullptr);
}

void Exposition::HistogramSamples(const std::vector<Label>& labels, const Histogram::Snapshot& h) {
  for (std::size_t i = 0; i < h.cumulative.size(); ++i) {
    const std::string le = i < h.bounds.size() ? FormatValue(h.bounds[i]) : "+Inf";
    const Label extra{"le", le};
    Append(labels.data(), labels.size(), static_cast<double>(h.cumulative[i]), "_bucket",
           &extra);
  }
  Append(labels.data(), labels.size(), h.sum_seconds, "_sum", nullptr);
  Append(labels.data(), labels.size(),
         static_cast<double>(h.cumulative.empty() ? 0 : h.cumulative.back()), "_count", nullptr);
}

std::string Name(std::string_view suffix) {
  return "rdma_device_plugin_" + std::string(suffix);
}

void WriteCounter(Exposition& out, std::string_view name, std::string_view help,
                  const Counter& c) {
  out.Family(Name(name), help, Exposition::Type::kCounter);
  out.Sample({}, static_cast<double>(c.value()));
}

}  // namespace rdp::metrics
