// libFuzzer target: the input is a whole safetensors file, written to disk
// and opened with safetensors::Reader as a checkpoint load opens one: the
// header and its offsets, the checksum lookup and verification, and every
// tensor read whole and in part. Each input must either be refused with a
// c10::Error or read back exactly the bytes its header points at; never
// crash, hang or read outside the file.

#include <c10/util/Exception.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "fsdp/safetensors.h"
#include "input_file.h"

namespace {

using fsdp::safetensors::Reader;

const fsdp_fuzz::InputFile& input() {
  static const fsdp_fuzz::InputFile file("reader_fuzz.safetensors");
  return file;
}
const std::string& input_path() { return input().path(); }
void write_input(const uint8_t* data, size_t size) { input().write(data, size); }

// Oracle: a check that no c10::Error may answer.
void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "reader_fuzz: %s\n", what);
    std::abort();
  }
}

// The bytes a tensor's read returned must be the file's own, where the
// header says they lie.
void expect_bytes(const torch::Tensor& got, const uint8_t* file, uint64_t at) {
  if (got.nbytes() == 0) return;  // an empty tensor may have no data pointer
  expect(std::memcmp(got.data_ptr(), file + at, got.nbytes()) == 0, "a read returned other bytes than the file's");
}

void read_everything(const Reader& reader, const uint8_t* data, size_t size) {
  // Accepted: the first 8 bytes are the header length, the data follows it.
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | data[i];
  const uint64_t data_start = 8 + header_length;
  for (const auto& t : reader.tensors()) {
    const std::string& name = t.spec.name;
    expect(reader.find(name) == &t, "find() does not return the listed entry");
    expect(t.begin <= t.end && data_start + t.end <= size, "an accepted tensor lies outside the file");
    const torch::Tensor whole = reader.read(name);
    expect(whole.sizes().vec() == t.spec.shape && whole.scalar_type() == t.spec.dtype,
           "read() returned another shape or dtype than the header's");
    expect(whole.nbytes() == t.end - t.begin, "read() returned another size than data_offsets span");
    expect_bytes(whole, data, data_start + t.begin);
    // A part: all but the first element, then one element past the end,
    // which must be refused.
    const int64_t numel = whole.numel();
    if (numel > 1) {
      const torch::Tensor part = torch::empty({numel - 1}, torch::TensorOptions().dtype(t.spec.dtype));
      reader.read_into(name, 1, part);
      expect_bytes(part, data, data_start + t.begin + whole.element_size());
    }
    // Ranges outside the tensor, which must be refused.
    const torch::Tensor one = torch::empty({1}, torch::TensorOptions().dtype(t.spec.dtype));
    for (const int64_t offset : {numel, int64_t{-1}, std::numeric_limits<int64_t>::max()}) {
      bool refused = false;
      try {
        reader.read_into(name, offset, one);
      } catch (const c10::Error&) {
        refused = true;
      }
      expect(refused, "read_into() outside a tensor was not refused");
    }
  }
  expect(reader.find("\x01 no such tensor") == nullptr, "find() invented a tensor");
  if (reader.has_checksum()) {
    reader.stored_checksum();
    reader.verify_checksum();  // a mismatch throws c10::Error, as a corrupt file must
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_input(data, size);
  try {
    const Reader reader(input_path());
    read_everything(reader, data, size);
  } catch (const c10::Error&) {
    // A refusal is the expected outcome for a malformed or corrupt file.
  }
  return 0;
}
