#include "plan/estimates.h"

#include "core/host_groups.h"
#include "base/strings.h"
#include "fsdp/language_model.h"
#include "models/loss_slices.h"
#include "core/strategy_rules.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace fsdp {

int shard_group_size(ShardingStrategy strategy, int world, int ranks_per_node) {
  if (strategy == ShardingStrategy::kNoShard) return 1;
  if (!is_hybrid(strategy)) return world;
  TORCH_CHECK(ranks_per_node > 0 && world % ranks_per_node == 0, "hybrid sharding needs ranks_per_node dividing ",
              world, ", got ", ranks_per_node);
  return ranks_per_node;
}

namespace {

// The elements of unit u's frozen part: frozen_numels[u], or 0 where nothing
// is frozen (an empty list); a list of another length is refused.
int64_t frozen_at(const std::vector<int64_t>& frozen_numels, size_t u) {
  return frozen_numels.empty() ? 0 : frozen_numels[u];
}
void check_frozen(const std::vector<int64_t>& unit_numels, const std::vector<int64_t>& frozen_numels, const char* what) {
  TORCH_CHECK(frozen_numels.empty() || frozen_numels.size() == unit_numels.size(), what,
              ": expected no frozen counts or one per unit (", unit_numels.size(), "), got ", frozen_numels.size());
}

// n elements sharded over K ranks: padded to a multiple of K.
int64_t padded_numel(int64_t n, int64_t K) { return (n + K - 1) / K * K; }

// A unit's NF4 weights (MixedPrecision::frozen_nf4; `nf4_numels`, each
// weight in whole blocks of 64): a buffer of its own, whole 36-byte records
// a rank (`padded`: its blocks padded to K, in elements), gathered as those
// records and dequantized into the frozen compute dtype. Without
// frozen_nf4 they are frozen parameters like the others.
struct Nf4Part {
  int64_t padded = 0;
  int64_t records_bytes() const { return padded / 64 * 36; }  // the whole unit's, gathered
};
Nf4Part nf4_part(const std::vector<int64_t>& nf4_numels, size_t u, int64_t K, const MixedPrecision& mp) {
  if (!mp.frozen_nf4() || nf4_numels.empty()) return {};
  return {padded_numel(nf4_numels[u] / 64, K) * 64};
}
// The elements of unit u's other frozen parameters: its frozen part less its NF4 weights.
int64_t other_frozen(const std::vector<int64_t>& frozen_numels, const std::vector<int64_t>& nf4_numels, size_t u,
                     const MixedPrecision& mp) {
  const int64_t nf4 = mp.frozen_nf4() && !nf4_numels.empty() ? nf4_numels[u] : 0;
  return std::max<int64_t>(0, frozen_at(frozen_numels, u) - nf4);
}

}  // namespace

ModelStateBytes estimate_model_state(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy, int world,
                                     int ranks_per_node, const MixedPrecision& mixed_precision,
                                     int64_t optimizer_bytes_per_element, const std::vector<int64_t>& frozen_numels,
                                     const std::vector<int64_t>& nf4_numels) {
  check_frozen(unit_numels, frozen_numels, "estimate_model_state");
  check_frozen(unit_numels, nf4_numels, "estimate_model_state (NF4)");
  const int64_t K = shard_group_size(strategy, world, ranks_per_node);
  const int64_t p = c10::elementSize(mixed_precision.param_dtype());
  // A frozen part is held in frozen_param_dtype where one is set (else fp32)
  // and gathered in effective_frozen_param_dtype().
  const int64_t f = c10::elementSize(mixed_precision.frozen_param_dtype().value_or(c10::ScalarType::Float));
  const int64_t pf = c10::elementSize(mixed_precision.effective_frozen_param_dtype());
  // A flat buffer's parameters (a unit's trainable part or its frozen part):
  // the shard of `held` bytes an element, and a persistent buffer gathered
  // in `gathered` bytes an element (the shard itself where they agree in fp32).
  auto param_bytes = [&](int64_t padded, int64_t held, int64_t gathered) {
    const int64_t shard = padded / K;
    if (!keeps_params_unsharded(strategy)) return held * shard;
    return gathered != 4 || held != 4 ? gathered * padded + held * shard : 4 * padded;
  };
  ModelStateBytes bytes;
  int64_t largest_other_unit = 0;
  for (size_t u = 0; u < unit_numels.size(); ++u) {
    const int64_t padded = padded_numel(unit_numels[u], K), shard = padded / K;
    const int64_t frozen_padded = padded_numel(other_frozen(frozen_numels, nf4_numels, u, mixed_precision), K);
    const Nf4Part nf4 = nf4_part(nf4_numels, u, K, mixed_precision);
    // A frozen part is gathered with its unit; NF4 records are gathered, then dequantized beside them.
    const int64_t gathered = p * padded + pf * frozen_padded + pf * nf4.padded + nf4.records_bytes();
    if (!keeps_params_unsharded(strategy)) {
      if (!reshards_after_forward(strategy)) {
        bytes.gathered_peak += gathered;
      } else if (u == 0) {
        bytes.gathered_peak += gathered;  // the root's forward and backward span every other unit's
      } else {
        largest_other_unit = std::max(largest_other_unit, gathered);
      }
    }
    bytes.optimizer += optimizer_bytes_per_element * shard;
    bytes.params += param_bytes(padded, 4, p);
    bytes.grads += 4 * (keeps_params_unsharded(strategy) ? padded : shard);
    bytes.frozen_params += param_bytes(frozen_padded, f, pf);  // no gradient, no optimizer state
    // The records of a shard; a persistent strategy keeps the dequantized weights too.
    bytes.frozen_params += nf4.records_bytes() / K + (keeps_params_unsharded(strategy) ? pf * nf4.padded : 0);
  }
  bytes.params += bytes.frozen_params;
  bytes.gathered_peak += largest_other_unit;
  return bytes;
}

namespace {

// The hosts a plan spans: world / ranks_per_node, one host for 0.
int64_t host_count(int world, int ranks_per_node) {
  if (ranks_per_node <= 0) return 1;
  TORCH_CHECK(world % ranks_per_node == 0, world, " ranks cannot form hosts of ", ranks_per_node,
              " ranks (ranks_per_node must divide the world size)");
  return world / ranks_per_node;
}

// The packed form of n elements quantized in blocks (comm/quantize.h): the
// int8 values padded to whole blocks, then one fp32 scale per block.
int64_t quantized_bytes(int64_t n, int64_t block) {
  const int64_t blocks = (n + block - 1) / block;
  return blocks * block + 4 * blocks;
}

// One unit's bytes in a step, split by kind and by whether its group spans hosts.
struct UnitComm {
  int64_t gather_across = 0, gather_inside = 0, reduce_scatter_across = 0, reduce_scatter_inside = 0;
  int64_t all_reduce_across = 0, all_reduce_inside = 0, all_to_all_across = 0, all_to_all_inside = 0;
};

// The sharded strategies (not no_shard, zero1) with ZeRO++'s options, for a
// unit of n elements: K = the shard group, over `hosts` hosts.
// A frozen part (`frozen`) is gathered alike and reduces nothing.
UnitComm sharded_unit_comm(int64_t n, ShardingStrategy strategy, int64_t K, int64_t hosts, int64_t p, int64_t r,
                           const ZeroPlusPlus& z, bool frozen = false) {
  const int64_t S = (n + K - 1) / K, Np = S * K, block = z.quantization_block();
  const bool spans_hosts = !is_hybrid(strategy) && hosts > 1;  // the shard group's collectives
  UnitComm c;
  auto gather = [&](int64_t bytes, bool across) { (across ? c.gather_across : c.gather_inside) += bytes; };
  const int64_t gathered = z.gather_quantization() != Quantization::kNone ? K * quantized_bytes(S, block) : Np * p;
  gather(gathered, spans_hosts);  // forward's (the only one for the zero2 kinds)
  if (reshards_after_forward(strategy)) {
    // hpZ: the host's slices of forward's dequantized buffer, over the host.
    if (z.secondary_partition()) {
      gather(Np * p, false);
    } else {
      gather(gathered, spans_hosts);
    }
  }
  if (frozen) return c;
  if (z.gradient_quantization() != Quantization::kNone) {
    c.reduce_scatter_inside += Np * r;  // the whole flat gradient, inside the host
    (hosts > 1 ? c.all_to_all_across : c.all_to_all_inside) += hosts * quantized_bytes(S, block);
  } else {
    (spans_hosts ? c.reduce_scatter_across : c.reduce_scatter_inside) += Np * r;
  }
  if (is_hybrid(strategy) && hosts > 1) c.all_reduce_across += S * r;  // the shard, over the replicate group
  return c;
}

// hpZ: from the end of forward to its backward every unit keeps its host's
// slice, Np / host_ranks elements in the param dtype, all of them at once
// when forward ends. qwZ: a quantized gather in flight holds its packed
// shard and the packed gathered rows (K + 1 rows of the largest unit; a
// unit's frozen part, gathered at once with it, adds its own).
void add_zero_plus_plus_memory(StepPeak& peak, const std::vector<int64_t>& units,
                               const std::vector<int64_t>& frozen_numels, int64_t K, int64_t host_ranks, int64_t p,
                               int64_t pf, const ZeroPlusPlus& z) {
  int64_t largest_packed = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    int64_t packed = 0;
    for (auto [n, bytes] : {std::pair{units[u], p}, std::pair{frozen_at(frozen_numels, u), pf}}) {
      const int64_t S = (n + K - 1) / K;
      packed += quantized_bytes(S, z.quantization_block());
      if (z.secondary_partition()) peak.secondary_partition += S * K / host_ranks * bytes;
    }
    largest_packed = std::max(largest_packed, packed);
  }
  if (z.gather_quantization() != Quantization::kNone) peak.gathered += (K + 1) * largest_packed;
}

}  // namespace

void check_zero_plus_plus_plan(ShardingStrategy strategy, int world, int ranks_per_node,
                               const ZeroPlusPlus& zero_plus_plus) {
  check_zero_plus_plus(FullyShardOptions().strategy(strategy).zero_plus_plus(zero_plus_plus));
  if (zero_plus_plus.any()) host_count(world, ranks_per_node);
}

CommBytes estimate_comm_per_step(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy, int world,
                                 int ranks_per_node, const MixedPrecision& mixed_precision,
                                 const ZeroPlusPlus& zero_plus_plus, const std::vector<int64_t>& frozen_numels,
                                 const std::vector<int64_t>& nf4_numels) {
  check_zero_plus_plus_plan(strategy, world, ranks_per_node, zero_plus_plus);
  check_frozen(unit_numels, frozen_numels, "estimate_comm_per_step");
  check_frozen(unit_numels, nf4_numels, "estimate_comm_per_step (NF4)");
  const int64_t K = shard_group_size(strategy, world, ranks_per_node);
  const int64_t hosts = is_hybrid(strategy) ? world / K : host_count(world, ranks_per_node);
  const int64_t p = c10::elementSize(mixed_precision.param_dtype());
  const int64_t pf = c10::elementSize(mixed_precision.effective_frozen_param_dtype());
  const int64_t r = c10::elementSize(mixed_precision.effective_reduce_dtype());
  CommBytes bytes;
  if (world == 1 && strategy == ShardingStrategy::kNoShard) return bytes;
  // no_shard, zero1: whole gradients all-reduced over the world (frozen parts have none, and stay gathered)
  if (keeps_params_unsharded(strategy)) {
    int64_t padded = 0;
    for (int64_t n : unit_numels) padded += (n + K - 1) / K * K;
    bytes.all_reduce = r * padded;
    if (strategy == ShardingStrategy::kZero1) bytes.all_gather = p * padded;
    if (hosts > 1) bytes.cross_host = bytes.total();
    return bytes;
  }
  auto add = [&](const UnitComm& c) {
    bytes.all_gather += c.gather_across + c.gather_inside;
    bytes.reduce_scatter += c.reduce_scatter_across + c.reduce_scatter_inside;
    bytes.all_reduce += c.all_reduce_across + c.all_reduce_inside;
    bytes.all_to_all += c.all_to_all_across + c.all_to_all_inside;
    bytes.cross_host += c.gather_across + c.reduce_scatter_across + c.all_reduce_across + c.all_to_all_across;
  };
  for (size_t u = 0; u < unit_numels.size(); ++u) {
    add(sharded_unit_comm(unit_numels[u], strategy, K, hosts, p, r, zero_plus_plus));
    const int64_t frozen = other_frozen(frozen_numels, nf4_numels, u, mixed_precision);
    if (frozen > 0) add(sharded_unit_comm(frozen, strategy, K, hosts, pf, r, zero_plus_plus, /*frozen=*/true));
    // NF4 records: gathered as bytes, as often as the unit (no ZeRO++ with them).
    const int64_t records = nf4_part(nf4_numels, u, K, mixed_precision).records_bytes();
    const bool spans_hosts = !is_hybrid(strategy) && hosts > 1;
    bytes.all_gather += records * (reshards_after_forward(strategy) ? 2 : 1);
    if (spans_hosts) bytes.cross_host += records * (reshards_after_forward(strategy) ? 2 : 1);
  }
  return bytes;
}

std::vector<StrategyCandidate> strategy_candidates(const std::vector<int64_t>& unit_numels, int world,
                                                   int ranks_per_node, const MixedPrecision& mixed_precision,
                                                   const std::vector<int64_t>& frozen_numels,
                                                   const std::vector<int64_t>& nf4_numels) {
  using S = ShardingStrategy;
  std::vector<S> order = {S::kNoShard, S::kZero1, S::kShardGradOp, S::kFullShard};
  if (ranks_per_node > 0 && ranks_per_node < world) {
    order = {S::kNoShard, S::kZero1, S::kHybridShardZero2, S::kShardGradOp, S::kHybridShard, S::kFullShard};
  }
  std::vector<StrategyCandidate> candidates;
  for (S s : order) {
    candidates.push_back(
        {s, estimate_model_state(unit_numels, s, world, ranks_per_node, mixed_precision, 8, frozen_numels, nf4_numels),
         estimate_comm_per_step(unit_numels, s, world, ranks_per_node, mixed_precision, ZeroPlusPlus(), frozen_numels,
                                nf4_numels)});
  }
  return candidates;
}

namespace {

// "no_shard needs 1896448 B (1896448 model state + 0 gathered), ..."
std::string describe_needs(const std::vector<StrategyCandidate>& candidates) {
  std::ostringstream s;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const auto& c = candidates[i];
    s << (i ? ", " : "") << fsdp::enum_name(c.strategy) << " needs " << c.needed() << " B (" << c.state.total()
      << " model state + " << c.state.gathered_peak << " gathered)";
  }
  return s.str();
}

}  // namespace

StrategyChoice choose_strategy(const std::vector<int64_t>& unit_numels, int world, int ranks_per_node,
                               const MixedPrecision& mixed_precision, int64_t budget,
                               const std::vector<int64_t>& frozen_numels, const std::vector<int64_t>& nf4_numels) {
  TORCH_CHECK(budget > 0, "a memory budget must be a positive number of bytes, got ", budget);
  StrategyChoice choice;
  choice.budget = budget;
  choice.candidates =
      strategy_candidates(unit_numels, world, ranks_per_node, mixed_precision, frozen_numels, nf4_numels);
  std::string order;
  for (const auto& c : choice.candidates) order += (order.empty() ? "" : ", ") + std::string(fsdp::enum_name(c.strategy));
  const auto fits = std::find_if(choice.candidates.begin(), choice.candidates.end(),
                                 [&](const StrategyCandidate& c) { return c.needed() <= budget; });
  TORCH_CHECK(fits != choice.candidates.end(), "no strategy fits a per-rank budget of ", budget,
              " B (model state plus gathered parameters) at ", world, " ranks: ", describe_needs(choice.candidates),
              "; more ranks would shard the state further");
  choice.strategy = fits->strategy;
  std::ostringstream reason;
  reason << "picked " << fsdp::enum_name(choice.strategy) << ", the first of " << order
         << " (least to most communication) whose per-rank model state plus gathered parameters fits " << budget
         << " B: " << describe_needs(choice.candidates);
  choice.reason = reason.str();
  return choice;
}


namespace {

// A unit's gradient buffers at backward's peak, for its `largest_trainable`
// padded elements: its parameters' gradients (compute dtype) and, for
// sharded gradients, the flat gradient being reduced and the previous
// unit's reduction in flight. A recomputed unit finishes the previous
// reduction before its gradients exist, and needs no flat copy where the
// reduction runs in the compute dtype.
int64_t unit_gradient_bytes(ShardingStrategy strategy, const MixedPrecision& mixed_precision,
                            bool activation_checkpointing, int64_t largest_trainable) {
  const int64_t p = c10::elementSize(mixed_precision.param_dtype());
  const int64_t r = c10::elementSize(mixed_precision.effective_reduce_dtype());
  if (keeps_full_gradients(strategy)) return p * largest_trainable;
  if (!activation_checkpointing) return (p + 2 * r) * largest_trainable;
  const bool flat_in_place = mixed_precision.effective_reduce_dtype() == mixed_precision.param_dtype();
  return (flat_in_place ? p : p + r) * largest_trainable;
}

// What the loss (models::next_token_loss) holds, M = batch x context
// tokens, in the compute dtype's `p` bytes. Whole, it keeps the fp32
// log-probabilities (M V), and backward starts with their gradient and the
// logits' (2 M V). Sliced, it keeps nothing of M V: from its last slice into
// backward it holds its gradients, the head's in an fp32 accumulator (V C)
// and the hidden states' (M C), beside one slice's fp32 logits (R V; in bf16
// also the product before the cast, the gradient cast back, and the head's
// product before it joins the accumulator), and, once the slice is gone,
// the root unit's gradient buffer (`root_gradients`), which the head's
// gradient opens (measured, the GPT-2-124M shape: the plan was 10% low
// without it).
struct LossMemory {
  int64_t kept = 0;      // from forward into backward
  int64_t backward = 0;  // at backward's start, beside what is kept
};
LossMemory loss_memory(const TransformerShape& shape, int64_t p, int64_t root_gradients) {
  const int64_t M = shape.batch * shape.context, C = shape.width, V = shape.vocab, R = models::loss_slice_rows(V);
  if (M <= R) return {M * V * 4, 2 * M * V * 4};
  const int64_t cast_bytes = p == 4 ? 0 : p;  // what a compute dtype other than fp32 adds, per element
  return {0, V * C * (4 + cast_bytes) + M * C * p + std::max(R * V * (4 + 2 * cast_bytes), root_gradients)};
}

}  // namespace

StepPeak estimate_step_peak(const TransformerShape& shape, ShardingStrategy strategy, int world, int ranks_per_node,
                            const MixedPrecision& mixed_precision, bool prefetch, bool activation_checkpointing,
                            const std::vector<int64_t>& unit_numels, const ZeroPlusPlus& zero_plus_plus,
                            const std::vector<int64_t>& frozen_numels, const std::vector<int64_t>& nf4_numels) {
  const std::vector<int64_t> units = unit_numels.empty() ? shape.unit_numels() : unit_numels;
  check_zero_plus_plus_plan(strategy, world, ranks_per_node, zero_plus_plus);
  check_frozen(units, frozen_numels, "estimate_step_peak");
  StepPeak peak;
  peak.state =
      estimate_model_state(units, strategy, world, ranks_per_node, mixed_precision, 8, frozen_numels, nf4_numels);
  const int64_t K = shard_group_size(strategy, world, ranks_per_node);
  const int64_t p = c10::elementSize(mixed_precision.param_dtype());
  const int64_t pf = c10::elementSize(mixed_precision.effective_frozen_param_dtype());
  // The largest unit but the root, padded: gathered with its frozen part
  // (`largest_bytes`), and its trainable part alone, which has gradients.
  int64_t largest_bytes = 0, largest_trainable = 0;
  for (size_t u = 1; u < units.size(); ++u) {
    const Nf4Part nf4 = nf4_part(nf4_numels, u, K, mixed_precision);
    largest_bytes = std::max(largest_bytes, p * padded_numel(units[u], K) +
                                                pf * padded_numel(other_frozen(frozen_numels, nf4_numels, u, mixed_precision), K) +
                                                pf * nf4.padded + nf4.records_bytes());
    largest_trainable = std::max(largest_trainable, padded_numel(units[u], K));
  }
  peak.gathered = peak.state.gathered_peak;
  if (prefetch && reshards_after_forward(strategy)) peak.gathered += largest_bytes;  // one unit gathered ahead
  add_zero_plus_plus_memory(peak, units, frozen_numels, K, world / host_count(world, ranks_per_node), p, pf,
                            zero_plus_plus);
  // What autograd keeps, M = batch x context tokens: per block the first
  // norm's output, q/k/v, the attention probabilities, the attention
  // output, the residual, the second norm's output, the MLP's two 4C
  // activations, the block output (15 M C elements), the probabilities
  // (B H T^2; fused, the log-sum-exps), and the norms' statistics (fp32);
  // outside the blocks the embeddings' sum, the final norm's output, the
  // mask (written out), and the loss's (below). Checkpointed units keep only their input (per
  // block: the block's input; per sublayer: also both norms' inputs and
  // outputs, which live outside the units), and the largest unit's
  // activations exist again while it is recomputed.
  const int64_t M = shape.batch * shape.context, C = shape.width, T = shape.context;
  // Written out, the probabilities (B H T^2); fused, one fp32 log-sum-exp per head and position.
  const int64_t probabilities = shape.attention_saves_probabilities ? shape.batch * shape.heads * T * T * p
                                                                    : shape.batch * shape.heads * T * 4;
  const int64_t norm_stats = 4 * M * 4;
  const int64_t per_block = 15 * M * C * p + probabilities + norm_stats;
  const int64_t largest_unit_activations =
      shape.sublayer_units ? std::max(4 * M * C * p + probabilities, 8 * M * C * p) : per_block;
  const int64_t kept_per_layer = shape.sublayer_units ? 4 * M * C * p + norm_stats : M * C * p;
  const int64_t mask = shape.attention_saves_probabilities ? T * T : 0;
  // Backward hands the head's gradient to the root unit first: with sharded
  // gradients its flat gradient buffer exists from then on.
  const LossMemory loss = loss_memory(shape, p, keeps_full_gradients(strategy) ? 0 : p * padded_numel(units[0], K));
  const int64_t loss_kept = loss.kept, loss_backward = loss.backward;
  const int64_t outside = 2 * M * C * p + loss_kept + mask;
  peak.activations = activation_checkpointing ? shape.layers * kept_per_layer + largest_unit_activations + outside
                                              : shape.layers * per_block + outside;
  const int64_t layer_extra = shape.extra_layer_activations * M * p;  // a model's own, beyond the GPT block's
  peak.activations += activation_checkpointing ? layer_extra : shape.layers * layer_extra;
  // Backward's own buffers at its peak: at its start the loss's gradients
  // (loss_backward above); later, in a unit, its
  // parameters' gradients (compute dtype) and, for sharded gradients, the
  // flat gradient being reduced and the previous unit's reduction in flight,
  // while the unit's activations are already freed. A recomputed unit
  // finishes the previous reduction before its gradients exist; its
  // recomputed activations are live (counted above), with the largest of
  // their gradients and one weight's gradient (4 C^2, before autograd adds
  // it into the flat buffer).
  const int64_t unit_gradients =
      unit_gradient_bytes(strategy, mixed_precision, activation_checkpointing, largest_trainable);
  // Written out, the last layer's softmax backward holds two B H T^2
  // gradients (the probabilities' and the scores') beside everything still
  // kept but the whole loss's log-probabilities, freed by then: at long contexts the
  // step's peak (measured, medium at T = 2048 on 2.15: 14% above the plan
  // without them).
  const int64_t softmax_backward = shape.attention_saves_probabilities ? 2 * probabilities - loss_kept : 0;
  peak.backward_transient =
      std::max(loss_backward,
               activation_checkpointing ? unit_gradients + 4 * C * C * p + std::max(probabilities, 4 * M * C * p)
                                        : std::max(unit_gradients - largest_unit_activations, softmax_backward));
  return peak;
}

CheckpointStaging estimate_checkpoint_staging(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy,
                                              int world, int ranks_per_node, bool full_format,
                                              int64_t optimizer_bytes_per_element,
                                              const std::vector<int64_t>& frozen_numels) {
  check_frozen(unit_numels, frozen_numels, "estimate_checkpoint_staging");
  const int64_t G = shard_group_size(strategy, world, ranks_per_node);
  // Bytes per element: the fp32 master and the optimizer's state; a frozen
  // part's the master alone.
  const int64_t per_element = 4 + optimizer_bytes_per_element, per_frozen_element = 4;
  int64_t shards = 0, padded = 0;  // bytes: every unit's shard, every unit padded
  for (size_t u = 0; u < unit_numels.size(); ++u) {
    for (const auto& [n, bytes] : {std::pair<int64_t, int64_t>{unit_numels[u], per_element},
                                   {frozen_at(frozen_numels, u), per_frozen_element}}) {
      const int64_t shard = (n + G - 1) / G;
      shards += bytes * shard;
      padded += bytes * shard * G;
    }
  }
  CheckpointStaging staging;
  if (full_format) {
    staging.rank0 = padded;  // every gathered tensor kept until written
  } else {
    staging.rank0 = shards;  // rank 0 always writes shard-0
    if (G > 1 && world > 1) staging.per_rank = staging.rank0;  // no_shard: only rank 0 writes
  }
  return staging;
}

double NvmeOffloadPlan::io_seconds(double read_bandwidth, double write_bandwidth) const {
  TORCH_CHECK(read_bandwidth > 0 && write_bandwidth > 0, "NvmeOffloadPlan::io_seconds: bandwidths must be positive");
  return static_cast<double>(read_per_step) / read_bandwidth + static_cast<double>(written_per_step) / write_bandwidth;
}

namespace {
// Bytes of the `count` largest of `shards` (sorted largest first), at `bytes_per_element`.
int64_t largest_shards_bytes(const std::vector<int64_t>& shards, size_t count, int64_t bytes_per_element) {
  int64_t total = 0;
  for (size_t i = 0; i < std::min(count, shards.size()); ++i) total += bytes_per_element * shards[i];
  return total;
}

// What goes to disk, as NvmeOffload decides it, and when a step's units update.
struct DiskLayout {
  bool master = false, params = false, optimizer_state = false, gradient_slot = false;
  bool step_in_backward = false, step_before_next_gather = false, reshards_after_forward = false;
  int64_t param_bytes = 4;  // the param dtype's
  int64_t gathers = 0;      // per step, each reading the offloaded parameters
  int64_t block_bytes = 1;
};

// Adds one shard of S elements to the plan: the store's slots (master,
// param-dtype copy, exp_avg, exp_avg_sq, gradient) and a step's traffic. A
// frozen part has its parameters' slots alone, read by its gathers and never
// written again: it never steps. Returns what its resident parameters
// change by (the param-dtype copy kept in memory, less the master gone).
int64_t add_shard_on_disk(NvmeOffloadPlan& plan, const DiskLayout& d, int64_t S, bool frozen) {
  const bool fp32 = d.param_bytes == 4, steps = !frozen;
  const int64_t p = d.param_bytes;
  const int64_t slots[] = {d.master ? 4 * S : 0, d.params && !fp32 ? p * S : 0,
                           steps && d.optimizer_state ? 4 * S : 0, steps && d.optimizer_state ? 4 * S : 0,
                           steps && d.gradient_slot ? 4 * S : 0};
  for (int64_t bytes : slots) {
    plan.offloaded += bytes;
    plan.file_bytes += (bytes + d.block_bytes - 1) / d.block_bytes * d.block_bytes;
  }
  if (d.params) plan.read_per_step += d.gathers * (fp32 ? 4 : p) * S;
  if (steps) {
    if (d.optimizer_state) plan.read_per_step += 8 * S, plan.written_per_step += 8 * S;
    if (d.master) plan.read_per_step += 4 * S, plan.written_per_step += 4 * S;
    if (d.params) {
      if (!fp32) plan.written_per_step += p * S;
      // The master the last backward gather reads stays for the step.
      if (fp32 && d.step_in_backward && d.reshards_after_forward) plan.read_per_step -= 4 * S;
      // The first forward gather sends the master its unit's update just wrote.
      if (d.step_before_next_gather) plan.read_per_step -= (fp32 ? 4 : p) * S;
    }
    if (d.step_before_next_gather) plan.read_per_step += 4 * S, plan.written_per_step += 4 * S;
  }
  return d.master ? (d.params ? 0 : p * S) - 4 * S : 0;
}
}  // namespace

NvmeOffloadPlan estimate_nvme_offload(const std::vector<int64_t>& unit_numels, ShardingStrategy strategy, int world,
                                      int ranks_per_node, const MixedPrecision& mixed_precision, bool optimizer_state,
                                      bool params, int64_t micro_steps, int64_t block_bytes, bool step_in_backward,
                                      int read_ahead, bool step_before_next_gather, bool gradient_slots,
                                      const std::vector<int64_t>& frozen_numels) {
  TORCH_CHECK(block_bytes > 0 && micro_steps > 0 && read_ahead > 0,
              "estimate_nvme_offload: block_bytes, micro_steps and read_ahead must be positive");
  NvmeOffloadPlan plan;
  TORCH_CHECK(!(step_in_backward && step_before_next_gather), "estimate_nvme_offload: a step runs in backward or ",
              "before the next gather, not both");
  plan.step_in_backward = step_in_backward;
  plan.step_before_next_gather = step_before_next_gather;
  TORCH_CHECK(gradient_slots || !step_before_next_gather, "estimate_nvme_offload: a step before the next gather ",
              "writes its gradients to their slots: it needs gradient_slots");
  check_frozen(unit_numels, frozen_numels, "estimate_nvme_offload");
  const bool freezes = std::any_of(frozen_numels.begin(), frozen_numels.end(), [](int64_t n) { return n > 0; });
  TORCH_CHECK(!freezes || !mixed_precision.frozen_param_dtype(), "estimate_nvme_offload: ",
              "frozen_param_dtype with disk offload is not supported (fully_shard refuses it)");
  plan.resident = estimate_model_state(unit_numels, strategy, world, ranks_per_node, mixed_precision, 8, frozen_numels);
  const int64_t K = shard_group_size(strategy, world, ranks_per_node);
  // Either frees each gradient once its unit stepped or once written out.
  const bool overlaps = step_in_backward || step_before_next_gather;
  DiskLayout d;
  d.param_bytes = c10::elementSize(mixed_precision.param_dtype());
  const bool fp32 = d.param_bytes == 4;
  d.master = fp32 ? params : optimizer_state;  // as NvmeOffload decides
  d.params = params;
  d.optimizer_state = optimizer_state;
  // The store has a slot per unit's gradient where NvmeOffloadOptions::step_in_backward and
  // gradient_slots asked for it, in a strategy that hands gradients over (as NvmeOffload decides).
  d.gradient_slot = gradient_slots && overlaps;
  d.step_in_backward = step_in_backward;
  d.step_before_next_gather = step_before_next_gather;
  d.reshards_after_forward = reshards_after_forward(strategy);
  d.gathers = micro_steps * (keeps_params_unsharded(strategy) ? 0 : (reshards_after_forward(strategy) ? 2 : 1));
  d.block_bytes = block_bytes;
  std::vector<int64_t> shards;           // each unit's trainable shard (elements): what a step reads and writes
  std::vector<int64_t> gathered_shards;  // and each frozen part's: what the gathers read
  // What leaves the resident figures (sharded strategies keep 4S of params;
  // zero1 and no_shard keep whole parameters, of which only a separate
  // master goes).
  int64_t resident_change = 0, frozen_resident_change = 0;
  for (size_t u = 0; u < unit_numels.size(); ++u) {
    const int64_t F = (frozen_at(frozen_numels, u) + K - 1) / K;  // a frozen part is a unit of its own to the store
    if (F > 0) {
      gathered_shards.push_back(F);
      frozen_resident_change += add_shard_on_disk(plan, d, F, /*frozen=*/true);
    }
    const int64_t S = (unit_numels[u] + K - 1) / K;
    if (S == 0) continue;
    shards.push_back(S);
    gathered_shards.push_back(S);
    resident_change += add_shard_on_disk(plan, d, S, /*frozen=*/false);
  }
  if (optimizer_state) plan.resident.optimizer = 0;
  plan.resident.params += resident_change + frozen_resident_change;
  plan.resident.frozen_params += frozen_resident_change;
  // Each freed once its unit stepped, or once written out.
  if (overlaps) plan.resident.grads = 0;
  std::sort(shards.rbegin(), shards.rend());
  std::sort(gathered_shards.rbegin(), gathered_shards.rend());
  // Before the next gather, each unit's gradient is read with its state.
  const int64_t per_unit_step = (d.master ? 4 : 0) + (optimizer_state ? 8 : 0) + (params && !fp32 ? d.param_bytes : 0) +
                                (step_before_next_gather ? 4 : 0);
  // Before the next gather: the read_ahead units read ahead of forward (the
  // stepping one's master becomes its gather's input; measured at medium,
  // W = 4, forward's peak held less than this). In backward: the stepping
  // unit and those read ahead (the one written behind frees its state as
  // its write goes: xl at W = 4 peaked 1.2 % under this). After backward:
  // read, step, write.
  const size_t ahead = static_cast<size_t>(read_ahead);
  const size_t units_stepping = step_before_next_gather ? ahead : (step_in_backward ? ahead + 1 : 3);
  plan.step_buffers = largest_shards_bytes(shards, units_stepping, per_unit_step);
  plan.step_buffers += step_in_backward ? largest_shards_bytes(shards, 1, 4) : 0;  // the stepping unit's gradient
  // Written out in backward: the one being written behind and the next one
  // reduced, at backward's peak.
  plan.gradient_buffers = step_before_next_gather ? largest_shards_bytes(shards, 2, 4) : 0;
  plan.gather_buffers = params ? largest_shards_bytes(gathered_shards, ahead + 1, fp32 ? 4 : d.param_bytes) : 0;
  return plan;
}

int64_t peak_with_nvme_offload(const StepPeak& peak, const NvmeOffloadPlan& plan) {
  const int64_t in_step = peak.total() - peak.state.total() + plan.resident.total() + plan.gather_buffers;
  if (plan.step_in_backward) return in_step + plan.step_buffers;
  if (plan.step_before_next_gather) {
    // Forward holds the units stepping ahead of their gathers, beside what
    // it gathered and the activations it keeps; backward the gradients
    // being written out, beside its own peak. Not both at once.
    const int64_t forward =
        plan.resident.total() + peak.gathered + peak.activations + peak.secondary_partition + plan.step_buffers;
    return std::max(forward, in_step + plan.gradient_buffers);
  }
  const int64_t in_optimizer = plan.resident.total() + plan.step_buffers;
  return std::max(in_step, in_optimizer);
}

}  // namespace fsdp
