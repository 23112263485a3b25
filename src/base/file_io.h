#pragma once
// Large-block file I/O for the files we checksum, with the hashing done
// while the disk works: a writer that streams through aligned blocks
// (O_DIRECT where the filesystem allows it), and a whole-file hash that
// reads ahead. Every short read or write is retried and every failure
// thrown naming the file.
//
// Measured on this machine (two processes at once, as two ranks save, 0.91 GB
// each, 8 MiB blocks): O_DIRECT from aligned blocks wrote in 0.67-1.1 s;
// buffered writes with one fsync at the end 2.8-4.6 s (the whole file
// waits in the page cache for the fsync); buffered with writeback started
// block by block (sync_file_range) 0.6-2.0 s, unevenly. Reads stay
// buffered: with the kernel's read-ahead they were faster than O_DIRECT
// (0.85-0.95 s against 1.3-1.9 s from the disk), and a file still in the
// page cache is read from memory.

#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <string>

#include "base/checksum.h"

namespace fsdp::file_io {

// The unit of I/O and of hashing: large enough that a system call and a
// hand-over between threads cost nothing beside the bytes moved (4-32 MiB
// wrote alike above; 8 MiB was as fast as any), and a multiple of any
// disk's block size, as O_DIRECT requires.
constexpr size_t kBlockBytes = size_t{8} << 20;

// Throws "'path' is a directory (or: not a regular file), expected a file"
// for a path that exists and is not a regular file (or a link to one), before
// anything opens it: a named pipe would block the open. A missing path is
// left to the open's own error.
void require_regular_file(const std::string& path);

// An open file descriptor, closed when dropped.
class File {
 public:
  // flags as for open(2); throws "cannot open 'path': why", and, opened
  // for reading, require_regular_file's refusal.
  File(const std::string& path, int flags);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t size() const;
  // Flushes the file's data to the disk (fsync), then closes it; throws on failure.
  void sync_and_close();

 private:
  std::string path_;
  int fd_ = -1;
};

// All `bytes` at `offset`, or throws naming the file and `what`.
void write_at(const File& file, const void* data, size_t bytes, uint64_t offset, const std::string& what);
void read_at(const File& file, void* data, size_t bytes, uint64_t offset, const std::string& what);

// Writes a new file as one stream of bytes, hashing them on the way: the
// caller's thread copies the bytes into one of two aligned blocks and hashes
// each full block while the other is being written by an I/O thread. The
// file is opened with O_DIRECT (the disk is fed at its own speed, and a
// checkpoint does not push the training job's own pages out of the page
// cache); where the filesystem refuses it (tmpfs), with plain buffered writes.
class StreamWriter {
 public:
  StreamWriter(const std::string& path, checksum::Algorithm algorithm);
  ~StreamWriter();  // waits for a write in flight
  StreamWriter(const StreamWriter&) = delete;
  StreamWriter& operator=(const StreamWriter&) = delete;

  // The next `bytes` of the file; `what` names them in errors. The data may
  // be changed or freed once this returns.
  void append(const void* data, size_t bytes, const std::string& what);
  uint64_t bytes_appended() const { return appended_; }
  // Writes what is left and returns the hash of every byte appended.
  uint64_t finish();
  // After finish(): overwrites bytes already written (a header field that
  // depends on the rest of the file).
  void overwrite(uint64_t offset, const std::string& bytes, const std::string& what);
  // After finish(): fsync, then close; throws on failure.
  void sync_and_close();
  bool direct() const { return direct_; }

 private:
  struct FreeAligned {
    void operator()(char* p) const;
  };
  std::unique_ptr<File> file_;
  bool direct_ = false;
  checksum::Hasher hasher_;
  std::unique_ptr<char, FreeAligned> blocks_[2];
  int current_ = 0;          // the block being filled
  size_t filled_ = 0;        // bytes of it filled
  uint64_t appended_ = 0;    // bytes appended in all
  uint64_t block_start_ = 0; // the file offset of the block being filled
  std::future<void> in_flight_;
  bool finished_ = false;
  void write_block(size_t bytes, const std::string& what);
  void wait_in_flight();
};

// The hash of a whole file, reading block by block while a worker thread
// hashes the block before, with the bytes [mask_offset, mask_offset +
// mask.size()) read as `mask` (a checksum stored in the file, hashed as the
// placeholder it replaced).
uint64_t hash_file(const File& file, checksum::Algorithm algorithm, uint64_t mask_offset, const std::string& mask);

}  // namespace fsdp::file_io
