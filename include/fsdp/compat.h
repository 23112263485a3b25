#pragma once
// The one place where LibTorch version differences live. The code builds
// against Debian's LibTorch 1.13 and against LibTorch 2.x on GPU machines.

#include <torch/torch.h>
#include <torch/version.h>

#include <string>
#include <type_traits>

#define FSDP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator::allocate lost its const, and copy_data became pure
// virtual, in LibTorch 2.3.
#if FSDP_TORCH_AT_LEAST(2, 3)
#define FSDP_ALLOCATE_CONST
#define FSDP_ALLOCATOR_NEEDS_COPY_DATA 1
#else
#define FSDP_ALLOCATE_CONST const
#define FSDP_ALLOCATOR_NEEDS_COPY_DATA 0
#endif

namespace fsdp::compat {

// Frees a tensor's memory while keeping its storage object, so that every
// view of it (including the ones autograd saved during forward) sees the
// memory again once allocate_storage refills it. This is how unsharded
// buffers are freed without breaking saved tensors.
void free_storage(const torch::Tensor& tensor);
void allocate_storage(const torch::Tensor& tensor, size_t nbytes);

// The key of a parameter in an optimizer's state map: a string of the
// TensorImpl address in LibTorch 1.x, the address itself in later versions.
template <class Optimizer>
auto optimizer_state_key(const Optimizer& optimizer, const torch::Tensor& param) {
  using Key = typename std::decay_t<decltype(optimizer.state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    return c10::guts::to_string(param.unsafeGetTensorImpl());
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

}  // namespace fsdp::compat
