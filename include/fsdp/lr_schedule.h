#pragma once
// The learning rate of each step, as the reference spec defines it
// (spec/gpt.md, "Optimizer"): an optional linear warmup, then constant or a
// cosine decay to min_lr at the last step. A loop sets it before each step:
//
//   auto schedule = fsdp::LrSchedule().kind(fsdp::LrScheduleKind::kCosine).lr(1e-3)
//                       .warmup_steps(10).min_lr(1e-4).total_steps(steps);
//   for (int64_t step = first_step; step < steps; ++step) {
//     fsdp::set_learning_rate(optimizer, schedule.lr_at(step));
//     train_step(...);
//   }
//
// The schedule is a pure function of the step, so a resumed run continues it
// from the step its checkpoint saved, bit for bit.

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace fsdp {

enum class LrScheduleKind { kConstant, kCosine };
LrScheduleKind parse_lr_schedule(const std::string& name);  // "constant" or "cosine"
const char* lr_schedule_name(LrScheduleKind kind);

struct LrSchedule {
  LrSchedule() = default;
  TORCH_ARG(LrScheduleKind, kind) = LrScheduleKind::kConstant;
  TORCH_ARG(double, lr) = 1e-3;        // the peak learning rate
  TORCH_ARG(int64_t, warmup_steps) = 0;  // linear warmup: lr * (s + 1) / warmup for s < warmup
  TORCH_ARG(double, min_lr) = 0.0;     // cosine: the learning rate of the last step
  TORCH_ARG(int64_t, total_steps) = 0;  // cosine: S, the run's steps (its last step is S - 1)

 public:  // TORCH_ARG leaves the struct private

  // Throws, saying what was expected, for settings no run can use.
  void validate() const;
  // The learning rate of step s (0-based):
  //   s < warmup:  lr * (s + 1) / warmup
  //   constant:    lr
  //   cosine:      min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * (s - warmup) / (S - 1 - warmup)))
  // (cosine with S - 1 == warmup has one step after warmup, the last: min_lr).
  double lr_at(int64_t step) const;
  // Human-readable, e.g. "cosine from 0.001 to 0.0001 over 100 steps, 10 warmup steps".
  std::string describe() const;
  // Whether two schedules give every step the same learning rate (what a
  // resumed run must keep): total_steps and min_lr matter only for cosine.
  bool same_as(const LrSchedule& other) const;
};

// Sets the learning rate of every parameter group of `optimizer` (Adam,
// AdamW, SGD, or any optimizer whose options implement set_lr).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace fsdp
