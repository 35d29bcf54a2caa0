// accelkit: string helpers for environment variables and names.
#pragma once

#include <accelkit/config.hpp>

#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

namespace detail {
// Without leading and trailing white space.
inline std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}
// The comma-separated items of a list, trimmed. A blank list has none; an
// empty item (a stray comma) is kept for the caller to judge.
inline std::vector<std::string_view> split_list(std::string_view s) {
  std::vector<std::string_view> out;
  if (trim(s).empty()) return out;
  while (true) {
    auto comma = s.find(',');
    out.push_back(trim(s.substr(0, comma)));
    if (comma == std::string_view::npos) return out;
    s = s.substr(comma + 1);
  }
}
// "simdev" -> "SIMDEV".
inline std::string upper(std::string_view s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}
// Whether s starts with prefix, ignoring case.
inline bool iequal_prefix(std::string_view prefix, std::string_view s) noexcept {
  if (prefix.size() > s.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(prefix[i])) !=
        std::tolower(static_cast<unsigned char>(s[i])))
      return false;
  return true;
}
}  // namespace detail

ACCELKIT_END_NAMESPACE
