#pragma once
// What every backend's all_to_all refuses before any communication, with
// the same words on each (MPI, NCCL, the group of one). Not installed.

#include <c10/util/Exception.h>
#include <torch/types.h>

namespace fsdp {

// Equal blocks, one per rank: both buffers of one dtype and size, a
// multiple of the group size, contiguous, and apart (each rank's block of
// the output is written while the input's blocks are still being sent).
inline void check_all_to_all(const torch::Tensor& output, const torch::Tensor& input, int group_size) {
  TORCH_CHECK(output.defined() && input.defined(), "all_to_all: a tensor is undefined");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "all_to_all: output dtype ", output.scalar_type(),
              " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(output.numel() == input.numel(), "all_to_all: output must hold as many elements as input (",
              input.numel(), "), found ", output.numel());
  TORCH_CHECK(input.numel() % group_size == 0, "all_to_all: input must be group size (", group_size,
              ") equal blocks, so its elements a multiple of ", group_size, "; found ", input.numel());
  TORCH_CHECK(output.is_contiguous() && input.is_contiguous(),
              "all_to_all: output and input must be contiguous; found output ",
              output.is_contiguous() ? "contiguous" : "strided", ", input ",
              input.is_contiguous() ? "contiguous" : "strided");
  const auto* out_begin = static_cast<const char*>(output.data_ptr());
  const auto* in_begin = static_cast<const char*>(input.data_ptr());
  const bool overlap =
      input.numel() > 0 && out_begin < in_begin + input.nbytes() && in_begin < out_begin + output.nbytes();
  TORCH_CHECK(!overlap, "all_to_all: output and input must not overlap (found them sharing memory); "
                        "a rank's received blocks would overwrite blocks it has yet to send");
}

}  // namespace fsdp
