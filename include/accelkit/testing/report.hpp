// accelkit: the conformance kits' report (JSON and a readable summary).
//
// Note [Conformance report]
// Both kits (C++ and Python) write one JSON document per run:
//   {"schema": "accelkit.conformance", "version": 1, "kit": "cpp",
//    "backend": "<name>", "devices": <count>,
//    "checks": [{"group", "name", "rule", "status": "pass"|"fail"|"skip",
//                "message", "duration_s"}, ...],
//    "summary": {"pass": n, "fail": n, "skip": n}}
// `rule` is the contract rule a check proves, in words; `message` says what
// broke it (or why the check was skipped). Fields are added, never renamed;
// `version` counts changes a reader must know about.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/json.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

inline constexpr int conformance_report_version = 1;

enum class CheckStatus { pass, fail, skip };
constexpr std::string_view to_string(CheckStatus s) noexcept {
  switch (s) {
    case CheckStatus::pass: return "pass";
    case CheckStatus::fail: return "fail";
    default: return "skip";
  }
}

struct CheckResult {
  std::string group;
  std::string name;
  std::string rule;
  CheckStatus status = CheckStatus::pass;
  std::string message;
  double duration_s = 0;
};

// The results of one run, in the order the checks ran. Thread-safe.
class ConformanceReport {
 public:
  void add(CheckResult r) {
    std::lock_guard<std::mutex> lock(mutex_);
    results_.push_back(std::move(r));
  }
  std::vector<CheckResult> results() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return results_;
  }
  std::size_t count(CheckStatus s) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = 0;
    for (const CheckResult& r : results_) n += r.status == s;
    return n;
  }

  std::string to_json(std::string_view backend, int devices) const {
    std::vector<CheckResult> all = results();
    ::accelkit::detail::JsonWriter w;
    w.begin_object();
    w.field("schema", "accelkit.conformance").field("version", conformance_report_version);
    w.field("kit", "cpp").field("backend", backend).field("devices", devices);
    w.key("checks").begin_array();
    std::size_t n[3] = {0, 0, 0};
    for (const CheckResult& r : all) {
      ++n[static_cast<int>(r.status)];
      w.begin_object()
          .field("group", r.group)
          .field("name", r.name)
          .field("rule", r.rule)
          .field("status", to_string(r.status))
          .field("message", r.message)
          .field("duration_s", r.duration_s)
          .end_object();
    }
    w.end_array();
    w.key("summary").begin_object();
    w.field("pass", n[0]).field("fail", n[1]).field("skip", n[2]).end_object();
    w.end_object();
    return w.str() + "\n";
  }

  // One line per check, failures with their message, then the totals.
  std::string summary(std::string_view backend) const {
    std::vector<CheckResult> all = results();
    std::string out = fmt::format("accelkit conformance kit (C++) on {}\n", backend);
    std::size_t n[3] = {0, 0, 0};
    for (const CheckResult& r : all) {
      ++n[static_cast<int>(r.status)];
      out += fmt::format("  {:<4} {}/{} ({:.3f} s)\n", to_string(r.status), r.group, r.name,
                         r.duration_s);
      if (r.status != CheckStatus::pass)
        out += fmt::format("       rule: {}\n       {}\n", r.rule, r.message);
    }
    out += fmt::format("{} passed, {} failed, {} skipped\n", n[0], n[1], n[2]);
    return out;
  }

  // Writes `<path>` (JSON) and `<path>.txt` (the summary); false if either
  // cannot be written.
  bool write(const std::string& path, std::string_view backend, int devices) const {
    std::ofstream json(path);
    json << to_json(backend, devices);
    std::ofstream text(path + ".txt");
    text << summary(backend);
    return json.good() && text.good();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<CheckResult> results_;
};

}  // namespace testing
ACCELKIT_END_NAMESPACE
