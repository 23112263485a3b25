#pragma once
// What the exports (Hugging Face folders, PEFT adapters) check of every
// tensor they write: a value that is not finite, or that the saved dtype's
// range turns into inf, is refused naming the tensor. A model with them
// computes NaN wherever it is loaded, and an export is often the last step
// of a run, read by another program that would not say why.

#include <torch/torch.h>

#include <string>

namespace fsdp::hugging_face::detail {

// `tensor` converted to `dtype`; throws naming `name` (and `where`, the file
// or folder) where `tensor` holds NaN or inf, or the conversion overflows.
torch::Tensor finite_in_dtype(const torch::Tensor& tensor, torch::ScalarType dtype, const std::string& name,
                              const std::string& where);

}  // namespace fsdp::hugging_face::detail
