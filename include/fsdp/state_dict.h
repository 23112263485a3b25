#pragma once
/// \file
/// State dicts under the model's own parameter names (tied parameters once,
/// under their first name): in memory, full or sharded, and as safetensors
/// files.
///
/// \code{.cpp}
/// auto full = fsdp::full_state_dict(model.state());          // every rank: name -> fp32 tensor
/// fsdp::load_full_state_dict(model.state(), full);            // into the sharded model
/// auto mine = fsdp::sharded_state_dict(model.state());       // this rank's pieces only
/// fsdp::load_sharded_state_dict(model.state(), mine);
/// \endcode

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/fully_shard.h"
#include "fsdp/safetensors.h"

namespace fsdp {

/// name -> tensor, in the model's named_parameters() order (LibTorch's own
/// type for named parameters).
using StateDict = torch::OrderedDict<std::string, torch::Tensor>;

/// How full_state_dict() delivers the tensors.
struct FullStateDictOptions {
  FullStateDictOptions() = default;
  /// Only rank 0 receives the tensors; the others get an empty dict (and
  /// hold at most one unit gathered while it is made). PyTorch's
  /// FullStateDictConfig(rank0_only=True).
  TORCH_ARG(bool, rank0_only) = false;
};

/// Collective over the model's group: every parameter's fp32 master, whole,
/// on the CPU, gathered one unit at a time.
StateDict full_state_dict(FsdpState& state, FullStateDictOptions options = FullStateDictOptions());

/// Collective. Every rank passes the same full state dict (every parameter
/// under its name, exact shape, float; nothing else) and keeps its own shard
/// of it. Checked on every rank before anything is changed.
void load_full_state_dict(FsdpState& state, const StateDict& dict);

/// One parameter's piece on this rank: elements [offset, offset + local.numel())
/// of the parameter flattened (row-major), which has shape `shape`. A rank
/// may hold no piece of a parameter (local is then empty).
struct ShardedTensor {
  std::vector<int64_t> shape;  ///< the whole parameter's shape
  int64_t offset = 0;          ///< where the piece starts in the flattened parameter
  torch::Tensor local;  ///< 1-D, fp32, a copy
};
/// name -> this rank's piece, in the model's named_parameters() order.
using ShardedStateDict = torch::OrderedDict<std::string, ShardedTensor>;

/// This rank's pieces of every parameter (no communication).
ShardedStateDict sharded_state_dict(const FsdpState& state);
/// Loads pieces taken from a model sharded the same way (same units, world
/// size and strategy); throws, naming the parameter, if a piece does not
/// match what this rank holds. No communication.
void load_sharded_state_dict(FsdpState& state, const ShardedStateDict& dict);

/// Loads a file into an unsharded module (call before fully_shard). Every
/// parameter must be in the file with its exact shape, and the file may hold
/// nothing else; float files of another precision are converted. Throws
/// naming the file and the tensor; the module is changed only if all is well.
void load_full_weights(torch::nn::Module& module, const std::string& path);

/// Collective over the model's group: the full state dict, gathered one unit
/// (and one kind of state) at a time and streamed by rank 0, so no rank ever
/// holds more than one unit unsharded.
///  - `model_path`: every parameter's fp32 master under the model's names;
///  - `optimizer_path`, when `optimizer` is given: its state tensors under
///    "<parameter>.<state name>", its type and step count in the metadata
///    ("optimizer", "optimizer_step").
/// Each file is written under a temporary name, flushed and renamed when
/// complete, and carries its checksum; on any failure nothing is left.
void save_full_state_dict(FsdpState& state, const std::string& model_path,
                          const std::map<std::string, std::string>& metadata = {},
                          torch::optim::Optimizer* optimizer = nullptr, const std::string& optimizer_path = "");

/// What save_full_weights() streams the weights into, on rank 0: a file
/// format's writer (hugging_face::FolderWriter). Destroyed before commit(),
/// it leaves nothing behind.
class WeightWriter {
 public:
  virtual ~WeightWriter() = default;
  /// The next parameter, whole (fp32, the model's layout), in the order of
  /// the specs it was opened with.
  virtual void write(const torch::Tensor& tensor) = 0;
  /// After the last parameter: makes the output complete and visible.
  virtual void commit() = 0;
};
/// Opens a WeightWriter for parameters of these names, shapes and dtypes,
/// in this order (unit by unit).
using OpenWeightWriter = std::function<std::unique_ptr<WeightWriter>(std::vector<safetensors::TensorSpec>)>;

/// Collective over the model's group: every parameter's fp32 master, whole,
/// streamed into the writer that rank 0 opens, one unit gathered at a time
/// (the other ranks join the gathers). save_full_state_dict()'s model file,
/// for any writer. Throws on every rank if rank 0's writer fails.
void save_full_weights(FsdpState& state, const OpenWeightWriter& open);

}  // namespace fsdp
