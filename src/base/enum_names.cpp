#include "fsdp/enum_names.h"

#include <c10/util/Exception.h>

namespace fsdp::detail {

const char* enum_name(const EnumNames& names, int value) {
  for (const auto& [v, name] : names.entries)
    if (v == value) return name;
  return names.unnamed != nullptr ? names.unnamed(value) : "unknown";
}

int parse_enum(const EnumNames& names, const std::string& text) {
  std::string expected;
  for (const auto& [value, name] : names.entries) {
    if (text == name) return value;
    if (enum_name(names, value) != name) continue;  // an alias: the list names each value once
    expected += (expected.empty() ? "" : ", ") + std::string(name);
  }
  TORCH_CHECK(false, "unknown ", names.what, " '", text, "': expected one of ", expected);
}

}  // namespace fsdp::detail
