// Flattening, sharding, gathering and reducing one unit's parameters.

#include "core/flat_param.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>

#include <optional>

#include "comm/quantize.h"
#include "core/nf4.h"
#include "base/compat.h"
#include "core/gather_order.h"
#include "fsdp/memory.h"
#include "core/shard_offload.h"
#include "base/memory_counters.h"

namespace fsdp {

using memory::Category;
using memory::MemoryCategoryScope;

namespace compat {

// Device-generic (the CPU's resize_bytes_cpu would also copy the old bytes):
// the storage takes a fresh block from the allocator it was made with, on
// its device; the caching allocator of a GPU hands it out in the current
// stream's order.
void allocate_storage(const torch::Tensor& tensor, size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  c10::DeviceGuard guard(storage->device());
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
  memory::count_gathered_bytes(static_cast<int64_t>(nbytes));
}

void free_storage(const torch::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  memory::count_gathered_bytes(-static_cast<int64_t>(storage->nbytes()));
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
}

// As free_storage, but the block is handed to the caller, still counted as
// gathered until the caller lets it go.
c10::DataPtr take_storage(const torch::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  c10::DataPtr block = storage->set_data_ptr(c10::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
  return block;
}

}  // namespace compat

namespace {
// Persistent buffers are model state; transient ones are the working set.
Category buffer_category(const FlatParamConfig& config) {
  return config.persistent_params ? Category::kParameterShard : Category::kUnshardedBuffer;
}

// numel elements of `tensor` from `offset`, sharing its memory but not an
// autograd view of it: optimizers detach_() gradients in zero_grad(), which
// LibTorch refuses for views.
torch::Tensor alias(const torch::Tensor& tensor, int64_t offset, int64_t numel) {
  return torch::empty({0}, tensor.options()).set_(tensor.storage(), tensor.storage_offset() + offset, {numel}, {1});
}
}  // namespace

FlatParam::FlatParam(std::vector<std::pair<std::string, torch::Tensor>> params, FlatParamConfig config)
    : config_(std::move(config)) {
  torch::NoGradGuard no_grad;
  for (auto& [name, param] : params) {
    entries_.push_back(FlatParamEntry{name, param, param.sizes().vec(), numel_, param.numel()});
    // NF4: each weight's blocks are its own, as bitsandbytes quantizes it alone.
    numel_ += config_.nf4 ? nf4::blocks(param.numel()) * nf4::kBlock : param.numel();
  }
  TORCH_CHECK(config_.offload, "FlatParam: no offload given (FlatParamConfig::offload: where the shard lives)");
  const c10::Device device = config_.device;
  const auto on_device = torch::TensorOptions().device(device);
  const int K = shard_group_size(), r = shard_rank();
  shard_numel_ = config_.nf4 ? (numel_ / nf4::kBlock + K - 1) / K * nf4::kBlock  // whole blocks a rank
                             : (numel_ + K - 1) / K;
  const torch::ScalarType param_dtype = config_.mixed_precision.param_dtype();
  // With fp32 params, a persistent buffer is itself the master copy and the
  // shard is a view of it: no second copy of the parameters.
  const bool shard_is_view = config_.persistent_params && param_dtype == torch::kFloat && !config_.nf4;

  torch::Tensor flat;
  {
    MemoryCategoryScope scope(shard_is_view ? Category::kParameterShard : Category::kOther);
    flat = torch::zeros({padded_numel()}, on_device.dtype(config_.shard_dtype));
  }
  for (const auto& e : entries_) flat.narrow(0, e.offset, e.numel).copy_(e.param.reshape({-1}));
  if (shard_is_view) {
    unsharded_ = flat;
    shard_ = flat.narrow(0, r * shard_numel_, shard_numel_).detach();
  } else {
    {
      MemoryCategoryScope scope(Category::kParameterShard);
      if (config_.nf4) {
        quantize_shard(flat);
      } else {
        shard_ = config_.offload->make_shard(flat.narrow(0, r * shard_numel_, shard_numel_));
      }
    }
    flat.reset();
    MemoryCategoryScope scope(buffer_category(config_));
    unsharded_ = torch::empty({padded_numel()}, on_device.dtype(param_dtype));
    // A transient buffer from here on: counted as gathered until
    // initialize_views() frees it.
    if (!config_.persistent_params) memory::count_gathered_bytes(static_cast<int64_t>(unsharded_.nbytes()));
  }
  shard_.requires_grad_(!config_.frozen);
  gathered_version_ = shard_._version();
  stale_ = !shard_is_view;
  if (config_.full_gradients && !config_.frozen) {
    MemoryCategoryScope scope(Category::kGradientShard);
    full_grad_ = torch::zeros({padded_numel()}, on_device.dtype(torch::kFloat));
    shard_.mutable_grad() = alias(full_grad_, r * shard_numel_, shard_numel_);
  }
  // Full shape and compute dtype, so that gradient accumulators made now fix
  // the right metadata; the values come with initialize_views().
  for (auto& e : entries_) e.param.set_data(unsharded_.narrow(0, e.offset, e.numel).view(e.shape));
}

void FlatParam::quantize_shard(const torch::Tensor& flat) {
  // This rank's records only: blocks are independent, and a shard begins
  // on a block boundary, as every weight does.
  const int64_t begin = shard_rank() * shard_numel_, end = begin + shard_numel_;
  torch::Tensor records = torch::empty({shard_numel_ / nf4::kBlock * nf4::kRecordBytes}, torch::kByte);
  nf4::clear_records(records);
  const torch::Tensor host = flat.to(torch::kCPU);
  for (const auto& e : entries_) {
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
    if (lo >= hi) continue;
    nf4::quantize_into_records(host.narrow(0, lo, hi - lo),
                               records.narrow(0, (lo - begin) / nf4::kBlock * nf4::kRecordBytes,
                                              nf4::blocks(hi - lo) * nf4::kRecordBytes));
  }
  shard_ = records.to(config_.device);
}

int64_t FlatParam::nf4_bytes() const { return config_.nf4 ? numel_ / nf4::kBlock * nf4::kRecordBytes : 0; }

FlatParam::~FlatParam() {
  if (!config_.persistent_params && unsharded_.defined()) {
    memory::count_gathered_bytes(-static_cast<int64_t>(unsharded_.storage().nbytes()));
  }
}

void FlatParam::initialize_views() {
  if (config_.persistent_params) {
    unshard();
  } else {
    reshard();
  }
}

bool FlatParam::shard_aliases_buffer() const {
  return shard_.storage().unsafeGetStorageImpl() == unsharded_.storage().unsafeGetStorageImpl();
}

bool FlatParam::quantizes_gathers() const {
  return config_.zero_plus_plus.gather_quantization() != Quantization::kNone;
}

void FlatParam::start_unshard(bool exact) {
  if (pending_unshard_) return;
  int64_t version = shard_._version();
  if (is_unsharded_ && !stale_ && gathered_version_ == version) return;
  // In a device pass the buffer is made, the shard cast and the gather
  // issued on the gather stream, which then need not wait for the compute
  // queued since the pass began (gather_order.h says why that is safe).
  std::optional<c10::StreamGuard> on_gather_stream;
  if (config_.gather_order && config_.gather_order->in_pass()) {
    on_gather_stream.emplace(config_.gather_order->enter(index()));
  }
  if (unsharded_.storage().nbytes() == 0) {
    MemoryCategoryScope scope(buffer_category(config_));
    compat::allocate_storage(unsharded_, padded_numel() * unsharded_.element_size());
  }
  if (config_.nf4) {
    // The records cross as bytes (a quarter of bf16's traffic, and nothing
    // reads them as floats on the way) and are dequantized once all are in.
    if (config_.shard_group) {
      {
        MemoryCategoryScope scope(Category::kUnshardedBuffer);
        pending_packed_gather_ = torch::empty({shard_.numel() * shard_group_size()}, shard_.options());
      }
      pending_unshard_ = config_.shard_group->all_gather(pending_packed_gather_, shard_);
      pending_unshard_input_ = shard_;
    } else {
      nf4::dequantize_records_into(shard_, unsharded_);
    }
    gathered_version_ = version;
    stale_ = false;
    return;
  }
  if (secondary_.defined()) {
    // The host's slices of what forward gathered make the whole buffer
    // without crossing hosts, while the shard is what it was then.
    if (secondary_version_ == version && !exact) {
      pending_unshard_ = config_.host_group->all_gather(unsharded_, secondary_);
      pending_unshard_input_ = std::move(secondary_);
      secondary_ = torch::Tensor();
      gathered_version_ = version;
      stale_ = false;
      return;
    }
    drop_secondary();
  }
  // The offload fetches the shard; CPU offload on a GPU hands it over on
  // the copy stream, current until the gather is issued (the gather waits
  // for the copy, the compute stream does not: it waits in unshard()).
  offload::GatherInput input;
  if (shard_aliases_buffer()) {
    input.values = unsharded_.narrow(0, shard_rank() * shard_numel_, shard_numel_);  // gathered in place
  } else {
    MemoryCategoryScope scope(Category::kUnshardedBuffer);
    input = config_.offload->fetch(*this);
    // The fetch may step the shard first (disk offload's pending update):
    // what is gathered is the shard after it.
    version = shard_._version();
  }
  if (config_.shard_group) {
    if (quantizes_gathers() && !exact) {
      start_quantized_gather(input.values);
    } else {
      pending_unshard_ = config_.shard_group->all_gather(unsharded_, input.values);
      pending_unshard_input_ = input.values;
    }
    pending_unshard_staging_ = input.staging;
  } else if (!shard_aliases_buffer()) {
    unsharded_.copy_(input.values);
    if (input.finish_local) input.finish_local(input);
  }
  gathered_version_ = version;
  stale_ = false;
}

void FlatParam::start_quantized_gather(const torch::Tensor& input) {
  const int64_t block = config_.zero_plus_plus.quantization_block();
  const int64_t row = quantize::packed_bytes(shard_numel_, block);
  torch::Tensor packed;
  {
    MemoryCategoryScope scope(Category::kUnshardedBuffer);
    packed = torch::empty({row}, unsharded_.options().dtype(torch::kByte));
    pending_packed_gather_ = torch::empty({row * shard_group_size()}, packed.options());
  }
  quantize::pack(input, block, packed);
  pending_unshard_ = config_.shard_group->all_gather(pending_packed_gather_, packed);
  pending_unshard_input_ = packed;
}

void FlatParam::unshard(bool exact) {
  start_unshard(exact);
  if (pending_unshard_) {
    WorkHandle work = std::move(pending_unshard_);
    pending_unshard_ = nullptr;
    work->wait();
    pending_unshard_input_.reset();
    pending_unshard_staging_.reset();
    if (pending_packed_gather_.defined() && config_.nf4) {
      nf4::dequantize_records_into(pending_packed_gather_, unsharded_);
      pending_packed_gather_.reset();
    } else if (pending_packed_gather_.defined()) {
      quantize::unpack_into(pending_packed_gather_, shard_group_size(), shard_numel_,
                            config_.zero_plus_plus.quantization_block(), unsharded_);
      pending_packed_gather_.reset();
    }
  }
  for (auto& e : entries_) e.param.set_data(unsharded_.narrow(0, e.offset, e.numel).view(e.shape));
  is_unsharded_ = true;
}

torch::Tensor FlatParam::gather_full(const torch::Tensor& local) const {
  if (config_.nf4) {
    // The weights' values: every rank's records, dequantized to float32.
    TORCH_CHECK(local.scalar_type() == torch::kByte && local.numel() == shard_.numel(),
                "gather_full: expected the NF4 shard's ", shard_.numel(), " bytes, got ", local.numel(), " ",
                local.scalar_type());
    torch::Tensor records = local.detach().to(device()).contiguous();
    if (config_.shard_group) {
      torch::Tensor all = torch::empty({records.numel() * shard_group_size()}, records.options());
      config_.shard_group->all_gather(all, records)->wait();
      records = all;
    }
    torch::Tensor full = torch::empty({padded_numel()}, records.options().dtype(torch::kFloat));
    nf4::dequantize_records_into(records, full);
    return full;
  }
  TORCH_CHECK(local.numel() == shard_numel_, "gather_full: expected a tensor of the shard's ", shard_numel_,
              " elements, got ", local.numel());
  if (!config_.shard_group) return local.detach();
  // On the device the group moves (an offloaded shard is gathered there).
  const torch::Tensor input = local.detach().to(device()).contiguous();
  torch::Tensor full = torch::empty({padded_numel()}, input.options());
  config_.shard_group->all_gather(full, input)->wait();
  return full;
}

void FlatParam::reshard() {
  if (config_.persistent_params) return;
  TORCH_CHECK(!pending_unshard_, "FlatParam: resharding while a prefetched all-gather is in flight");
  torch::Tensor empty = torch::empty({0}, unsharded_.options());
  for (auto& e : entries_) e.param.set_data(empty);
  if (config_.gather_order && config_.gather_order->in_pass()) {
    // Its users are queued on the compute stream: held until a later
    // gather's stream has waited for them.
    const int64_t nbytes = static_cast<int64_t>(unsharded_.storage().nbytes());
    if (nbytes > 0) config_.gather_order->hold(compat::take_storage(unsharded_), nbytes, index());
  } else {
    compat::free_storage(unsharded_);
  }
  is_unsharded_ = false;
}

void FlatParam::keep_secondary() {
  // The host's K ranks keep 1/K of the buffer each, so that their gather
  // rebuilds it: padded_numel() = shard * world, and K divides the world.
  const int64_t chunk = padded_numel() / config_.host_group->size();
  MemoryCategoryScope scope(Category::kSecondaryPartition);
  secondary_ = unsharded_.narrow(0, config_.host_group->rank() * chunk, chunk).clone();
  secondary_version_ = shard_._version();
}

void FlatParam::drop_secondary() {
  secondary_ = torch::Tensor();
  secondary_version_ = -1;
}

void FlatParam::write_back_shard() {
  TORCH_CHECK(!config_.nf4, "FlatParam: unit '", name(), "' holds an NF4 base, which takes no written-back values");
  TORCH_CHECK(is_unsharded_ && unsharded_.scalar_type() == torch::kFloat,
              "FlatParam: write_back_shard needs the float32 parameters gathered");
  if (shard_aliases_buffer()) return;  // the shard is a slice of the buffer already
  torch::NoGradGuard no_grad;
  shard_.detach().copy_(unsharded_.narrow(0, shard_rank() * shard_numel_, shard_numel_));
}

void FlatParam::start_reduce_gradients() {
  TORCH_CHECK(!config_.frozen, "FlatParam: unit ", index(),
              " holds frozen parameters, which have no gradient to reduce");
  TORCH_CHECK(!pending_reduce_, "FlatParam: a gradient reduction is already in flight");
  torch::NoGradGuard no_grad;
  const torch::ScalarType reduce_dtype = config_.mixed_precision.effective_reduce_dtype();
  torch::Tensor flat_grad;
  if (gradient_buffer_.defined()) {
    flat_grad = std::move(gradient_buffer_);  // autograd accumulated into it
    gradient_buffer_ = torch::Tensor();
    for (auto& e : entries_) e.param.mutable_grad().reset();  // views of it
  } else {
    {
      MemoryCategoryScope scope(Category::kUnshardedBuffer);
      flat_grad = torch::zeros({padded_numel()}, unsharded_.options().dtype(reduce_dtype));
    }
    for (auto& e : entries_) {
      torch::Tensor& grad = e.param.mutable_grad();
      if (!grad.defined()) continue;
      flat_grad.narrow(0, e.offset, e.numel).copy_(grad.reshape({-1}));
      grad.reset();  // the full-size gradient is not kept: that is the point of sharding it
    }
  }
  if (config_.full_gradients) {
    const ProcessGroupPtr& group = config_.shard_group ? config_.shard_group : config_.replicate_group;
    pending_reduce_ = group->all_reduce(flat_grad, ReduceOp::kAvg);
    pending_result_ = flat_grad;
    return;
  }
  if (config_.zero_plus_plus.gradient_quantization() != Quantization::kNone) {
    start_quantized_reduce(flat_grad);
    return;
  }
  // The first reduction of a run becomes the shard's gradient; later ones are
  // temporaries added into it.
  const bool becomes_grad = !shard_.grad().defined() && reduce_dtype == torch::kFloat;
  {
    MemoryCategoryScope scope(becomes_grad ? Category::kGradientShard : Category::kOther);
    pending_result_ = torch::empty({shard_numel_}, unsharded_.options().dtype(reduce_dtype));
  }
  pending_reduce_ = config_.shard_group->reduce_scatter(pending_result_, flat_grad, ReduceOp::kAvg);
}

void FlatParam::start_quantized_reduce(const torch::Tensor& flat_grad) {
  // First step, inside the host: the gradient in host-major order (for each
  // place l in a host, the slices of the ranks at place l of every host),
  // so that the host group's reduce-scatter leaves place l the host's sums
  // of exactly the slices it exchanges across hosts next.
  const int hosts = config_.cross_host_group->size();
  torch::Tensor host_major;
  {
    MemoryCategoryScope scope(Category::kUnshardedBuffer);
    host_major = flat_grad.view({shard_group_size(), shard_numel_}).index_select(0, config_.host_major_ranks).view({-1});
    pending_result_ = torch::empty({hosts * shard_numel_}, flat_grad.options());
  }
  pending_reduce_ = config_.host_group->reduce_scatter(pending_result_, host_major, ReduceOp::kSum);
  quantized_reduce_stage_ = 1;
}

void FlatParam::advance_reduce() {
  if (!reduce_in_first_stage()) return;
  WorkHandle first = std::move(pending_reduce_);
  pending_reduce_ = nullptr;
  first->wait();
  // Second step, across hosts: the host's sum of each host's slice,
  // quantized, goes to that host's rank at this place.
  const torch::Tensor host_sums = std::move(pending_result_);
  const int hosts = config_.cross_host_group->size();
  const int64_t block = config_.zero_plus_plus.quantization_block();
  const int64_t row = quantize::packed_bytes(shard_numel_, block);
  torch::Tensor packed, received;
  {
    MemoryCategoryScope scope(Category::kOther);
    packed = torch::empty({hosts * row}, host_sums.options().dtype(torch::kByte));
    received = torch::empty_like(packed);
  }
  for (int j = 0; j < hosts; ++j) {
    torch::Tensor out = packed.narrow(0, j * row, row);
    quantize::pack(host_sums.narrow(0, j * shard_numel_, shard_numel_), block, out);
  }
  pending_reduce_ = config_.cross_host_group->all_to_all(received, packed);
  pending_result_ = received;
  quantized_reduce_stage_ = 2;
}

torch::Tensor FlatParam::finish_quantized_reduce() {
  advance_reduce();
  WorkHandle work = std::move(pending_reduce_);
  pending_reduce_ = nullptr;
  const torch::Tensor received = std::move(pending_result_);
  work->wait();
  quantized_reduce_stage_ = 0;
  // Every host's sum of this rank's slice, dequantized and added in fp32 in
  // host order (the same on every run), then averaged over the world.
  const bool becomes_grad = !shard_.grad().defined();
  MemoryCategoryScope scope(becomes_grad ? Category::kGradientShard : Category::kOther);
  torch::Tensor reduced = quantize::unpack_sum(received, config_.cross_host_group->size(), shard_numel_,
                                               config_.zero_plus_plus.quantization_block());
  return reduced.div_(shard_group_size());
}

void FlatParam::prepare_gradient_buffer() {
  if (config_.frozen || config_.full_gradients || !config_.shard_group || gradient_buffer_.defined() ||
      config_.mixed_precision.effective_reduce_dtype() != config_.mixed_precision.param_dtype()) {
    return;
  }
  for (const auto& e : entries_)
    if (e.param.grad().defined()) return;  // unreduced gradients of earlier micro-steps: the copying path adds them
  {
    MemoryCategoryScope scope(Category::kUnshardedBuffer);
    gradient_buffer_ = torch::zeros({padded_numel()}, unsharded_.options());
  }
  for (auto& e : entries_) {
    if (e.param.requires_grad()) e.param.mutable_grad() = gradient_buffer_.narrow(0, e.offset, e.numel).view(e.shape);
  }
}

void FlatParam::drop_gradient_buffer() {
  if (!gradient_buffer_.defined()) return;
  for (auto& e : entries_) e.param.mutable_grad().reset();
  gradient_buffer_ = torch::Tensor();
}

void FlatParam::finish_reduce_gradients() {
  TORCH_CHECK(pending_reduce_, "FlatParam: no gradient reduction in flight");
  if (quantized_reduce_stage_ > 0) {
    torch::Tensor reduced = finish_quantized_reduce();
    stale_ = true;  // an optimizer step comes next
    config_.offload->accept_gradient(*this, std::move(reduced));
    return;
  }
  WorkHandle work = std::move(pending_reduce_);
  torch::Tensor reduced = std::move(pending_result_);
  work->wait();
  stale_ = true;  // an optimizer step comes next
  torch::NoGradGuard no_grad;
  if (config_.full_gradients && shard_numel_ == 0) return;  // a unit without parameters
  if (config_.full_gradients) {
    // full_grad_ takes the reduced gradient; the owned slice is the shard's
    // .grad and accumulates (the optimizer's zero_grad clears it).
    const int64_t begin = shard_rank() * shard_numel_, end = begin + shard_numel_;
    if (!shard_.grad().defined() || shard_.grad().data_ptr() != full_grad_.narrow(0, begin, 1).data_ptr()) {
      torch::Tensor owned = alias(full_grad_, begin, shard_numel_);
      owned.zero_();  // zero_grad(set_to_none) dropped the link to the buffer
      shard_.mutable_grad() = owned;
    }
    torch::Tensor owned = shard_.grad();
    full_grad_.narrow(0, 0, begin).copy_(reduced.narrow(0, 0, begin));
    full_grad_.narrow(0, end, padded_numel() - end).copy_(reduced.narrow(0, end, padded_numel() - end));
    owned.add_(reduced.narrow(0, begin, shard_numel_));
    return;
  }
  if (config_.replicate_group && config_.replicate_group->size() > 1) {
    config_.replicate_group->all_reduce(reduced, ReduceOp::kAvg)->wait();
  }
  config_.offload->accept_gradient(*this, std::move(reduced));
}

bool FlatParam::host_gradient_pending() const { return config_.offload->gradient_pending(*this); }

void FlatParam::finish_host_gradient() {
  TORCH_CHECK(host_gradient_pending(), "FlatParam: no gradient copy to the host in flight");
  config_.offload->finish_gradient(*this);
}

void FlatParam::accumulate_into_gradient(torch::Tensor gradient) {
  torch::Tensor& grad = shard_.mutable_grad();
  if (grad.defined()) {
    grad.add_(gradient);
  } else {
    MemoryCategoryScope scope(Category::kGradientShard);
    grad = gradient.scalar_type() == torch::kFloat ? gradient : gradient.to(torch::kFloat);
  }
}

}  // namespace fsdp
