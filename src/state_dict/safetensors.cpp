#include "fsdp/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

namespace fsdp::safetensors {
namespace {

// Headers larger than this are refused rather than allocated (the format's
// reference implementation uses the same bound).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

const std::vector<std::pair<std::string, torch::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, torch::ScalarType>> table = {
      {"F64", torch::kDouble}, {"F32", torch::kFloat}, {"F16", torch::kHalf}, {"BF16", torch::kBFloat16},
      {"I64", torch::kLong},   {"I32", torch::kInt},   {"I16", torch::kShort}, {"I8", torch::kChar},
      {"U8", torch::kByte},    {"BOOL", torch::kBool}};
  return table;
}

uint64_t file_size(std::FILE* f) {
  std::fseek(f, 0, SEEK_END);
  long size = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  return size < 0 ? 0 : static_cast<uint64_t>(size);
}

}  // namespace

std::string dtype_code(torch::ScalarType type) {
  for (const auto& [code, t] : dtype_table())
    if (t == type) return code;
  TORCH_CHECK(false, "safetensors: no dtype code for ", type);
}

torch::ScalarType scalar_type(const std::string& code) {
  for (const auto& [c, t] : dtype_table())
    if (c == code) return t;
  TORCH_CHECK(false, "safetensors: unsupported dtype '", code, "'");
}

Reader::Reader(const std::string& path) : path_(path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  TORCH_CHECK(f, "cannot open '", path, "': ", std::strerror(errno));
  const uint64_t size = file_size(f);
  unsigned char length_bytes[8];
  bool got_length = size >= 8 && std::fread(length_bytes, 1, 8, f) == 8;
  if (!got_length) std::fclose(f);
  TORCH_CHECK(got_length, "'", path, "' is not a safetensors file: ", size, " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | length_bytes[i];
  bool fits = header_len <= kMaxHeaderBytes && header_len <= size - 8;
  if (!fits) std::fclose(f);
  TORCH_CHECK(fits, "'", path, "': header length ", header_len, " does not fit the file (", size, " bytes) or exceeds ",
              kMaxHeaderBytes, " bytes");
  std::string header(header_len, '\0');
  bool got_header = std::fread(header.data(), 1, header_len, f) == header_len;
  std::fclose(f);
  TORCH_CHECK(got_header, "'", path, "': could not read the ", header_len, "-byte header");
  data_start_ = 8 + header_len;
  const uint64_t data_size = size - data_start_;

  nlohmann::json json;
  try {
    json = nlohmann::json::parse(header);
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
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& why) { TORCH_CHECK(false, "'", path, "': tensor '", name, "': ", why); };
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets"))
      bad("needs dtype, shape and data_offsets");
    if (!value["dtype"].is_string()) bad("dtype must be a string");
    TensorEntry entry;
    entry.spec.name = name;
    try {
      entry.spec.dtype = scalar_type(value["dtype"].get<std::string>());
    } catch (const c10::Error&) {
      bad("unsupported dtype '" + value["dtype"].get<std::string>() + "'");
    }
    if (!value["shape"].is_array()) bad("shape must be an array");
    uint64_t numel = 1;
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned()) bad("shape entries must be non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim))
        bad("shape is absurdly large");
      numel *= dim;
      entry.spec.shape.push_back(static_cast<int64_t>(dim));
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
    const uint64_t element = c10::elementSize(entry.spec.dtype);
    if (numel > std::numeric_limits<uint64_t>::max() / element || numel * element != entry.end - entry.begin)
      bad("shape and dtype need " + std::to_string(numel) + " x " + std::to_string(element) + " bytes but data_offsets span " +
          std::to_string(entry.end - entry.begin));
    tensors_.push_back(std::move(entry));
  }
  // The data section must be exactly the tensors, back to back: no overlap
  // (a crafted file could alias them) and no holes (the format forbids them).
  std::vector<const TensorEntry*> by_offset;
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  uint64_t covered = 0;
  for (const TensorEntry* t : by_offset) {
    TORCH_CHECK(t->begin >= covered, "'", path, "': tensor '", t->spec.name, "' overlaps the tensor before it in the data section");
    TORCH_CHECK(t->begin == covered, "'", path, "': the data section has a hole of ", t->begin - covered,
                " bytes before tensor '", t->spec.name, "'");
    covered = t->end;
  }
  TORCH_CHECK(covered == data_size, "'", path, "': the data section has ", data_size - covered,
              " bytes after its last tensor (truncated header or extra data)");
}

const TensorEntry* Reader::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.spec.name == name) return &t;
  return nullptr;
}

torch::Tensor Reader::read(const std::string& name) const {
  const TensorEntry* entry = find(name);
  TORCH_CHECK(entry, "'", path_, "' has no tensor '", name, "'");
  torch::Tensor out = torch::empty(entry->spec.shape, torch::TensorOptions().dtype(entry->spec.dtype));
  std::FILE* f = std::fopen(path_.c_str(), "rb");
  TORCH_CHECK(f, "cannot open '", path_, "': ", std::strerror(errno));
  const uint64_t bytes = entry->end - entry->begin;
  bool ok = std::fseek(f, static_cast<long>(data_start_ + entry->begin), SEEK_SET) == 0 &&
            std::fread(out.data_ptr(), 1, bytes, f) == bytes;
  std::fclose(f);
  TORCH_CHECK(ok, "'", path_, "': could not read the ", bytes, " bytes of tensor '", name, "'");
  return out;
}

Writer::Writer(std::string path, std::vector<TensorSpec> specs, std::map<std::string, std::string> metadata)
    : path_(std::move(path)), temp_path_(path_ + ".tmp"), specs_(std::move(specs)) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& spec : specs_) {
    uint64_t bytes = c10::elementSize(spec.dtype);
    for (int64_t d : spec.shape) bytes *= static_cast<uint64_t>(d);
    header[spec.name] = {{"dtype", dtype_code(spec.dtype)}, {"shape", spec.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  file_ = std::fopen(temp_path_.c_str(), "wb");
  TORCH_CHECK(file_, "cannot create '", temp_path_, "': ", std::strerror(errno));
  unsigned char length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);
  bool ok = std::fwrite(length_bytes, 1, 8, file_) == 8 && std::fwrite(text.data(), 1, text.size(), file_) == text.size();
  TORCH_CHECK(ok, "writing the header of '", temp_path_, "' failed: ", std::strerror(errno));
}

Writer::~Writer() {
  if (file_) {
    std::fclose(file_);
    std::remove(temp_path_.c_str());
  }
}

void Writer::write(const torch::Tensor& tensor) {
  TORCH_CHECK(next_ < specs_.size(), "'", path_, "': all ", specs_.size(), " tensors were already written");
  const TensorSpec& spec = specs_[next_];
  TORCH_CHECK(tensor.scalar_type() == spec.dtype && tensor.sizes().vec() == spec.shape, "'", path_, "': tensor '",
              spec.name, "' must be ", spec.dtype, " of shape ", c10::IntArrayRef(spec.shape), ", got ",
              tensor.scalar_type(), " of shape ", tensor.sizes());
  torch::Tensor data = tensor.contiguous();
  const size_t bytes = data.nbytes();
  TORCH_CHECK(std::fwrite(data.data_ptr(), 1, bytes, file_) == bytes, "writing tensor '", spec.name, "' to '",
              temp_path_, "' failed: ", std::strerror(errno));
  ++next_;
}

void Writer::commit() {
  TORCH_CHECK(next_ == specs_.size(), "'", path_, "': only ", next_, " of ", specs_.size(), " tensors were written");
  bool ok = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  ok = (std::fclose(file_) == 0) && ok;
  file_ = nullptr;
  if (ok) ok = std::rename(temp_path_.c_str(), path_.c_str()) == 0;
  if (!ok) std::remove(temp_path_.c_str());
  TORCH_CHECK(ok, "could not complete '", path_, "': ", std::strerror(errno));
}

}  // namespace fsdp::safetensors
