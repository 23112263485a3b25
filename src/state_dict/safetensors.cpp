#include "fsdp/safetensors.h"

#include "state_dict/safetensors_header.h"

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "state_dict/safetensors_metadata.h"

namespace fsdp::safetensors {
namespace {

// What the stored checksum's digits were while the file was hashed.
const std::string kChecksumPlaceholder(16, '0');

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
  file_io::require_regular_file(path);
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
  auto algorithm = metadata_.find(kChecksumAlgorithmKey);
  if (algorithm != metadata_.end()) checksum_algorithm_ = checksum::parse_algorithm(algorithm->second, path);
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
  // The stored digits count as the zeros they were when hashed.
  const uint64_t hash =
      file_io::hash_file(file_io::File(path_, O_RDONLY), checksum_algorithm_, checksum_offset_, kChecksumPlaceholder);
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
  const uint64_t bytes = out.numel() * element;
  file_io::read_at(file_io::File(path_, O_RDONLY), out.data_ptr(), bytes,
                   data_start_ + entry->begin + static_cast<uint64_t>(offset) * element,
                   "the " + std::to_string(bytes) + " bytes of tensor '" + name + "'");
}

Writer::Writer(std::string path, std::vector<TensorSpec> specs, std::map<std::string, std::string> metadata)
    : path_(std::move(path)), temp_path_(path_ + ".tmp"), specs_(std::move(specs)) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  metadata[kChecksumKey] = kChecksumPlaceholder;  // filled in by commit()
  metadata[kChecksumAlgorithmKey] = fsdp::enum_name(checksum::kWritten);
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
  stream_ = std::make_unique<file_io::StreamWriter>(temp_path_, checksum::kWritten);
  unsigned char length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);
  try {
    stream_->append(length_bytes, 8, "the header length");
    stream_->append(text.data(), text.size(), "the header");
  } catch (...) {
    stream_.reset();  // no destructor runs for a constructor that throws
    std::remove(temp_path_.c_str());
    throw;
  }
}

Writer::~Writer() {
  if (stream_) {
    stream_.reset();
    std::remove(temp_path_.c_str());
  }
}

void Writer::write(const torch::Tensor& tensor) {
  TORCH_CHECK(next_ < specs_.size(), "'", path_, "': all ", specs_.size(), " tensors were already written");
  const TensorSpec& spec = specs_[next_];
  TORCH_CHECK(tensor.scalar_type() == spec.dtype && tensor.sizes().vec() == spec.shape, "'", path_, "': tensor '",
              spec.name, "' must be ", spec.dtype, " of shape ", c10::IntArrayRef(spec.shape), ", got ",
              tensor.scalar_type(), " of shape ", tensor.sizes());
  torch::Tensor data = tensor.to(torch::kCPU).contiguous();  // a GPU run's tensors are written from the host
  stream_->append(data.data_ptr(), data.nbytes(), "tensor '" + spec.name + "'");
  ++next_;
}

void Writer::commit() {
  TORCH_CHECK(stream_, "'", path_, "' was already committed");
  TORCH_CHECK(next_ == specs_.size(), "'", path_, "': only ", next_, " of ", specs_.size(), " tensors were written");
  try {
    checksum_ = stream_->finish();
    stream_->overwrite(checksum_offset_, hex64(checksum_), "the checksum");
    stream_->sync_and_close();
  } catch (const c10::Error& e) {
    stream_.reset();
    std::remove(temp_path_.c_str());
    TORCH_CHECK(false, "could not complete '", path_, "': ", e.what_without_backtrace());
  }
  stream_.reset();
  const bool renamed = std::rename(temp_path_.c_str(), path_.c_str()) == 0;
  const int rename_errno = errno;
  if (!renamed) std::remove(temp_path_.c_str());
  TORCH_CHECK(renamed, "could not complete '", path_, "': ", std::strerror(rename_errno));
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
