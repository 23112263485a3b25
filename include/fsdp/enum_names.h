#pragma once
/// \file
/// One way to name and parse every enum of the library's options and files:
/// `fsdp::enum_name(value)` gives the name a flag, a config or a file spells
/// ("full_shard", "bf16", "sharded"), and `fsdp::parse_enum<E>(text)` gives
/// the value back, or throws naming what was expected and what was found.
///
/// \code{.cpp}
/// auto strategy = fsdp::parse_enum<fsdp::ShardingStrategy>("hybrid_shard");
/// std::cout << fsdp::enum_name(strategy);        // hybrid_shard
/// fsdp::parse_enum<torch::ScalarType>("bfloat16");  // torch::kBFloat16 (bf16)
/// \endcode
///
/// The dtypes (torch::ScalarType) are "fp32", "bf16" and "fp16", with
/// "float32", "bfloat16" and "float16" parsed too; any other dtype is named as
/// LibTorch names it. Each enum's documentation lists its names.
///
/// Each enum's header declares its names (detail::enum_names, found by
/// argument-dependent lookup), and its floor's .cpp defines them beside the
/// enum's other code.

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {
namespace detail {

/// One enum's names: what it is called in an error ("sharding strategy"),
/// and its values with their names, in the order an error lists them. A
/// value's first name is its name; later ones are aliases parse_enum accepts.
struct EnumNames {
  const char* what;
  std::vector<std::pair<int, const char*>> entries;
  /// The name of a value with no entry (nullptr: "unknown").
  const char* (*unnamed)(int value) = nullptr;

  /// The names of `Enum`'s values, listed as {value, name}.
  template <typename Enum>
  static EnumNames of(const char* what, std::initializer_list<std::pair<Enum, const char*>> named,
                      const char* (*unnamed)(int value) = nullptr) {
    EnumNames names{what, {}, unnamed};
    for (const auto& [value, name] : named) names.entries.emplace_back(static_cast<int>(value), name);
    return names;
  }
};

/// The tag that selects an enum's EnumNames by overloading.
template <typename Enum>
struct EnumTag {};

const char* enum_name(const EnumNames& names, int value);
int parse_enum(const EnumNames& names, const std::string& text);

}  // namespace detail

/// The name of `value` as options, flags and files spell it.
template <typename Enum>
const char* enum_name(Enum value) {
  return detail::enum_name(enum_names(detail::EnumTag<Enum>{}), static_cast<int>(value));
}

/// The value `text` names (a name or an alias). Throws "unknown <what>
/// '<text>': expected one of <names>".
template <typename Enum>
Enum parse_enum(const std::string& text) {
  return static_cast<Enum>(detail::parse_enum(enum_names(detail::EnumTag<Enum>{}), text));
}

}  // namespace fsdp
