// The spec's warmup-plus-cosine learning rate.

#include "fsdp/lr_schedule.h"

#include <cmath>
#include <sstream>

namespace fsdp {

namespace detail {

const EnumNames& enum_names(EnumTag<LrScheduleKind>) {
  static const EnumNames names = EnumNames::of<LrScheduleKind>("learning-rate schedule", {
      {LrScheduleKind::kConstant, "constant"},
      {LrScheduleKind::kCosine, "cosine"}});
  return names;
}

}  // namespace detail

void LrSchedule::validate() const {
  TORCH_CHECK(lr() > 0, "LrSchedule: lr must be positive, got ", lr());
  TORCH_CHECK(warmup_steps() >= 0, "LrSchedule: warmup_steps must be >= 0, got ", warmup_steps());
  if (kind() == LrScheduleKind::kCosine) {
    TORCH_CHECK(min_lr() >= 0 && min_lr() <= lr(), "LrSchedule: min_lr must be in [0, lr] = [0, ", lr(), "], got ",
                min_lr());
    TORCH_CHECK(total_steps() >= 1, "LrSchedule: cosine needs total_steps (the run's steps) >= 1, got ",
                total_steps());
    // The cosine needs at least its last step after warmup to end at min_lr.
    TORCH_CHECK(warmup_steps() < total_steps(), "LrSchedule: cosine needs warmup_steps < total_steps, got ",
                warmup_steps(), " warmup steps of ", total_steps());
  }
}

double LrSchedule::lr_at(int64_t step) const {
  TORCH_CHECK(step >= 0, "LrSchedule::lr_at: the step must be >= 0, got ", step);
  const int64_t warmup = warmup_steps();
  if (step < warmup) return lr() * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (kind() == LrScheduleKind::kConstant) return lr();
  const int64_t span = total_steps() - 1 - warmup;
  // Steps past the last (a loop running longer than it said) stay at min_lr.
  if (span <= 0 || step - warmup >= span) return min_lr();
  const double ratio = static_cast<double>(step - warmup) / static_cast<double>(span);
  return min_lr() + 0.5 * (lr() - min_lr()) * (1.0 + std::cos(M_PI * ratio));
}

std::string LrSchedule::describe() const {
  std::ostringstream s;
  if (kind() == LrScheduleKind::kCosine) {
    s << "cosine from " << lr() << " to " << min_lr() << " over " << total_steps() << " steps";
  } else {
    s << "constant " << lr();
  }
  if (warmup_steps() > 0) s << ", " << warmup_steps() << " warmup steps";
  return s.str();
}

bool LrSchedule::same_as(const LrSchedule& other) const {
  if (kind() != other.kind() || lr() != other.lr() || warmup_steps() != other.warmup_steps()) return false;
  return kind() == LrScheduleKind::kConstant ||
         (min_lr() == other.min_lr() && total_steps() == other.total_steps());
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace fsdp
