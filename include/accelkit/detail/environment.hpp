// accelkit: where the SDK reads environment variables from.
#pragma once

#include <accelkit/config.hpp>

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>

ACCELKIT_BEGIN_NAMESPACE

// The process environment by default; a fixed map for tests and for hosts
// that configure a backend programmatically.
class Environment {
 public:
  static Environment process() { return Environment(nullptr); }
  static Environment fixed(std::map<std::string, std::string> vars) {
    return Environment(std::make_shared<const std::map<std::string, std::string>>(std::move(vars)));
  }

  std::optional<std::string> get(const std::string& name) const {
    if (!vars_) {
      const char* v = std::getenv(name.c_str());
      if (v == nullptr) return std::nullopt;
      return std::string(v);
    }
    auto it = vars_->find(name);
    if (it == vars_->end()) return std::nullopt;
    return it->second;
  }

 private:
  explicit Environment(std::shared_ptr<const std::map<std::string, std::string>> vars)
      : vars_(std::move(vars)) {}
  std::shared_ptr<const std::map<std::string, std::string>> vars_;
};

ACCELKIT_END_NAMESPACE
