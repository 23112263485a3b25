#pragma once
/// \file
/// The safetensors format: files read and written as streams.
///
/// The safetensors format (an 8-byte little-endian header length, a JSON
/// header of {name: {dtype, shape, data_offsets}}, then the raw data), read
/// with every offset and size checked, and written as a stream: the header
/// first, then one tensor at a time, so a writer never holds the whole model.
///
/// Every file we write carries its checksum in the header's metadata
/// ("fsdp_checksum": the hash of the whole file as written, with those 16 hex
/// digits read as zeros; "fsdp_checksum_algorithm": the algorithm, see
/// checksum.h), so it stays a standard safetensors file that any reader
/// loads, and we can verify it without a side file. Files that name no
/// algorithm were written before XXH3 with FNV-1a, and verify as such.

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/checksum.h"

namespace fsdp::file_io {
class StreamWriter;
}

namespace fsdp::safetensors {

/// A tensor as a file's header describes it.
struct TensorSpec {
  std::string name;                        ///< its key in the header
  torch::ScalarType dtype = torch::kFloat;  ///< its element type in the file
  std::vector<int64_t> shape;              ///< its shape
};

/// A tensor of a file and where its bytes are.
struct TensorEntry {
  TensorSpec spec;     ///< name, dtype, shape
  uint64_t begin = 0;  ///< byte offsets within the data section
  uint64_t end = 0;    ///< one past its last byte, within the data section
};

/// A safetensors file opened for reading: the header parsed and checked, the
/// tensors read one at a time or by element range.
class Reader {
 public:
  /// Opens and validates the header; throws naming the file and the problem.
  explicit Reader(const std::string& path);
  /// Every tensor of the file, in the order of their data.
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  /// The header's "__metadata__" (string to string; our checksum is in it).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The tensor named `name`, or null.
  const TensorEntry* find(const std::string& name) const;
  /// Reads one tensor (its file dtype) into a new CPU tensor.
  torch::Tensor read(const std::string& name) const;
  /// Reads elements [offset, offset + out.numel()) of a tensor into `out`
  /// (contiguous, of the tensor's dtype), straight into its memory.
  void read_into(const std::string& name, int64_t offset, const torch::Tensor& out) const;
  /// The file it reads.
  const std::string& path() const { return path_; }

  /// Whether the header carries our checksum.
  bool has_checksum() const { return checksum_offset_ != 0; }
  /// The checksum the header carries.
  uint64_t stored_checksum() const;
  /// The checksum's algorithm (an algorithm this version does not know is
  /// refused on opening).
  checksum::Algorithm checksum_algorithm() const { return checksum_algorithm_; }
  /// A full read of the file that throws "'path' is corrupt" unless the bytes
  /// match the checksum.
  void verify_checksum() const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  uint64_t checksum_offset_ = 0;  // of the 16 hex digits in the file; 0: none
  checksum::Algorithm checksum_algorithm_ = checksum::Algorithm::kFnv1a64;  // a file naming none
  std::vector<TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// A safetensors file written as a stream: the header first, then each
/// tensor in turn, so the writer never holds them all.
class Writer {
 public:
  /// Writes the header for these tensors, in this order, to a temporary file
  /// next to `path`. commit() renames it into place once every tensor has been
  /// written and flushed; a writer destroyed before that removes it. The
  /// bytes stream to the disk in large blocks, hashed (XXH3-64)
  /// while the block before is written (file_io.h).
  Writer(std::string path, std::vector<TensorSpec> specs, std::map<std::string, std::string> metadata = {});
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  /// The next tensor in the order given; its dtype and shape must match.
  void write(const torch::Tensor& tensor);
  /// After the last tensor: flushes the file, stores its checksum and renames it to the path.
  void commit();
  /// The checksum stored in the file (valid once committed).
  uint64_t checksum() const { return checksum_; }

 private:
  std::string path_;
  std::string temp_path_;
  std::vector<TensorSpec> specs_;
  size_t next_ = 0;
  std::unique_ptr<file_io::StreamWriter> stream_;  // null once committed
  uint64_t checksum_ = 0;
  uint64_t checksum_offset_ = 0;
};

/// The scalar type of a safetensors dtype code ("F32", "BF16", ...).
torch::ScalarType scalar_type(const std::string& code);

}  // namespace fsdp::safetensors

