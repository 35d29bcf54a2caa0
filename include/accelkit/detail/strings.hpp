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
// Bytes as lower-case hexadecimal text (two digits a byte), and back: false
// for text of another length or with a character that is not such a digit.
inline std::string to_hex(const unsigned char* p, std::size_t n) {
  auto digit = [](unsigned v) { return static_cast<char>(v < 10 ? '0' + v : 'a' + (v - 10)); };
  std::string s(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    s[2 * i] = digit(p[i] >> 4);
    s[2 * i + 1] = digit(p[i] & 15u);
  }
  return s;
}
inline bool from_hex(std::string_view s, unsigned char* p, std::size_t n) {
  if (s.size() != 2 * n) return false;
  auto nibble = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  for (std::size_t i = 0; i < n; ++i) {
    int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    p[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}
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
