// Small string helpers shared by the parsers of environment values and
// command-line options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace emugpu {

// `s` without leading and trailing blanks (spaces, tabs, line ends).
inline std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

// The entries of a `separator`-separated list, each trimmed (empty ones kept).
inline std::vector<std::string> split_trimmed(const std::string& text, char separator) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(separator, begin);
    out.push_back(trim(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin)));
    if (end == std::string::npos) return out;
    begin = end + 1;
  }
}

// FNV-1a of `text` from `seed` (by default FNV's offset basis).
inline uint64_t fnv1a(const std::string& text, uint64_t seed = 1469598103934665603ULL) {
  uint64_t h = seed;
  for (const unsigned char ch : text) h = (h ^ ch) * 1099511628211ULL;
  return h;
}

}  // namespace emugpu
