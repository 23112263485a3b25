// Flattening, sharding, gathering and reducing one unit's parameters.

#include "fsdp/flat_param.h"

#include <ATen/native/Resize.h>

#include "fsdp/compat.h"
#include "fsdp/memory.h"

namespace fsdp {

using memory::Category;
using memory::MemoryCategoryScope;

namespace compat {

void free_storage(const torch::Tensor& tensor) {
  at::native::resize_bytes_cpu(tensor.storage().unsafeGetStorageImpl(), 0);
}

void allocate_storage(const torch::Tensor& tensor, size_t nbytes) {
  at::native::resize_bytes_cpu(tensor.storage().unsafeGetStorageImpl(), nbytes);
}

}  // namespace compat

FlatParam::FlatParam(std::vector<std::pair<std::string, torch::Tensor>> params, ProcessGroupPtr group)
    : group_(std::move(group)) {
  torch::NoGradGuard no_grad;
  for (auto& [name, param] : params) {
    entries_.push_back(FlatParamEntry{name, param, param.sizes().vec(), numel_, param.numel()});
    numel_ += param.numel();
  }
  const int world = group_->size();
  shard_numel_ = (numel_ + world - 1) / world;

  // Every rank holds the same full values here; each keeps only its slice.
  torch::Tensor flat = torch::zeros({padded_numel()}, torch::kFloat);
  for (const auto& e : entries_) flat.narrow(0, e.offset, e.numel).copy_(e.param.reshape({-1}));
  {
    MemoryCategoryScope scope(Category::kParameterShard);
    shard_ = flat.narrow(0, group_->rank() * shard_numel_, shard_numel_).clone();
  }
  shard_.requires_grad_(true);
  unsharded_ = torch::empty({padded_numel()}, torch::kFloat);
  compat::free_storage(unsharded_);
  reshard();
}

size_t FlatParam::unsharded_storage_bytes() const { return unsharded_.storage().nbytes(); }

void FlatParam::unshard() {
  TORCH_CHECK(!is_unsharded(), "FlatParam::unshard: already unsharded");
  {
    MemoryCategoryScope scope(Category::kUnshardedBuffer);
    compat::allocate_storage(unsharded_, padded_numel() * unsharded_.element_size());
  }
  group_->all_gather(unsharded_, shard_.detach())->wait();
  for (auto& e : entries_) e.param.set_data(unsharded_.narrow(0, e.offset, e.numel).view(e.shape));
}

void FlatParam::reshard() {
  torch::Tensor empty = torch::empty({0}, unsharded_.options());
  for (auto& e : entries_) e.param.set_data(empty);
  compat::free_storage(unsharded_);
}

void FlatParam::start_reduce_gradients() {
  TORCH_CHECK(!pending_reduce_, "FlatParam: a gradient reduction is already in flight");
  torch::NoGradGuard no_grad;
  torch::Tensor flat_grad;
  {
    MemoryCategoryScope scope(Category::kUnshardedBuffer);
    flat_grad = torch::zeros({padded_numel()}, torch::kFloat);
  }
  for (auto& e : entries_) {
    torch::Tensor& grad = e.param.mutable_grad();
    if (!grad.defined()) continue;
    flat_grad.narrow(0, e.offset, e.numel).copy_(grad.reshape({-1}));
    grad.reset();  // the full-size gradient is not kept: that is the point of sharding it
  }
  // The first reduction of a run becomes the shard's gradient; later ones are
  // temporaries added into it.
  bool becomes_grad = !shard_.grad().defined();
  {
    MemoryCategoryScope scope(becomes_grad ? Category::kGradientShard : Category::kOther);
    pending_grad_shard_ = torch::empty({shard_numel_}, torch::kFloat);
  }
  pending_reduce_ = group_->reduce_scatter(pending_grad_shard_, flat_grad, ReduceOp::kAvg);
}

void FlatParam::finish_reduce_gradients() {
  TORCH_CHECK(pending_reduce_, "FlatParam: no gradient reduction in flight");
  WorkHandle work = std::move(pending_reduce_);
  torch::Tensor reduced = std::move(pending_grad_shard_);
  work->wait();
  torch::NoGradGuard no_grad;
  torch::Tensor& grad = shard_.mutable_grad();
  if (grad.defined()) {
    grad.add_(reduced);
  } else {
    grad = reduced;
  }
}

}  // namespace fsdp
