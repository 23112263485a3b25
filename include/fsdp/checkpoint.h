#pragma once
/// \file
/// Training checkpoints: save, load, find the latest, convert.
///
/// Training checkpoints: the model's fp32 masters and the optimizer's state
/// (Adam, AdamW or SGD, the step count included: docs/checkpoints.md), in
/// one of two formats, plus metadata.json (layout, the optimizer's type and
/// state names, every file's checksum, training position, its own checksum
/// and the checksum's algorithm: see checksum.h; checkpoints from before
/// XXH3 name none and stay loadable).
///  - sharded: every shard in its own safetensors file, written by its rank
///    at once; the fast path for large models.
///  - full: the full state dict, gathered unit by unit and written by rank 0:
///    model.safetensors (standard names, loadable by any safetensors reader)
///    and optimizer.safetensors (each state under "<parameter>.<state name>").
/// Either reloads on another world size and strategy: each rank reads only
/// the flat ranges its new shards cover.
///
/// A checkpoint appears only complete: it is written into DIR/step-N.tmp,
/// every file flushed, and renamed to DIR/step-N by rank 0 once all are
/// whole. A crash mid-save leaves the previous checkpoint untouched.

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/fully_shard.h"
#include "fsdp/safetensors.h"
#include "fsdp/enum_names.h"

namespace fsdp {

/// The two layouts of a checkpoint's tensors (see fsdp/checkpoint.h).
/// Named by enum_name, parsed by parse_enum: "sharded", "full".
enum class CheckpointFormat {
  kSharded,  ///< every shard in its own file, written by its rank
  kFull,     ///< model.safetensors and optimizer.safetensors, written by rank 0
};
namespace detail {
const EnumNames& enum_names(EnumTag<CheckpointFormat>);  ///< "sharded", "full"
}  // namespace detail

/// What metadata.json's "extra" holds beside the tensors: by key, each value
/// as JSON text (for example `{"loss_scale": "65536.0", "data": "{\"seed\":0}"}`).
/// The checkpoint manager (checkpoint_manager.h) fills it from objects that
/// save their own state.
using CheckpointExtra = std::map<std::string, std::string>;

/// What a checkpoint records besides its tensors.
struct CheckpointInfo {
  std::string path;                                     ///< the checkpoint's directory
  CheckpointFormat format = CheckpointFormat::kSharded;  ///< its layout
  int64_t step = 0;                                     ///< the training step it was saved after
  int64_t world_size = 0;                               ///< the ranks that saved it
  std::string strategy;                                 ///< their sharding strategy's name
  std::string optimizer_type;                           ///< the saved optimizer's type, as metadata.json records it
  CheckpointExtra extra;                                ///< metadata.json's "extra", key by key
};

/// Collective. Writes `DIR/step-<step>` and returns its path. `extra` is kept
/// in the metadata (each value must be valid JSON text; e.g. the trainer's
/// configuration and loss scale). The optimizer must be one whose state can be
/// sharded (Adam, AdamW, SGD: docs/checkpoints.md), over state.parameters().
std::string save_checkpoint(FsdpState& state, torch::optim::Optimizer& optimizer, const std::string& dir, int64_t step,
                            const CheckpointExtra& extra = {}, CheckpointFormat format = CheckpointFormat::kSharded);

/// Collective. Loads a checkpoint of either format, on any world size and
/// strategy, after verifying every file's checksum and contents, that the
/// model's units and parameters match, and that the optimizer keeps the state
/// that was saved. Returns its metadata. Each data file's bytes are verified
/// by one rank (the ranks in parallel); a corrupt file stops every rank with
/// the same message, before any state is changed.
CheckpointInfo load_checkpoint(FsdpState& state, torch::optim::Optimizer& optimizer, const std::string& path);

struct CheckpointMetadata;  // metadata.json parsed: the library's own, not installed
/// A saved checkpoint, opened without any process group: its metadata, every
/// file checked on opening (present, listed with its checksum, exactly the
/// tensors the layout describes, and its bytes matching its checksum), and
/// any range of a unit's saved flat state ("param", or one of the optimizer's
/// state tensors, such as "exp_avg").
class SavedCheckpoint {
 public:
  /// How much opening a checkpoint reads.
  enum class Verify {
    kEveryFile,   ///< reads every data file in full to verify its checksum (the
                  ///< files in parallel, one thread each, up to the machine's cores)
    kHeadersOnly  ///< leaves that to verify_file(), for callers that share the
                  ///< reading out (load_checkpoint: one rank per file)
  };
  /// Opens the checkpoint in `path`, verifying as `verify` says. Throws naming
  /// the problem file and tensor.
  explicit SavedCheckpoint(const std::string& path, Verify verify = Verify::kEveryFile);
  ~SavedCheckpoint();
  /// The step, world size, strategy, optimizer and extra it records.
  const CheckpointInfo& info() const { return info_; }
  /// metadata.json in full, parsed (its fields: docs/checkpoints.md).
  const CheckpointMetadata& metadata() const { return *metadata_; }
  /// The checkpoint's layout.
  CheckpointFormat format() const { return format_; }
  /// The data files, in the layout's order (shard-0, shard-1, ...; or model, optimizer).
  const std::vector<std::string>& file_names() const { return file_names_; }
  /// Reads a data file in full; throws "'file' is corrupt: ..." unless its
  /// bytes match its checksum.
  void verify_file(const std::string& name) const;
  /// Copies elements [from, to) of unit `unit`'s flat `what` into `out`. A
  /// unit of NF4 weights (MixedPrecision::frozen_nf4) is read in whole
  /// blocks of 64 elements into `out` as 36-byte records (uint8): saved
  /// sharded, as its bytes; saved in full (dequantized), quantized again,
  /// which gives the same bytes.
  void read_range(size_t unit, const std::string& what, int64_t from, int64_t to, const torch::Tensor& out) const;
  /// The model's parameters as a full weights file holds them (the model's
  /// names, fp32, whole shapes), in the order stream_weights() gives them.
  std::vector<safetensors::TensorSpec> weight_specs() const;
  /// Hands each parameter of weight_specs() to `take` in turn, whole, with
  /// one unit's flat parameters in memory at a time (what converters stream).
  void stream_weights(const std::function<void(const torch::Tensor&)>& take) const;

 private:
  void read_nf4_range(size_t unit, int64_t from, int64_t to, const torch::Tensor& out) const;
  std::string path_;
  std::shared_ptr<const CheckpointMetadata> metadata_;
  CheckpointInfo info_;
  CheckpointFormat format_ = CheckpointFormat::kSharded;
  std::vector<std::string> file_names_;
  std::map<std::string, std::unique_ptr<safetensors::Reader>> readers_;  // by file name
  void verify_files_in_parallel() const;
};

/// Offline: the fp32 weights of a checkpoint (either format) as one
/// safetensors file under the model's parameter names, one unit in memory at a time.
void convert_to_full(const std::string& checkpoint, const std::string& output);

/// The newest complete checkpoint under dir ("" if there is none).
std::string latest_checkpoint(const std::string& dir);

}  // namespace fsdp
