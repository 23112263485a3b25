#include "offload/disk_store.h"
#include "base/file_io.h"

#include <fcntl.h>
#include <libaio.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/checksum.h"
#include "fsdp/trace.h"
#include "core/scratch_file.h"
#include "base/trace_events.h"

namespace fsdp::offload {
namespace {

constexpr uint64_t kDirectAlignment = 4096;  // O_DIRECT's: memory, offsets and lengths

uint64_t round_up(uint64_t n, uint64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

uint64_t block_checksum(const char* bytes, size_t n) { return checksum::hash(checksum::Algorithm::kXxh3_64, bytes, n); }

// Adds the nanoseconds of its scope to one of the worker's causes (io_times()).
class ScopedTime {
 public:
  explicit ScopedTime(std::atomic<int64_t>& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTime() {
    total_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  }
  ScopedTime(const ScopedTime&) = delete;
  ScopedTime& operator=(const ScopedTime&) = delete;

 private:
  std::atomic<int64_t>& total_;
  std::chrono::steady_clock::time_point start_;
};

// Whether a block can go between the disk and the caller's memory without
// a staging buffer: O_DIRECT needs its address and its length aligned. The
// engine's own buffers are page-aligned (fsdp/memory.h), so every whole
// block of them is; a ragged last block, and memory from elsewhere, is staged.
bool moves_in_place(const char* bytes, size_t n) {
  return reinterpret_cast<uintptr_t>(bytes) % kDirectAlignment == 0 && n % kDirectAlignment == 0;
}

// Copies a block into its staging buffer, zero-padded to `aligned` (the
// copy timed as the worker's, and its bytes counted).
void stage_block(char* staging, const char* bytes, size_t n, size_t aligned, std::atomic<int64_t>& copy_ns,
                 std::atomic<int64_t>& staged_bytes) {
  ScopedTime copying(copy_ns);
  std::memcpy(staging, bytes, n);
  std::memset(staging + n, 0, aligned - n);
  staged_bytes += static_cast<int64_t>(n);
}

// libaio's calls, timed as the disk's: one block submitted, and at least
// one completion reaped (restarted after a signal handler ran on the thread,
// which the kernel never restarts).
int submit_block(io_context_t context, iocb* block, std::atomic<int64_t>& disk_ns) {
  ScopedTime submitting(disk_ns);
  iocb* list[1] = {block};
  return io_submit(context, 1, list);
}
int reap_events(io_context_t context, std::vector<io_event>& events, std::atomic<int64_t>& disk_ns) {
  ScopedTime waiting(disk_ns);
  int got;
  do {
    got = io_getevents(context, 1, static_cast<long>(events.size()), events.data(), nullptr);
  } while (got == -EINTR);
  return got;
}

}  // namespace

struct DiskStore::Aio {
  io_context_t context = nullptr;
  std::vector<iocb> blocks;  // one control block per staging buffer
  ~Aio() {
    if (context) io_destroy(context);
  }
};

void DiskStore::AlignedFree::operator()(char* p) const { std::free(p); }

DiskStore::DiskStore(DiskStoreOptions options, std::vector<int64_t> slot_bytes, std::vector<std::string> slot_labels) : options_(std::move(options)), slot_labels_(std::move(slot_labels)) {
  const int64_t block = options_.block_bytes();
  TORCH_CHECK(slot_labels_.empty() || slot_labels_.size() == slot_bytes.size(), "offload: ", slot_labels_.size(),
              " slot labels for ", slot_bytes.size(), " slots");
  TORCH_CHECK(block > 0 && block % static_cast<int64_t>(kDirectAlignment) == 0,
              "offload: block_bytes must be a positive multiple of ", kDirectAlignment, ", got ", block);
  TORCH_CHECK(options_.queue_depth() >= 1, "offload: queue_depth must be at least 1, got ", options_.queue_depth());
  path_ = scratch_file_path(options_);
  for (int64_t bytes : slot_bytes) {
    TORCH_CHECK(bytes >= 0, "offload: a slot of ", bytes, " bytes");
    Slot slot;
    slot.offset = file_bytes_;
    slot.bytes = bytes;
    file_bytes_ += round_up(static_cast<uint64_t>(bytes), static_cast<uint64_t>(block));
    slots_.push_back(std::move(slot));
  }
  try {
    open_file();
    reserve_space();
  // Only libaio stages: the worker's pread/pwrite move the caller's bytes directly.
  const int buffers = engine_ == IoEngine::kLibaio ? options_.queue_depth() : 0;
  staging_.reserve(buffers);
  for (int i = 0; i < buffers; ++i) {
    void* p = nullptr;
    TORCH_CHECK(posix_memalign(&p, kDirectAlignment, block) == 0, "offload: cannot allocate a staging buffer of ",
                block, " bytes");
    staging_.emplace_back(static_cast<char*>(p));
  }
    worker_ = std::thread([this] { run_worker(); });
    // The name goes at once; the open file stays ours. Its space returns to
    // the disk when the process ends, however it ends (an error, MPI_Abort,
    // SIGKILL): a crashed run leaves no scratch file behind.
    ::unlink(path_.c_str());
  } catch (...) {
    // No destructor runs for a store that failed to open: leave no file behind.
    aio_.reset();
    file_.reset();
    ::unlink(path_.c_str());
    throw;
  }
}

DiskStore::~DiskStore() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
  aio_.reset();
  file_.reset();
}

std::string DiskStore::reachable_path() const { return "/proc/self/fd/" + std::to_string(file_->fd()); }

void DiskStore::open_file() {
  // A scratch file left by a run that crashed is truncated below: its space counts as free.
  int64_t free_bytes = scratch_bytes_free(options_.dir(), {path_});
  if (options_.free_bytes_limit() >= 0) free_bytes = std::min(free_bytes, options_.free_bytes_limit());
  TORCH_CHECK(static_cast<int64_t>(file_bytes_) <= free_bytes, "offload: the folder '", options_.dir(), "' has ",
              free_bytes, " bytes free, and the scratch file ", path_, " needs ", file_bytes_, " bytes (",
              slots_.size(), " tensors): free space there, give another --offload-dir, or offload less");
  const int flags = O_RDWR | O_CREAT | O_TRUNC;
  const bool want_direct = options_.engine() != IoEngine::kThreads;
  if (want_direct) {
    const int fd = ::open(path_.c_str(), flags | O_DIRECT | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      file_ = std::make_unique<file_io::File>(path_, flags | O_DIRECT);
    } else {
      TORCH_CHECK(options_.engine() == IoEngine::kAuto, "offload: the libaio engine needs O_DIRECT, and '",
                  options_.dir(), "' refuses it: ", std::strerror(errno), " (the threads engine works there)");
      engine_description_ = "threads (pread/pwrite), buffered: '" + options_.dir() + "' refuses O_DIRECT (" +
                            std::strerror(errno) + ")";
    }
  }
  if (file_) {
    auto aio = std::make_unique<Aio>();
    const int rc = io_setup(options_.queue_depth(), &aio->context);
    if (rc == 0) {
      aio->blocks.resize(options_.queue_depth());
      aio_ = std::move(aio);
      engine_ = IoEngine::kLibaio;
      engine_description_ = "libaio, O_DIRECT, " + std::to_string(options_.queue_depth()) + " blocks of " +
                            std::to_string(options_.block_bytes()) + " bytes in flight";
      return;
    }
    aio->context = nullptr;
    TORCH_CHECK(options_.engine() == IoEngine::kAuto, "offload: libaio's io_setup failed: ", std::strerror(-rc));
    file_.reset();
    engine_description_ = std::string("threads (pread/pwrite), buffered: libaio's io_setup failed (") +
                          std::strerror(-rc) + ")";
  }
  file_ = std::make_unique<file_io::File>(path_, flags);
  engine_ = IoEngine::kThreads;
  if (engine_description_.empty()) engine_description_ = "threads (pread/pwrite), buffered, as asked";
}

void DiskStore::reserve_space() {
  if (file_bytes_ == 0) return;
  // Reserved now, so that a disk that fills up later fails here and not in
  // the middle of a step with half a slot written.
  if (::fallocate(file_->fd(), 0, 0, static_cast<off_t>(file_bytes_)) == 0) return;
  const int error = errno;
  TORCH_CHECK(error == EOPNOTSUPP || error == ENOSYS, "offload: cannot reserve ", file_bytes_, " bytes for ", path_,
              " in '", options_.dir(), "': ", std::strerror(error));
  TORCH_CHECK(::ftruncate(file_->fd(), static_cast<off_t>(file_bytes_)) == 0, "offload: cannot size ", path_, " to ",
              file_bytes_, " bytes: ", std::strerror(errno));
}

int64_t DiskStore::slot_bytes(size_t slot) const {
  TORCH_CHECK(slot < slots_.size(), "offload: slot ", slot, " of a store with ", slots_.size());
  return slots_[slot].bytes;
}

int64_t DiskStore::bytes_written() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_written_;
}

int64_t DiskStore::bytes_read() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_read_;
}

std::shared_future<void> DiskStore::write(size_t slot, const void* data) {
  return enqueue(true, slot, static_cast<char*>(const_cast<void*>(data)));
}

std::shared_future<void> DiskStore::read(size_t slot, void* data) { return enqueue(false, slot, static_cast<char*>(data)); }

std::shared_future<void> DiskStore::enqueue(bool is_write, size_t slot, char* data) {
  TORCH_CHECK(slot < slots_.size(), "offload: slot ", slot, " of ", path_, ", which has ", slots_.size());
  TORCH_CHECK(data != nullptr || slots_[slot].bytes == 0, "offload: a null buffer for slot ", slot);
  Request request;
  request.is_write = is_write;
  request.slot = slot;
  request.data = data;
  std::shared_future<void> done = request.done.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(request));
  }
  wake_.notify_one();
  return done;
}

OffloadStats DiskStore::io_times() const {
  OffloadStats times;
  times.copy_seconds = copy_ns_.load() * 1e-9;
  times.checksum_seconds = checksum_ns_.load() * 1e-9;
  times.disk_seconds = disk_ns_.load() * 1e-9;
  times.bytes_staged = staged_bytes_.load();
  return times;
}

void DiskStore::run_worker() {
  trace::name_thread("offload io");
  for (;;) {
    Request request;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is done
      request = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      serve(request);
      request.done.set_value();
    } catch (...) {
      request.done.set_exception(std::current_exception());
    }
  }
}

void DiskStore::serve(Request& request) {
  TORCH_CHECK(broken_.empty(), broken_, " (an earlier request; the store takes no more)");
  Slot& slot = slots_[request.slot];
  const double begin_us = trace::enabled() ? trace::now_us() : -1.0;
  const OffloadStats before = io_times();
  if (request.is_write) {
    slot.block_checksums.clear();  // until this write completes, the slot holds nothing readable
    std::vector<uint64_t> checksums;
    if (engine_ == IoEngine::kLibaio) {
      transfer_aio(slot, request.slot, true, request.data, checksums);
    } else {
      write_blocks_threads(slot, request.slot, request.data, checksums);
    }
    slot.block_checksums = std::move(checksums);
  } else {
    TORCH_CHECK(!slot.block_checksums.empty() || slot.bytes == 0, "offload: slot ", request.slot, " of ", path_,
                " has no complete write to read back (never written, or its last write failed)");
    if (engine_ == IoEngine::kLibaio) {
      std::vector<uint64_t> unused;
      transfer_aio(slot, request.slot, false, request.data, unused);
    } else {
      read_blocks_threads(slot, request.slot, request.data);
    }
  }
  if (begin_us >= 0) {
    const OffloadStats after = io_times();
    std::ostringstream detail;
    detail << slot.bytes << " bytes; copies " << (after.copy_seconds - before.copy_seconds) * 1e3 << " ms, checksums "
           << (after.checksum_seconds - before.checksum_seconds) * 1e3 << " ms, disk "
           << (after.disk_seconds - before.disk_seconds) * 1e3 << " ms";
    trace::complete(std::string(request.is_write ? "write " : "read ") +
                        (slot_labels_.empty() ? "slot " + std::to_string(request.slot) : slot_labels_[request.slot]),
                    "offload", begin_us, detail.str());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  (request.is_write ? bytes_written_ : bytes_read_) += slot.bytes;
}

std::string DiskStore::block_name(size_t slot, size_t block) const {
  const Slot& s = slots_[slot];
  const uint64_t offset = s.offset + block * static_cast<uint64_t>(options_.block_bytes());
  return "block " + std::to_string(block) + " of slot " + std::to_string(slot) + " (offset " + std::to_string(offset) +
         ")";
}

void DiskStore::check_block(const Slot& slot, size_t index, size_t block, const char* bytes, size_t n) const {
  uint64_t sum;
  {
    ScopedTime hashing(checksum_ns_);
    sum = block_checksum(bytes, n);
  }
  TORCH_CHECK(sum == slot.block_checksums[block], "offload: ", block_name(index, block), " of ",
              path_, " does not match the checksum it was written with: the scratch file was changed or corrupted");
}

void DiskStore::write_blocks_threads(const Slot& slot, size_t index, const char* data,
                                     std::vector<uint64_t>& checksums) {
  const int64_t block = options_.block_bytes();
  const size_t blocks = static_cast<size_t>((slot.bytes + block - 1) / block);
  checksums.resize(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(block, slot.bytes - static_cast<int64_t>(b) * block));
    const char* bytes = data + b * block;
    {
      ScopedTime hashing(checksum_ns_);
      checksums[b] = block_checksum(bytes, n);
    }
    ScopedTime writing(disk_ns_);
    file_io::write_at(*file_, bytes, n, slot.offset + b * block, block_name(index, b));
  }
}

void DiskStore::read_blocks_threads(const Slot& slot, size_t index, char* data) {
  const int64_t block = options_.block_bytes();
  const size_t blocks = slot.block_checksums.size();
  for (size_t b = 0; b < blocks; ++b) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(block, slot.bytes - static_cast<int64_t>(b) * block));
    char* bytes = data + b * block;
    {
      ScopedTime reading(disk_ns_);
      file_io::read_at(*file_, bytes, n, slot.offset + b * block, block_name(index, b));
    }
    check_block(slot, index, b, bytes, n);
  }
}

std::string DiskStore::aio_block_done(const Slot& slot, size_t index, size_t b, bool is_write, const char* staging,
                                      char* data, long res) {
  const int64_t block = options_.block_bytes();
  const size_t n = static_cast<size_t>(std::min<int64_t>(block, slot.bytes - static_cast<int64_t>(b) * block));
  if (res < 0) {
    return std::string("offload: ") + (is_write ? "writing " : "reading ") + block_name(index, b) + " of " + path_ +
           " failed: " + std::strerror(static_cast<int>(-res));
  }
  if (static_cast<size_t>(res) < n) {
    return "offload: " + path_ + (is_write ? " took " : " ends inside ") + block_name(index, b) + ": " +
           std::to_string(res) + " of " + std::to_string(n) + " bytes" +
           (is_write ? " (is the disk full?)" : " (the scratch file was truncated)");
  }
  if (is_write) return "";
  try {
    if (staging == nullptr) {  // read in place
      check_block(slot, index, b, data + b * block, n);
      return "";
    }
    check_block(slot, index, b, staging, n);
    ScopedTime copying(copy_ns_);
    std::memcpy(data + b * block, staging, n);
    staged_bytes_ += static_cast<int64_t>(n);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// libaio: up to queue_depth blocks in flight, each with its own control
// block, and moved in place (moves_in_place) or through that control
// block's staging buffer; completions come in any order. Every submitted block is reaped
// before returning, even after an error, so no buffer is still in the
// kernel's hands when the next request reuses it. A write fills in
// `checksums`; a read checks each block against the slot's.
void DiskStore::transfer_aio(const Slot& slot, size_t index, bool is_write, char* data,
                             std::vector<uint64_t>& checksums) {
  const int64_t block = options_.block_bytes();
  const size_t blocks = is_write ? static_cast<size_t>((slot.bytes + block - 1) / block) : slot.block_checksums.size();
  checksums.resize(is_write ? blocks : 0);
  auto bytes_of = [&](size_t b) {
    return static_cast<size_t>(std::min<int64_t>(block, slot.bytes - static_cast<int64_t>(b) * block));
  };
  std::vector<size_t> buffer_block(staging_.size());
  std::vector<char> buffer_staged(staging_.size(), 0);
  std::vector<int> free_buffers;
  for (int i = static_cast<int>(staging_.size()) - 1; i >= 0; --i) free_buffers.push_back(i);
  std::vector<io_event> events(staging_.size());
  // The failure of the lowest block (completions come in any order, and a
  // read past the end of a truncated file completes at once); every block
  // in flight is still reaped.
  std::string error;
  size_t error_block = SIZE_MAX;
  auto completed = [&](int buffer, long res) {
    const size_t b = buffer_block[buffer];
    if (b > error_block) return;
    std::string failure =
        aio_block_done(slot, index, b, is_write, buffer_staged[buffer] ? staging_[buffer].get() : nullptr, data, res);
    if (failure.empty()) return;
    error = std::move(failure);
    error_block = b;
  };
  size_t in_flight = 0;
  auto reap = [&] {
    const int got = reap_events(aio_->context, events, disk_ns_);
    if (got < 1) {
      // Blocks may still be in the kernel's hands: no later request may reuse their buffers.
      broken_ = "offload: io_getevents on " + path_ + " failed: " + std::strerror(-got);
      TORCH_CHECK(false, broken_);
    }
    for (int e = 0; e < got; ++e) {
      const int buffer = static_cast<int>(reinterpret_cast<intptr_t>(events[e].data));
      completed(buffer, static_cast<long>(events[e].res));
      free_buffers.push_back(buffer);
      --in_flight;
    }
  };
  for (size_t b = 0; b < blocks && error.empty(); ++b) {
    if (free_buffers.empty()) reap();
    const int buffer = free_buffers.back();
    free_buffers.pop_back();
    buffer_block[buffer] = b;
    const size_t n = bytes_of(b), aligned = round_up(n, kDirectAlignment);
    char* const bytes = data + b * block;
    const bool staged = !moves_in_place(bytes, n);
    buffer_staged[buffer] = staged;
    char* const io_bytes = staged ? staging_[buffer].get() : bytes;
    iocb* cb = &aio_->blocks[buffer];
    const auto offset = static_cast<long long>(slot.offset + b * block);
    if (is_write) {
      if (staged) stage_block(io_bytes, bytes, n, aligned, copy_ns_, staged_bytes_);
      {
        ScopedTime hashing(checksum_ns_);
        checksums[b] = block_checksum(io_bytes, n);
      }
      io_prep_pwrite(cb, file_->fd(), io_bytes, aligned, offset);
    } else {
      io_prep_pread(cb, file_->fd(), io_bytes, aligned, offset);
    }
    cb->data = reinterpret_cast<void*>(static_cast<intptr_t>(buffer));
    const int rc = submit_block(aio_->context, cb, disk_ns_);
    if (rc != 1) {
      error = "offload: submitting " + block_name(index, b) + " of " + path_ + " failed: " +
              (rc < 0 ? std::strerror(-rc) : "the kernel took 0 of 1 blocks");
      free_buffers.push_back(buffer);
      break;
    }
    ++in_flight;
  }
  while (in_flight > 0) reap();
  TORCH_CHECK(error.empty(), error);
}

}  // namespace fsdp::offload
