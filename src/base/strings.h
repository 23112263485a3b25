#pragma once
// The string tests C++17 lacks (C++20's ends_with), for names of
// parameters, tensors and files, and how messages and the tools print
// memory. Header only, free of LibTorch (the text library uses it too).

#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <string_view>

namespace fsdp {

/// Whether `text` ends with `suffix`.
inline bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Bytes as MiB with two decimals ("642.60 MiB"), as messages and the tools print memory.
inline std::string format_mib(int64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << bytes / (1024.0 * 1024.0) << " MiB";
  return s.str();
}

}  // namespace fsdp
