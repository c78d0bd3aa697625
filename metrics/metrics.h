#pragma once

// Prometheus metrics, written by hand (Debian 12 packages no Prometheus C++ client): the
// instruments the RPC path updates (Counter, Histogram: fixed label sets chosen at construction,
// so that an observation is a few relaxed atomic adds, no lock and no allocation), and a writer
// of the text exposition format 0.0.4 that scrape-time code fills family by family.
// docs/metrics.md lists every metric the plugin exports.

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace rdp::metrics {

// A monotonically increasing count. Thread-safe, lock-free.
class Counter {
 public:
  void Add(std::uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

// A histogram of durations with at most kMaxBuckets fixed upper bounds (seconds, ascending;
// +Inf is implicit). Observe() is lock-free and allocation-free. A scrape concurrent with
// observations may see a sum that lags the counts by the observations in flight, as Prometheus
// clients do; the counts are always cumulative and _count equals the +Inf bucket.
class Histogram {
 public:
  static constexpr std::size_t kMaxBuckets = 16;
  // Bounds beyond kMaxBuckets are dropped; bounds must ascend.
  explicit Histogram(std::initializer_list<double> bounds_seconds)
      : Histogram(bounds_seconds.begin(), bounds_seconds.size()) {}
  Histogram(const double* bounds_seconds, std::size_t n);

  void Observe(absl::Duration d);

  struct Snapshot {
    std::vector<double> bounds;           // upper bounds, seconds
    std::vector<std::uint64_t> cumulative;  // per bound, then +Inf (size bounds + 1)
    double sum_seconds = 0;
  };
  Snapshot Read() const;

 private:
  std::array<double, kMaxBuckets> bounds_{};
  std::size_t size_ = 0;
  // Non-cumulative: counts_[i] observations <= bounds_[i] and above the previous bound;
  // counts_[size_] those above every bound.
  std::array<std::atomic<std::uint64_t>, kMaxBuckets + 1> counts_{};
  std::atomic<std::int64_t> sum_ns_{0};
};

using Label = std::pair<std::string_view, std::string_view>;

// Builds one scrape in the Prometheus text exposition format 0.0.4. Each metric family is
// opened once with Family() (its # HELP and # TYPE lines) and its samples follow; opening a
// family twice, or writing a sample of another family, breaks the format (checked in debug
// builds). Label values are escaped (backslash, double quote, newline); values print as
// integers when integral, else in the shortest form that reads back exactly; +Inf, -Inf and NaN as Prometheus
// spells them. Not thread-safe: one writer per scrape.
class Exposition {
 public:
  enum class Type { kCounter, kGauge, kHistogram, kInfo };  // kInfo: a gauge whose value is 1

  void Family(std::string_view name, std::string_view help, Type type);
  // A sample of the family opened last; `suffix` is appended to its name ("_bucket", ...).
  void Sample(std::initializer_list<Label> labels, double value, std::string_view suffix = "");
  void Sample(const std::vector<Label>& labels, double value, std::string_view suffix = "");
  // The _bucket, _sum and _count samples of a histogram family opened last.
  void HistogramSamples(const std::vector<Label>& labels, const Histogram::Snapshot& h);

  // The scrape's text, moved out: call it once, when every family is written.
  std::string Take() { return std::move(out_); }

 private:
  void Append(const Label* labels, std::size_t n, double value, std::string_view suffix,
              const Label* extra);

  std::string out_;
  std::string family_;
  std::set<std::string, std::less<>> seen_;
};

// The label value escaped as the text format requires: \ -> \\, " -> \", newline -> \n.
std::string EscapeLabelValue(std::string_view value);
// A sample value as the text format spells it.
std::string FormatValue(double value);

// Every metric's name: "rdma_device_plugin_" + suffix.
std::string Name(std::string_view suffix);
// A counter family `name` (suffix, as Name takes it) with one unlabelled sample.
void WriteCounter(Exposition& out, std::string_view name, std::string_view help,
                  const Counter& c);

// The content type of the text exposition format 0.0.4.
inline constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace rdp::metrics
