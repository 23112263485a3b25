#pragma once
/// \file
/// The message of an exception as a user should see it: TORCH_CHECK errors
/// without the C++ backtrace LibTorch appends.

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace fsdp {

/// The exception's message; for a c10::Error (TORCH_CHECK's), without its backtrace.
inline std::string error_message(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  return e.what();
}

}  // namespace fsdp
