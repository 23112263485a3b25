#pragma once
// The string tests C++17 lacks (C++20's ends_with), for names of
// parameters, tensors and files. Header only, free of LibTorch (the text
// library uses it too).

#include <string_view>

namespace fsdp {

/// Whether `text` ends with `suffix`.
inline bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace fsdp
