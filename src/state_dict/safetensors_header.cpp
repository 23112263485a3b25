// Parsing and validating safetensors headers (see safetensors_header.h).

#include "state_dict/safetensors_header.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

namespace fsdp::safetensors {

uint64_t element_size(const std::string& dtype) {
  static const std::map<std::string, uint64_t> sizes = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                         {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

uint64_t header_length(const unsigned char first_8_bytes[8], uint64_t file_size, const std::string& path) {
  TORCH_CHECK(file_size >= 8, "'", path, "' is not a safetensors file: ", file_size,
              " bytes, shorter than the 8-byte header length");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | first_8_bytes[i];
  TORCH_CHECK(length <= kMaxHeaderBytes && length <= file_size - 8, "'", path, "': header length ", length,
              " does not fit the file (", file_size, " bytes) or exceeds ", kMaxHeaderBytes, " bytes");
  return length;
}

Header parse_header(const std::string& json_text, uint64_t file_size, const std::string& path) {
  Header header;
  header.data_start = 8 + json_text.size();
  TORCH_CHECK(header.data_start <= file_size, "'", path, "': the header runs past the end of the file");
  const uint64_t data_size = file_size - header.data_start;
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(json_text);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", path, "': the header is not valid JSON (", e.what(), ")");
  }
  TORCH_CHECK(json.is_object(), "'", path, "': the header must be a JSON object");
  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string& name = it.key();
    const auto& value = it.value();
    if (name == "__metadata__") {
      TORCH_CHECK(value.is_object(), "'", path, "': __metadata__ must be an object of strings");
      for (auto m = value.begin(); m != value.end(); ++m) {
        TORCH_CHECK(m.value().is_string(), "'", path, "': __metadata__ value '", m.key(), "' is not a string");
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& why) { TORCH_CHECK(false, "'", path, "': tensor '", name, "': ", why); };
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets"))
      bad("needs dtype, shape and data_offsets");
    if (!value["dtype"].is_string()) bad("dtype must be a string");
    HeaderEntry entry;
    entry.name = name;
    entry.dtype = value["dtype"].get<std::string>();
    entry.element_size = element_size(entry.dtype);
    if (entry.element_size == 0) bad("unsupported dtype '" + entry.dtype + "'");
    if (!value["shape"].is_array()) bad("shape must be an array");
    uint64_t numel = 1;
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned()) bad("shape entries must be non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim))
        bad("shape is absurdly large");
      numel *= dim;
      entry.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      bad("data_offsets must be two non-negative integers");
    entry.begin = offsets[0].get<uint64_t>();
    entry.end = offsets[1].get<uint64_t>();
    if (entry.begin > entry.end || entry.end > data_size)
      bad("data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
          "] lie outside the data section of " + std::to_string(data_size) + " bytes");
    const uint64_t element = entry.element_size;
    if (numel > std::numeric_limits<uint64_t>::max() / element || numel * element != entry.end - entry.begin)
      bad("shape and dtype need " + std::to_string(numel) + " x " + std::to_string(element) + " bytes but data_offsets span " +
          std::to_string(entry.end - entry.begin));
    header.tensors.push_back(std::move(entry));
  }
  // The data section must be exactly the tensors, back to back: no overlap
  // (a crafted file could alias them) and no holes (the format forbids them).
  std::vector<const HeaderEntry*> by_offset;
  for (const auto& t : header.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  uint64_t covered = 0;
  for (const HeaderEntry* t : by_offset) {
    TORCH_CHECK(t->begin >= covered, "'", path, "': tensor '", t->name, "' overlaps the tensor before it in the data section");
    TORCH_CHECK(t->begin == covered, "'", path, "': the data section has a hole of ", t->begin - covered,
                " bytes before tensor '", t->name, "'");
    covered = t->end;
  }
  TORCH_CHECK(covered == data_size, "'", path, "': the data section has ", data_size - covered,
              " bytes after its last tensor (truncated header or extra data)");
  return header;
}

}  // namespace fsdp::safetensors
