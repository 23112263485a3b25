#pragma once
// The one place where LibTorch version differences live. The code builds
// and is tested against Debian's LibTorch 1.13 and the PyPI wheel's 2.x.

#include <torch/torch.h>
#include <torch/version.h>

#include <c10/core/Event.h>

#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

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

// What autograd hands out for a gradient accumulator: std::shared_ptr<Node>
// up to LibTorch 2.0, c10::intrusive_ptr<Node> after. Either way autograd
// itself keeps only a weak reference, so whoever needs the node (and the
// hooks on it) to live must hold one of these.
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()));

// Frees a tensor's memory while keeping its storage object, so that every
// view of it (including the ones autograd saved during forward) sees the
// memory again once allocate_storage refills it. This is how unsharded
// buffers are freed without breaking saved tensors.
void free_storage(const torch::Tensor& tensor);
// free_storage's, handing the block to the caller (the gather order holds
// it until its users have run); the bytes stay in gathered_usage() until
// the caller counts them out.
c10::DataPtr take_storage(const torch::Tensor& tensor);
void allocate_storage(const torch::Tensor& tensor, size_t nbytes);

// The key of a parameter in an optimizer's state map: a string of the
// TensorImpl address in LibTorch 1.x, the address itself in later versions.
template <class Optimizer>
auto optimizer_state_key(const Optimizer& optimizer, const torch::Tensor& param) {
  using Key = typename std::decay_t<decltype(optimizer.state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    // LibTorch 1.x keys by the address printed as text (what its own
    // c10::guts::to_string did; that helper is gone in 2.x).
    std::ostringstream key;
    key << param.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// Zeroes the gradients and keeps their memory (LibTorch 1.x's zero_grad();
// 2.x's sets them to none by default, which frees the gradient shards
// between steps and so changes what model state measures).
template <class Optimizer, class = void>
struct has_set_to_none : std::false_type {};
template <class Optimizer>
struct has_set_to_none<Optimizer, std::void_t<decltype(std::declval<Optimizer&>().zero_grad(false))>> : std::true_type {};

template <class Optimizer>
void zero_grad_keeping_memory(Optimizer& optimizer) {
  if constexpr (has_set_to_none<Optimizer>::value) {
    optimizer.zero_grad(/*set_to_none=*/false);
  } else {
    optimizer.zero_grad();
  }
}

// Blocks the host until a device event has happened: c10::Event::synchronize
// where the LibTorch has it (2.x), else by polling (1.13 has only query()).
template <class Event, class = void>
struct has_synchronize : std::false_type {};
template <class Event>
struct has_synchronize<Event, std::void_t<decltype(std::declval<const Event&>().synchronize())>> : std::true_type {};

template <class Event = c10::Event>
void synchronize_event(const Event& event) {
  if constexpr (has_synchronize<Event>::value) {
    event.synchronize();
  } else {
    while (!event.query()) std::this_thread::yield();
  }
}

}  // namespace fsdp::compat
