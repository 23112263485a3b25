// The offload scratch store (src/offload/disk_store.h), single-process: every
// slot comes back byte for byte through each I/O engine, and each failure
// (a corrupted block, a truncated file, a full disk, bad options, a read of
// a slot never written) is an error that names the file, the block and the
// offset.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "fsdp/trace.h"
#include "offload/disk_store.h"
#include "base/trace_events.h"

using fsdp::offload::DiskStore;
using fsdp::offload::DiskStoreOptions;
using fsdp::offload::IoEngine;

namespace {

std::string scratch_dir(const std::string& name) {
  const std::string dir = std::filesystem::temp_directory_path() / ("fsdp-offload-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<char> random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<char> bytes(n);
  for (auto& b : bytes) b = static_cast<char>(rng());
  return bytes;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return fsdp::error_message(e);
  }
  return "";
}

// Sizes on both sides of every boundary: empty, under one disk block, one
// disk block, several store blocks with a ragged end.
const std::vector<int64_t> kSlotBytes = {0, 1, 4095, 4096, 3 * (1 << 20) + 17, 5 << 20};

// libaio asked for by name where the machine cannot give it (no O_DIRECT in
// the temporary folder, io_setup refused) skips, saying why.
#define SKIP_WITHOUT_LIBAIO(statement)                                                        \
  try {                                                                                       \
    statement;                                                                                \
  } catch (const c10::Error& e) {                                                             \
    const std::string what = e.what_without_backtrace();                                      \
    if (GetParam() == IoEngine::kLibaio &&                                                    \
        (what.find("refuses it") != std::string::npos || what.find("io_setup") != std::string::npos)) \
      GTEST_SKIP() << what;                                                                   \
    throw;                                                                                    \
  }

DiskStoreOptions small_blocks(const std::string& dir, IoEngine engine) {
  // 256 KiB blocks and 3 in flight: every slot above spans many blocks and the queue wraps.
  return DiskStoreOptions(dir).engine(engine).block_bytes(256 << 10).queue_depth(3);
}

class Engines : public ::testing::TestWithParam<IoEngine> {};

}  // namespace

TEST_P(Engines, EverySlotComesBackByteForByte) {
  const std::string dir = scratch_dir(std::string("roundtrip-") + fsdp::enum_name(GetParam()));
  {
    std::unique_ptr<DiskStore> store_owner;
    std::vector<std::string> labels;
    for (size_t s = 0; s < kSlotBytes.size(); ++s) labels.push_back("s" + std::to_string(s));
    SKIP_WITHOUT_LIBAIO(store_owner = std::make_unique<DiskStore>(small_blocks(dir, GetParam()), kSlotBytes, labels));
    DiskStore& store = *store_owner;
    std::cout << "engine: " << store.engine_description() << "\n";
    fsdp::trace::enable();
    const double since_us = fsdp::trace::now_us();  // the trace keeps every earlier test's events
    if (GetParam() != IoEngine::kAuto) EXPECT_EQ(store.engine(), GetParam());
    EXPECT_EQ(store.engine_description().rfind(fsdp::enum_name(store.engine()), 0), 0)
        << store.engine_description();
    EXPECT_FALSE(std::filesystem::exists(store.path())) << "the name is unlinked once the file is open";
    EXPECT_TRUE(std::filesystem::exists(store.reachable_path()));
    std::vector<std::vector<char>> written, back;
    std::vector<std::shared_future<void>> pending;
    for (size_t s = 0; s < kSlotBytes.size(); ++s) {
      written.push_back(random_bytes(kSlotBytes[s], 7 + s));
      back.emplace_back(kSlotBytes[s]);
      pending.push_back(store.write(s, written[s].data()));
    }
    // Reads queued behind the writes: requests run in order.
    for (size_t s = 0; s < kSlotBytes.size(); ++s) pending.push_back(store.read(s, back[s].data()));
    for (auto& p : pending) p.get();
    for (size_t s = 0; s < kSlotBytes.size(); ++s) EXPECT_EQ(written[s], back[s]) << "slot " << s;
    // The I/O thread's time by cause: only libaio copies (through its
    // O_DIRECT staging buffers); pread/pwrite move the caller's bytes.
    const fsdp::offload::OffloadStats times = store.io_times();
    EXPECT_GT(times.checksum_seconds, 0);
    EXPECT_GT(times.disk_seconds, 0);
    EXPECT_EQ(times.copy_seconds > 0, store.engine() == IoEngine::kLibaio) << times.copy_seconds;
    // And in the trace, on its own thread: one event per request, by label.
    const std::string trace_file = dir + "/../disk_store_trace." + std::to_string(::getpid()) + ".json";
    fsdp::trace::write(trace_file, 0);
    fsdp::trace::enable(false);
    const nlohmann::json trace = nlohmann::json::parse(std::ifstream(trace_file));
    std::filesystem::remove(trace_file);
    int io_thread = -1, writes = 0, reads = 0;
    for (const auto& e : trace["traceEvents"]) {
      if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "offload io") io_thread = e["tid"];  // the latest
    }
    for (const auto& e : trace["traceEvents"]) {
      if (e["ph"] != "X" || e.value("cat", "") != "offload" || e["ts"].get<double>() < since_us) continue;
      EXPECT_EQ(e["tid"], io_thread) << e.dump();
      const std::string name = e["name"];
      writes += name.rfind("write s", 0) == 0, reads += name.rfind("read s", 0) == 0;
      EXPECT_NE(e["args"]["detail"].get<std::string>().find(" ms, checksums "), std::string::npos) << e.dump();
    }
    EXPECT_GE(io_thread, 1) << "no thread named 'offload io'";
    EXPECT_EQ(writes, static_cast<int>(kSlotBytes.size()));
    EXPECT_EQ(reads, static_cast<int>(kSlotBytes.size()));
    int64_t total = 0;
    for (int64_t b : kSlotBytes) total += b;
    EXPECT_EQ(store.bytes_written(), total);
    EXPECT_EQ(store.bytes_read(), total);
    // A slot written again holds the new bytes.
    std::vector<char> newer = random_bytes(kSlotBytes[4], 99), again(kSlotBytes[4]);
    store.write(4, newer.data()).get();
    store.read(4, again.data()).get();
    EXPECT_EQ(newer, again);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "closing the store removes its scratch file";
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(DiskStore, Engines, ::testing::Values(IoEngine::kAuto, IoEngine::kLibaio, IoEngine::kThreads),
                         [](const auto& info) { return std::string(fsdp::enum_name(info.param)); });

// A byte changed on the disk is found by the block's checksum and named.
TEST_P(Engines, ACorruptedBlockIsNamedWithItsOffset) {
  const std::string dir = scratch_dir("corrupt");
  std::unique_ptr<DiskStore> store_owner;
  SKIP_WITHOUT_LIBAIO(store_owner = std::make_unique<DiskStore>(small_blocks(dir, GetParam()), kSlotBytes));
  DiskStore& store = *store_owner;
  std::vector<char> bytes = random_bytes(kSlotBytes[5], 3), back(kSlotBytes[5]);
  store.write(5, bytes.data()).get();
  const uint64_t slot_offset = store.file_bytes() - static_cast<uint64_t>(kSlotBytes[5]);  // the last slot, block-aligned
  {
    const int fd = ::open(store.reachable_path().c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const char flipped = static_cast<char>(~bytes[(256 << 10) + 10]);
    ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(slot_offset + (256 << 10) + 10)), 1);
    ::fsync(fd);
    ::close(fd);
  }
  const std::string error = error_of([&] { store.read(5, back.data()).get(); });
  EXPECT_NE(error.find("block 1 of slot 5 (offset " + std::to_string(slot_offset + (256 << 10)) + ")"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("does not match the checksum"), std::string::npos) << error;
  EXPECT_NE(error.find(store.path()), std::string::npos) << error;
  std::filesystem::remove_all(dir);
}

// Page-aligned memory (as the engine's buffers are: fsdp/memory.h) moves
// between the disk and the caller in place: libaio stages only a slot's
// ragged last block, and a corrupted block read in place is still named.
TEST_P(Engines, AlignedMemoryMovesInPlace) {
  const std::string dir = scratch_dir("in-place");
  std::unique_ptr<DiskStore> store_owner;
  SKIP_WITHOUT_LIBAIO(store_owner = std::make_unique<DiskStore>(small_blocks(dir, GetParam()), kSlotBytes));
  DiskStore& store = *store_owner;
  auto aligned = [](size_t n) {
    void* p = nullptr;
    EXPECT_EQ(posix_memalign(&p, 4096, n + 4096), 0);
    return std::unique_ptr<char, decltype(&std::free)>(static_cast<char*>(p), &std::free);
  };
  const bool staging = store.engine() == IoEngine::kLibaio;
  int64_t want_staged = 0;
  for (size_t s : {size_t{4}, size_t{5}}) {  // 3 MiB + 17 bytes (ragged), 5 MiB (whole blocks)
    const std::vector<char> bytes = random_bytes(kSlotBytes[s], 11 + s);
    auto out = aligned(bytes.size()), back = aligned(bytes.size());
    std::memcpy(out.get(), bytes.data(), bytes.size());
    store.write(s, out.get()).get();
    store.read(s, back.get()).get();
    EXPECT_EQ(std::memcmp(back.get(), bytes.data(), bytes.size()), 0) << "slot " << s;
    want_staged += staging ? 2 * (kSlotBytes[s] % (256 << 10)) : 0;  // the last block, out and back
    EXPECT_EQ(store.io_times().bytes_staged, want_staged) << "slot " << s;
  }
  // The same bytes one byte off the page are staged whole.
  auto off = aligned(kSlotBytes[5] + 1);
  store.write(5, off.get() + 1).get();
  want_staged += staging ? kSlotBytes[5] : 0;
  EXPECT_EQ(store.io_times().bytes_staged, want_staged);
  // A byte changed on the disk, read in place: named, block and offset.
  const uint64_t slot_offset = store.file_bytes() - static_cast<uint64_t>(kSlotBytes[5]);
  {
    const int fd = ::open(store.reachable_path().c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const char flipped = static_cast<char>(~off.get()[1 + (256 << 10) * 2 + 5]);
    ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(slot_offset + (256 << 10) * 2 + 5)), 1);
    ::close(fd);
  }
  auto back = aligned(kSlotBytes[5]);
  const std::string error = error_of([&] { store.read(5, back.get()).get(); });
  EXPECT_NE(error.find("block 2 of slot 5 (offset " + std::to_string(slot_offset + (256 << 10) * 2) + ")"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("does not match the checksum"), std::string::npos) << error;
  EXPECT_EQ(store.io_times().bytes_staged, want_staged) << "the corrupt read was in place too";
  std::filesystem::remove_all(dir);
}

// A file cut short (another process, a disk quota) is named, not read as zeros.
TEST_P(Engines, ATruncatedFileIsNamedWithTheBlockItEndsIn) {
  const std::string dir = scratch_dir("truncated");
  std::unique_ptr<DiskStore> store_owner;
  SKIP_WITHOUT_LIBAIO(store_owner = std::make_unique<DiskStore>(small_blocks(dir, GetParam()), kSlotBytes));
  DiskStore& store = *store_owner;
  std::vector<char> bytes = random_bytes(kSlotBytes[5], 4), back(kSlotBytes[5]);
  store.write(5, bytes.data()).get();
  const uint64_t slot_offset = store.file_bytes() - static_cast<uint64_t>(kSlotBytes[5]);
  ASSERT_EQ(::truncate(store.reachable_path().c_str(), static_cast<off_t>(slot_offset + (256 << 10) * 2 + 100)), 0);
  const std::string error = error_of([&] { store.read(5, back.data()).get(); });
  EXPECT_NE(error.find("block 2 of slot 5"), std::string::npos) << error;
  EXPECT_NE(error.find(store.path()), std::string::npos) << error;
  std::filesystem::remove_all(dir);
}

// tmpfs refuses O_DIRECT: auto falls back to the pread/pwrite worker and says
// why; libaio, asked for by name, is refused there naming the folder.
TEST(DiskStore, WhereODirectIsRefusedAutoFallsBackToThreadsAndSaysWhy) {
  const std::string dir = "/dev/shm/fsdp-offload-test-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const int probe = ::open((dir + "/probe").c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (probe >= 0) {
    ::close(probe);
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "/dev/shm accepts O_DIRECT here: no file system to test the fallback on";
  }
  {
    DiskStore store(small_blocks(dir, IoEngine::kAuto), kSlotBytes);
    EXPECT_EQ(store.engine(), IoEngine::kThreads);
    EXPECT_NE(store.engine_description().find("refuses O_DIRECT"), std::string::npos) << store.engine_description();
    std::vector<char> bytes = random_bytes(kSlotBytes[4], 5), back(kSlotBytes[4]);
    store.write(4, bytes.data()).get();
    store.read(4, back.data()).get();
    EXPECT_EQ(bytes, back);
  }
  const std::string error = error_of([&] { DiskStore store(small_blocks(dir, IoEngine::kLibaio), kSlotBytes); });
  EXPECT_NE(error.find("the libaio engine needs O_DIRECT, and '" + dir + "' refuses it"), std::string::npos) << error;
  std::filesystem::remove_all(dir);
}

// A kernel that refuses libaio's context (here: more blocks in flight than
// fs.aio-max-nr allows): auto falls back to the worker and says why; libaio
// asked for by name is refused.
TEST(DiskStore, WhereLibaioCannotStartAutoFallsBackToThreadsAndSaysWhy) {
  std::ifstream limit_file("/proc/sys/fs/aio-max-nr");
  int64_t aio_max = 0;
  if (!(limit_file >> aio_max) || aio_max >= (int64_t{1} << 30)) GTEST_SKIP() << "no usable fs.aio-max-nr";
  const std::string dir = scratch_dir("no-aio");
  const int depth = static_cast<int>(aio_max + 1);
  {
    DiskStore store(DiskStoreOptions(dir).block_bytes(4096).queue_depth(depth), kSlotBytes);
    EXPECT_EQ(store.engine(), IoEngine::kThreads);
    EXPECT_NE(store.engine_description().find("libaio's io_setup failed"), std::string::npos)
        << store.engine_description();
    std::vector<char> bytes = random_bytes(kSlotBytes[4], 6), back(kSlotBytes[4]);
    store.write(4, bytes.data()).get();
    store.read(4, back.data()).get();
    EXPECT_EQ(bytes, back);
  }
  const std::string error = error_of(
      [&] { DiskStore store(DiskStoreOptions(dir).engine(IoEngine::kLibaio).block_bytes(4096).queue_depth(depth), {4096}); });
  EXPECT_NE(error.find("libaio's io_setup failed"), std::string::npos) << error;
  std::filesystem::remove_all(dir);
}

// A folder without room is refused before any file is made, with the bytes
// needed and free.
TEST(DiskStore, AFullDiskIsRefusedBeforeAnythingIsWritten) {
  const std::string dir = scratch_dir("full");
  const std::string error =
      error_of([&] { DiskStore store(DiskStoreOptions(dir).free_bytes_limit(4 << 20), {3 << 20, 3 << 20}); });
  EXPECT_NE(error.find("the folder '" + dir + "' has 4194304 bytes free"), std::string::npos) << error;
  EXPECT_NE(error.find("needs 6291456 bytes"), std::string::npos) << error;
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "nothing is created";
  std::filesystem::remove_all(dir);
}

TEST(DiskStore, BadRequestsAndOptionsAreRefused) {
  const std::string dir = scratch_dir("bad");
  EXPECT_NE(error_of([&] { DiskStore(DiskStoreOptions(dir).block_bytes(1000), {10}); })
                .find("block_bytes must be a positive multiple of 4096, got 1000"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DiskStore(DiskStoreOptions(dir).queue_depth(0), {10}); }).find("queue_depth"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DiskStore(DiskStoreOptions(dir + "/missing"), {10}); }).find(dir + "/missing"),
            std::string::npos);
  EXPECT_NE(error_of([] { fsdp::parse_enum<fsdp::offload::IoEngine>("spdk"); })
                .find("unknown offload I/O engine 'spdk': expected one of auto, libaio, threads"),
            std::string::npos);
  DiskStore store(DiskStoreOptions(dir), {4096, 8192});
  std::vector<char> buffer(8192);
  EXPECT_NE(error_of([&] { store.read(1, buffer.data()).get(); }).find("slot 1 of " + store.path() + " has no complete write"),
            std::string::npos);
  EXPECT_NE(error_of([&] { store.write(2, buffer.data()); }).find("slot 2 of " + store.path() + ", which has 2"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}
