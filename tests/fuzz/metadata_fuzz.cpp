// libFuzzer target: the input is a checkpoint's metadata.json, placed next
// to the data files of a real checkpoint (tests/fuzz/checkpoint/: the shard
// files and the full files of one small model, saved by fsdp-train). It is
// opened as a resume and fsdp-ckpt open one: list_checkpoints and
// SavedCheckpoint, every unit's state read with read_range, and
// convert_to_full. First as given (the JSON parser and the metadata's own
// checksum), then, when it is a JSON object, rewritten with a correct
// checksum, so that mutations reach the layout checks behind it.
// Each input must either be refused with a c10::Error or read; never crash,
// hang, throw anything else or read outside a file.

#include <c10/util/Exception.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "fsdp/checkpoint.h"
#include "state_dict/checkpoint_json.h"
#include "state_dict/checkpoint_schema.h"

#ifndef FSDP_FUZZ_CHECKPOINT_FILES
#error "compile with -DFSDP_FUZZ_CHECKPOINT_FILES=\"<tests/fuzz/checkpoint>\""
#endif

namespace {
namespace fs = std::filesystem;

// This process's own checkpoint folder (several fuzzers may run at once):
// ROOT/step-1 holding copies of the data files; removed at exit.
struct Folder {
  fs::path root, step;
  Folder() {
    const char* tmp = std::getenv("TMPDIR");
    root = fs::path(tmp && *tmp ? tmp : "/tmp") / ("fsdp_metadata_fuzz_" + std::to_string(::getpid()));
    step = root / "step-1";
    fs::remove_all(root);
    fs::create_directories(step);
    for (const auto& file : fs::directory_iterator(FSDP_FUZZ_CHECKPOINT_FILES)) {
      if (file.path().extension() == ".safetensors") fs::copy_file(file.path(), step / file.path().filename());
    }
  }
  ~Folder() { fs::remove_all(root); }
};

const Folder& folder() {
  static const Folder f;
  return f;
}

void write_file(const fs::path& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out.good()) {
    std::fprintf(stderr, "metadata_fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// What a checkpoint's readers do with it, each step refused on its own.
void open_and_read() {
  // Never throws: a checkpoint it cannot read is listed as incomplete.
  fsdp::list_checkpoints(folder().root.string());
  fsdp::latest_checkpoint(folder().root.string());
  std::unique_ptr<fsdp::SavedCheckpoint> saved;
  try {
    saved = std::make_unique<fsdp::SavedCheckpoint>(folder().step.string());
  } catch (const c10::Error&) {
    return;  // refused: the expected outcome for most inputs
  }
  // SavedCheckpoint accepted it: what the layout says can be read, every
  // element of it (the data files hold no NaN: one left over was never read).
  const nlohmann::json& units = saved->metadata().json.at("units");
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t numel = units[u].at("numel").get<int64_t>();
    for (const char* what : {"param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "other"}) {
      torch::Tensor out = torch::full({numel}, std::numeric_limits<float>::quiet_NaN());
      try {
        saved->read_range(u, what, 0, numel, out);
      } catch (const c10::Error&) {
        continue;  // a state this checkpoint does not hold
      }
      if (torch::isnan(out).any().item<bool>()) {
        std::fprintf(stderr, "metadata_fuzz: read_range left elements of unit %zu's %s unread\n", u, what);
        std::abort();
      }
      if (numel > 2) saved->read_range(u, what, 1, numel - 1, out.narrow(0, 0, numel - 2));
    }
  }
  try {
    fsdp::convert_to_full(folder().step.string(), (folder().root / "converted.safetensors").string());
  } catch (const c10::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path meta = folder().step / "metadata.json";
  write_file(meta, data, size);
  open_and_read();
  // The same layout with its checksum put right.
  nlohmann::json json = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (json.is_object()) {
    fsdp::write_checkpoint_metadata(folder().step.string(), json);
    open_and_read();
  }
  return 0;
}
