// accelkit: the conformance kits' report (JSON and a readable summary).
//
// Note [Conformance report]
// Problem: a vendor's CI, the docs and the two kits (C++ and Python) need
// one result they all read, and a run that ends without its report must not
// look passed.
// Decision: each kit writes one JSON document per run:
//   {"schema": "accelkit.conformance", "version": 1, "kit": "cpp",
//    "backend": "<name>", "devices": <count>,
//    "checks": [{"group", "name", "rule", "status": "pass"|"fail"|"skip",
//                "message", "duration_s"}, ...],
//    "summary": {"pass": n, "fail": n, "skip": n}}
// `rule` is the contract rule a check proves, in words; `message` says what
// broke it (or why the check was skipped). A readable summary goes beside
// it (<path>.txt). The Python kit adds "known_differences": its failed
// checks that a list of known differences names (the SDK's, or the file of
// --known-differences), each with "status": "known", the "reason" and its
// "source" list, kept out of "checks" and "summary". Each kit checks that both files can be written before it
// runs a check (exit 2, naming the file and the reason, nothing run), and a
// write that still fails at the end names the file and exits non-zero.
// Limits: fields are added, never renamed; `version` counts the changes a
// reader must know about.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/json.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
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
  // cannot be written, `why` then naming the file and the reason.
  bool write(const std::string& path, std::string_view backend, int devices,
             std::string& why) const {
    why = write_file(path, to_json(backend, devices));
    std::string text_why = write_file(path + ".txt", summary(backend));
    if (why.empty()) why = std::move(text_why);
    return why.empty();
  }
  bool write(const std::string& path, std::string_view backend, int devices) const {
    std::string why;
    return write(path, backend, devices, why);
  }

  // Whether write(path, ...) can create or replace both files, checked by
  // opening them (a file made for the test is removed); false with `why`
  // naming the file and the reason. Run before the checks, so that a run
  // does not end without its report.
  static bool writable(const std::string& path, std::string& why) {
    for (const std::string& file : {path, path + ".txt"}) {
      int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
      bool made = false;
      if (fd < 0 && errno == ENOENT) {
        fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        made = fd >= 0;
      }
      if (fd < 0) {
        why = fmt::format("{}: {}", file, std::strerror(errno));
        return false;
      }
      ::close(fd);
      if (made) ::unlink(file.c_str());
    }
    return true;
  }

 private:
  // "" if `text` is now the whole of `file`, else "<file>: <reason>".
  static std::string write_file(const std::string& file, const std::string& text) {
    std::FILE* f = std::fopen(file.c_str(), "w");
    if (!f) return fmt::format("{}: {}", file, std::strerror(errno));
    int error = 0;
    if (std::fwrite(text.data(), 1, text.size(), f) != text.size()) error = errno ? errno : EIO;
    if (std::fclose(f) != 0 && error == 0) error = errno;
    return error == 0 ? std::string() : fmt::format("{}: {}", file, std::strerror(error));
  }

  mutable std::mutex mutex_;
  std::vector<CheckResult> results_;
};

}  // namespace testing
ACCELKIT_END_NAMESPACE
