#pragma once
/// \file
/// Warmup, constant and cosine learning rates.
///
/// The learning rate of each step, as the reference spec defines it
/// (spec/gpt.md, "Optimizer"): an optional linear warmup, then constant or a
/// cosine decay to min_lr at the last step. A loop sets it before each step:
///
/// \code{.cpp}
/// auto schedule = fsdp::LrSchedule().kind(fsdp::LrScheduleKind::kCosine).lr(1e-3)
///                     .warmup_steps(10).min_lr(1e-4).total_steps(steps);
/// for (int64_t step = first_step; step < steps; ++step) {
///   fsdp::set_learning_rate(optimizer, schedule.lr_at(step));
///   train_step(...);
/// }
/// \endcode
///
/// The schedule is a pure function of the step, so a resumed run continues it
/// from the step its checkpoint saved, bit for bit.

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include "fsdp/enum_names.h"

namespace fsdp {

/// What follows the warmup.
/// Named by enum_name, parsed by parse_enum: "constant", "cosine".
enum class LrScheduleKind {
  kConstant,  ///< the peak learning rate to the end
  kCosine     ///< a cosine decay from the peak to min_lr at the last step
};
namespace detail {
const EnumNames& enum_names(EnumTag<LrScheduleKind>);  ///< "constant", "cosine"
}  // namespace detail

/// The learning rate of every step (see lr_at()); setters chain, as in fsdp/lr_schedule.h's example.
struct LrSchedule {
  LrSchedule() = default;
  /// Constant or cosine after the warmup (constant by default).
  TORCH_ARG(LrScheduleKind, kind) = LrScheduleKind::kConstant;
  /// The peak learning rate.
  TORCH_ARG(double, lr) = 1e-3;
  /// Linear warmup: lr * (s + 1) / warmup for s < warmup.
  TORCH_ARG(int64_t, warmup_steps) = 0;
  /// Cosine: the learning rate of the last step.
  TORCH_ARG(double, min_lr) = 0.0;
  /// Cosine: S, the run's steps (its last step is S - 1).
  TORCH_ARG(int64_t, total_steps) = 0;

 public:  // TORCH_ARG leaves the struct private

  /// Throws, saying what was expected, for settings no run can use.
  void validate() const;
  /// The learning rate of step s (0-based):
  /// \code{.unparsed}
  ///   s < warmup:  lr * (s + 1) / warmup
  ///   constant:    lr
  ///   cosine:      min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * (s - warmup) / (S - 1 - warmup)))
  /// \endcode
  /// (cosine with S - 1 == warmup has one step after warmup, the last: min_lr).
  double lr_at(int64_t step) const;
  /// Human-readable, e.g. "cosine from 0.001 to 0.0001 over 100 steps, 10 warmup steps".
  std::string describe() const;
  /// Whether two schedules give every step the same learning rate (what a
  /// resumed run must keep): total_steps and min_lr matter only for cosine.
  bool same_as(const LrSchedule& other) const;
};

/// Sets the learning rate of every parameter group of `optimizer` (Adam,
/// AdamW, SGD, or any optimizer whose options implement set_lr).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace fsdp
