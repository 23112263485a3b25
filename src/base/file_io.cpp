#include "base/file_io.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace fsdp::file_io {
namespace {

// O_DIRECT's alignment of memory, file offsets and lengths: the largest
// logical block size of disks in use.
constexpr size_t kDirectAlignment = 4096;
static_assert(kBlockBytes % kDirectAlignment == 0, "blocks must keep O_DIRECT's alignment");

// Feeds a Hasher on a worker thread, one range at a time and in order, so
// that hashing a block overlaps the caller's reading of the next. The caller
// keeps each range's memory valid and unchanged until the next hash() or
// digest() returns.
class BackgroundHasher {
 public:
  explicit BackgroundHasher(checksum::Algorithm algorithm) : hasher_(algorithm) {}
  ~BackgroundHasher() {
    if (pending_.valid()) pending_.wait();
  }
  // Waits for the range before, then starts hashing this one.
  void hash(const char* data, size_t bytes) {
    wait();
    pending_ = std::async(std::launch::async, [this, data, bytes] { hasher_.update(data, bytes); });
  }
  uint64_t digest() {
    wait();
    return hasher_.digest();
  }

 private:
  checksum::Hasher hasher_;
  std::future<void> pending_;
  void wait() {
    if (pending_.valid()) pending_.get();
  }
};

}  // namespace

void require_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return;
  TORCH_CHECK(false, "'", path, "' is ", S_ISDIR(st.st_mode) ? "a directory" : "not a regular file", ", expected a file");
}

File::File(const std::string& path, int flags) : path_(path) {
  if ((flags & O_ACCMODE) == O_RDONLY) require_regular_file(path);
  do {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  } while (fd_ < 0 && errno == EINTR);
  TORCH_CHECK(fd_ >= 0, "cannot open '", path, "': ", std::strerror(errno));
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t File::size() const {
  struct stat st {};
  TORCH_CHECK(::fstat(fd_, &st) == 0, "cannot read the size of '", path_, "': ", std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

void File::sync_and_close() {
  const bool synced = ::fsync(fd_) == 0;
  const int sync_errno = errno;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  TORCH_CHECK(synced && closed, "could not flush '", path_, "' to the disk: ", std::strerror(synced ? errno : sync_errno));
}

void write_at(const File& file, const void* data, size_t bytes, uint64_t offset, const std::string& what) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t done = ::pwrite(file.fd(), p, bytes, static_cast<off_t>(offset));
    if (done < 0 && errno == EINTR) continue;
    TORCH_CHECK(done > 0, "writing ", what, " to '", file.path(), "' failed: ", std::strerror(done < 0 ? errno : ENOSPC));
    p += done;
    bytes -= static_cast<size_t>(done);
    offset += static_cast<uint64_t>(done);
  }
}

void read_at(const File& file, void* data, size_t bytes, uint64_t offset, const std::string& what) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t done = ::pread(file.fd(), p, bytes, static_cast<off_t>(offset));
    if (done < 0 && errno == EINTR) continue;
    TORCH_CHECK(done > 0, "'", file.path(), "': could not read ", what, ": ",
                done < 0 ? std::strerror(errno) : "the file ends before it");
    p += done;
    bytes -= static_cast<size_t>(done);
    offset += static_cast<uint64_t>(done);
  }
}

void StreamWriter::FreeAligned::operator()(char* p) const { std::free(p); }

StreamWriter::StreamWriter(const std::string& path, checksum::Algorithm algorithm) : hasher_(algorithm) {
  const int flags = O_WRONLY | O_CREAT | O_TRUNC;
  try {
    file_ = std::make_unique<File>(path, flags | O_DIRECT);
    direct_ = true;
  } catch (const c10::Error&) {
    // EINVAL: this filesystem has no direct I/O. Anything else fails again
    // below, with its own reason.
    file_ = std::make_unique<File>(path, flags);
  }
  for (auto& block : blocks_) {
    block.reset(static_cast<char*>(std::aligned_alloc(kDirectAlignment, kBlockBytes)));
    TORCH_CHECK(block, "cannot allocate ", kBlockBytes, " bytes to write '", path, "'");
  }
}

StreamWriter::~StreamWriter() {
  if (in_flight_.valid()) in_flight_.wait();  // its error, if any, no longer matters
}

void StreamWriter::wait_in_flight() {
  if (in_flight_.valid()) in_flight_.get();  // rethrows the write's error
}

void StreamWriter::append(const void* data, size_t bytes, const std::string& what) {
  TORCH_CHECK(!finished_, "'", file_->path(), "': append after finish");
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t n = std::min(bytes, kBlockBytes - filled_);
    std::memcpy(blocks_[current_].get() + filled_, p, n);
    filled_ += n;
    appended_ += n;
    p += n;
    bytes -= n;
    if (filled_ == kBlockBytes) write_block(kBlockBytes, what);
  }
}

void StreamWriter::write_block(size_t bytes, const std::string& what) {
  // Hashed here while the block before is still being written.
  const char* block = blocks_[current_].get();
  hasher_.update(block, bytes);
  wait_in_flight();
  const File* file = file_.get();
  in_flight_ = std::async(std::launch::async, [file, block, bytes, offset = block_start_, what] {
    write_at(*file, block, bytes, offset, what);
  });
  current_ ^= 1;
  filled_ = 0;
  block_start_ += bytes;
}

uint64_t StreamWriter::finish() {
  TORCH_CHECK(!finished_, "'", file_->path(), "': finish called twice");
  finished_ = true;
  hasher_.update(blocks_[current_].get(), filled_);
  wait_in_flight();
  if (direct_) {
    // The tail and later overwrites are not whole aligned blocks: they go
    // through the page cache (the fsync flushes them).
    const int flags = ::fcntl(file_->fd(), F_GETFL);
    TORCH_CHECK(flags >= 0 && ::fcntl(file_->fd(), F_SETFL, flags & ~O_DIRECT) == 0, "'", file_->path(),
                "': cannot leave direct I/O: ", std::strerror(errno));
  }
  write_at(*file_, blocks_[current_].get(), filled_, block_start_, "the end of the file");
  block_start_ += filled_;
  filled_ = 0;
  return hasher_.digest();
}

void StreamWriter::overwrite(uint64_t offset, const std::string& bytes, const std::string& what) {
  TORCH_CHECK(finished_ && offset + bytes.size() <= appended_, "'", file_->path(), "': cannot overwrite ", what,
              " at ", offset, " (", appended_, " bytes written", finished_ ? "" : ", not finished", ")");
  write_at(*file_, bytes.data(), bytes.size(), offset, what);
}

void StreamWriter::sync_and_close() {
  TORCH_CHECK(finished_, "'", file_->path(), "': sync_and_close before finish");
  file_->sync_and_close();
}

uint64_t hash_file(const File& file, checksum::Algorithm algorithm, uint64_t mask_offset, const std::string& mask) {
  const uint64_t size = file.size();
  std::vector<char> blocks[2];
  for (auto& block : blocks) block.resize(static_cast<size_t>(std::min<uint64_t>(size, kBlockBytes)));
  BackgroundHasher hasher(algorithm);
  int current = 0;
  for (uint64_t position = 0; position < size; position += kBlockBytes, current ^= 1) {
    // The block read last is still being hashed: this one is read meanwhile.
    const size_t n = static_cast<size_t>(std::min<uint64_t>(size - position, kBlockBytes));
    char* block = blocks[current].data();
    read_at(file, block, n, position, "its bytes");
    for (uint64_t i = std::max(position, mask_offset); i < std::min(position + n, mask_offset + mask.size()); ++i) {
      block[i - position] = mask[i - mask_offset];
    }
    hasher.hash(block, n);
  }
  return hasher.digest();
}

}  // namespace fsdp::file_io
