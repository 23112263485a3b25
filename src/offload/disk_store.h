#pragma once
// The engine's own (not installed); its options are public (fsdp/offload.h).
// One rank's scratch file for offloaded state (ZeRO-Infinity's swap file):
// a fixed set of slots, one per tensor, written and read back
// asynchronously in blocks, every block checked against the checksum taken
// when it was written.
//
// The I/O engine is chosen when the store opens, and engine_name() says
// which one it got:
// - libaio with O_DIRECT (Debian's libaio-dev): several blocks in flight at
//   once, without the page cache (offloading to disk is for state that does
//   not fit in memory: caching it there would defeat the point), straight
//   between the caller's memory and the disk where the memory is aligned
//   (the engine's buffers are page-aligned: fsdp/memory.h), else through
//   aligned staging buffers;
// - a worker thread with pread/pwrite, where the file system refuses
//   O_DIRECT (tmpfs, some container overlays) or the kernel refuses libaio
//   (io_setup fails in some sandboxes).
// Either way one worker thread owns the file: requests run in the order
// they were made, while the caller computes.
//
// A scratch file is never a checkpoint: it is created empty, its name is
// removed as soon as it is open (its space goes back to the disk when the
// process ends, however it ends), and it holds nothing that outlives the
// process.

#include <c10/util/Exception.h>

#include "fsdp/offload.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fsdp::file_io {
class File;  // src/base/file_io.h
}

namespace fsdp::offload {

class DiskStore {
 public:
  // Creates the scratch file with room for every slot, reserved on the disk
  // up front: a folder without room is refused here, naming it, the bytes
  // needed and the bytes free, before anything has been trained.
  // `slot_labels` (optional, one per slot) name the slots' requests in the
  // trace (fsdp/trace.h): "read unit 3 exp_avg"; else "read slot 12".
  DiskStore(DiskStoreOptions options, std::vector<int64_t> slot_bytes, std::vector<std::string> slot_labels = {});
  ~DiskStore();  // finishes what is queued, then closes the file (which frees it)
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // Asynchronous: the slot's bytes from `data` to the file, or back. The
  // memory must stay valid (and, for a write, unchanged) until the returned
  // future is ready; get() throws the request's error: a block whose bytes
  // no longer match their checksum, a file cut short, a failed system call,
  // each naming the file, the slot and the offset.
  std::shared_future<void> write(size_t slot, const void* data);
  std::shared_future<void> read(size_t slot, void* data);

  size_t num_slots() const { return slots_.size(); }
  int64_t slot_bytes(size_t slot) const;
  uint64_t file_bytes() const { return file_bytes_; }
  // The name the file was created with (in messages; unlinked at once).
  const std::string& path() const { return path_; }
  // Where this process can still open the file (/proc/self/fd/N): for
  // tools and tests that inspect or damage it.
  std::string reachable_path() const;
  IoEngine engine() const { return engine_; }
  // "libaio, O_DIRECT" or "threads (pread/pwrite), buffered", and why a fallback was taken.
  const std::string& engine_description() const { return engine_description_; }
  // Bytes moved so far (the slots' own bytes, not the alignment padding).
  int64_t bytes_written() const;
  int64_t bytes_read() const;
  // The worker's seconds so far by cause (OffloadStats's copy, checksum and
  // disk seconds); bytes and wait are the caller's to fill.
  OffloadStats io_times() const;

 private:
  struct Slot {
    uint64_t offset = 0;  // aligned to block_bytes
    int64_t bytes = 0;
    std::vector<uint64_t> block_checksums;  // empty until the slot is first written
  };
  struct Request {
    bool is_write = false;
    size_t slot = 0;
    char* data = nullptr;
    std::promise<void> done;
  };
  struct AlignedFree {
    void operator()(char* p) const;
  };
  struct Aio;  // libaio's context and control blocks, defined where libaio.h is included

  DiskStoreOptions options_;
  std::string path_;
  std::vector<Slot> slots_;
  uint64_t file_bytes_ = 0;
  std::unique_ptr<file_io::File> file_;
  IoEngine engine_ = IoEngine::kThreads;
  std::string engine_description_;
  std::unique_ptr<Aio> aio_;
  std::vector<std::unique_ptr<char, AlignedFree>> staging_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Request> queue_;
  bool stopping_ = false;
  int64_t bytes_written_ = 0, bytes_read_ = 0;
  std::vector<std::string> slot_labels_;
  // The worker's nanoseconds by cause (io_times()).
  mutable std::atomic<int64_t> copy_ns_{0}, checksum_ns_{0}, disk_ns_{0};
  std::atomic<int64_t> staged_bytes_{0};  // copied through staging buffers (OffloadStats::bytes_staged)
  std::string broken_;  // set (by the worker) when I/O may be left in flight: every later request fails
  std::thread worker_;

  void open_file();
  void reserve_space();
  std::shared_future<void> enqueue(bool is_write, size_t slot, char* data);
  void run_worker();
  void serve(Request& request);
  // One block: where it is and how many of its bytes are the slot's.
  std::string block_name(size_t slot, size_t block) const;
  void write_blocks_threads(const Slot& slot, size_t index, const char* data, std::vector<uint64_t>& checksums);
  void read_blocks_threads(const Slot& slot, size_t index, char* data);
  void transfer_aio(const Slot& slot, size_t index, bool is_write, char* data, std::vector<uint64_t>& checksums);
  // One block libaio completed with `res` (bytes, or -errno): "" or what went
  // wrong; a read's block is checked, in place or in `staging` (then copied
  // into `data`).
  std::string aio_block_done(const Slot& slot, size_t index, size_t block, bool is_write, const char* staging,
                             char* data, long res);
  void check_block(const Slot& slot, size_t index, size_t block, const char* bytes, size_t n) const;
};

}  // namespace fsdp::offload
