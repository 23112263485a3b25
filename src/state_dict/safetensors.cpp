#include "fsdp/safetensors.h"

#include "fsdp/safetensors_header.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace fsdp::safetensors {
namespace {

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
  std::string json_text;
  uint64_t size = 0;
  try {
    size = file_size(f);
    unsigned char first_8_bytes[8] = {};
    const size_t got = std::fread(first_8_bytes, 1, 8, f);
    const uint64_t length = header_length(first_8_bytes, got == 8 ? size : got, path);
    json_text.resize(length);
    TORCH_CHECK(std::fread(json_text.data(), 1, length, f) == length, "'", path, "': could not read the ", length,
                "-byte header");
  } catch (...) {
    std::fclose(f);
    throw;
  }
  std::fclose(f);
  Header header = parse_header(json_text, size, path);
  data_start_ = header.data_start;
  metadata_ = std::move(header.metadata);
  for (auto& t : header.tensors) {
    tensors_.push_back(TensorEntry{TensorSpec{t.name, scalar_type(t.dtype), std::move(t.shape)}, t.begin, t.end});
  }
  auto stored = metadata_.find(kChecksumKey);
  if (stored != metadata_.end()) {
    // The digits' place in the file: after the key, its colon and the quote.
    const size_t key = json_text.find(std::string("\"") + kChecksumKey + "\"");
    const size_t quote = key == std::string::npos ? key : json_text.find('"', key + std::strlen(kChecksumKey) + 2);
    TORCH_CHECK(quote != std::string::npos && json_text.compare(quote + 1, 16, stored->second) == 0 &&
                    stored->second.size() == 16,
                "'", path, "': malformed '", kChecksumKey, "' in the header metadata");
    parse_hex64(stored->second);
    checksum_offset_ = 8 + quote + 1;
  }
}

uint64_t Reader::stored_checksum() const {
  TORCH_CHECK(has_checksum(), "'", path_, "' carries no checksum (not written by fsdp-cpp)");
  return parse_hex64(metadata_.at(kChecksumKey));
}

void Reader::verify_checksum() const {
  const uint64_t expected = stored_checksum();
  std::FILE* f = std::fopen(path_.c_str(), "rb");
  TORCH_CHECK(f, "cannot open '", path_, "': ", std::strerror(errno));
  std::vector<unsigned char> buffer(1 << 20);
  uint64_t hash = kFnvOffset, position = 0;
  size_t got = 0;
  while ((got = std::fread(buffer.data(), 1, buffer.size(), f)) > 0) {
    // The stored digits count as the zeros they were when hashed.
    for (uint64_t i = std::max(position, checksum_offset_); i < std::min(position + got, checksum_offset_ + 16); ++i) {
      buffer[i - position] = '0';
    }
    hash = fnv1a(buffer.data(), got, hash);
    position += got;
  }
  std::fclose(f);
  TORCH_CHECK(hash == expected, "'", path_, "' is corrupt: its bytes have checksum ", hex64(hash),
              ", its header says ", hex64(expected));
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
  read_into(name, 0, out.view({-1}));
  return out;
}

void Reader::read_into(const std::string& name, int64_t offset, const torch::Tensor& out) const {
  const TensorEntry* entry = find(name);
  TORCH_CHECK(entry, "'", path_, "' has no tensor '", name, "'");
  const uint64_t element = c10::elementSize(entry->spec.dtype);
  const uint64_t numel = (entry->end - entry->begin) / element;
  // offset + out.numel() could overflow: compare what is left after offset.
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == entry->spec.dtype && offset >= 0 &&
                  static_cast<uint64_t>(offset) <= numel &&
                  static_cast<uint64_t>(out.numel()) <= numel - static_cast<uint64_t>(offset),
              "'", path_, "': cannot read ", out.numel(), " ", out.scalar_type(), " elements at ", offset,
              " of tensor '", name, "' (", numel, " ", entry->spec.dtype, " elements)");
  std::FILE* f = std::fopen(path_.c_str(), "rb");
  TORCH_CHECK(f, "cannot open '", path_, "': ", std::strerror(errno));
  const uint64_t bytes = out.numel() * element;
  bool ok = std::fseek(f, static_cast<long>(data_start_ + entry->begin + offset * element), SEEK_SET) == 0 &&
            std::fread(out.data_ptr(), 1, bytes, f) == bytes;
  std::fclose(f);
  TORCH_CHECK(ok, "'", path_, "': could not read the ", bytes, " bytes of tensor '", name, "'");
}

Writer::Writer(std::string path, std::vector<TensorSpec> specs, std::map<std::string, std::string> metadata)
    : path_(std::move(path)), temp_path_(path_ + ".tmp"), specs_(std::move(specs)), checksum_(kFnvOffset) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  metadata[kChecksumKey] = hex64(0);  // the placeholder, filled in by commit()
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& spec : specs_) {
    uint64_t bytes = c10::elementSize(spec.dtype);
    for (int64_t d : spec.shape) bytes *= static_cast<uint64_t>(d);
    header[spec.name] = {{"dtype", dtype_code(spec.dtype)}, {"shape", spec.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  checksum_offset_ = 8 + text.find(std::string("\"") + kChecksumKey + "\":\"") + std::strlen(kChecksumKey) + 4;
  file_ = std::fopen(temp_path_.c_str(), "wb");
  TORCH_CHECK(file_, "cannot create '", temp_path_, "': ", std::strerror(errno));
  unsigned char length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);
  append(length_bytes, 8, "the header length");
  append(text.data(), text.size(), "the header");
}

void Writer::append(const void* data, size_t bytes, const std::string& what) {
  TORCH_CHECK(std::fwrite(data, 1, bytes, file_) == bytes, "writing ", what, " to '", temp_path_,
              "' failed: ", std::strerror(errno));
  checksum_ = fnv1a(data, bytes, checksum_);
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
  append(data.data_ptr(), data.nbytes(), "tensor '" + spec.name + "'");
  ++next_;
}

void Writer::commit() {
  TORCH_CHECK(next_ == specs_.size(), "'", path_, "': only ", next_, " of ", specs_.size(), " tensors were written");
  const std::string digits = hex64(checksum_);
  bool ok = std::fseek(file_, static_cast<long>(checksum_offset_), SEEK_SET) == 0 &&
            std::fwrite(digits.data(), 1, digits.size(), file_) == digits.size();
  ok = ok && std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  ok = (std::fclose(file_) == 0) && ok;
  file_ = nullptr;
  if (ok) ok = std::rename(temp_path_.c_str(), path_.c_str()) == 0;
  if (!ok) std::remove(temp_path_.c_str());
  TORCH_CHECK(ok, "could not complete '", path_, "': ", std::strerror(errno));
}

uint64_t fnv1a(const void* data, size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

std::string hex64(uint64_t value) {
  static const char* digits = "0123456789abcdef";
  std::string text(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) text[i] = digits[value & 15];
  return text;
}

uint64_t parse_hex64(const std::string& text) {
  TORCH_CHECK(text.size() == 16 && text.find_first_not_of("0123456789abcdef") == std::string::npos,
              "expected a checksum of 16 hex digits, found '", text, "'");
  return std::stoull(text, nullptr, 16);
}

}  // namespace fsdp::safetensors
