// The learning-rate schedule (single process): warmup then cosine by the
// spec's formula, constant, bad settings refused, and what a resume compares.

#include <gtest/gtest.h>

#include <cmath>

#include "fsdp/lr_schedule.h"
#include "test_helpers.h"

using fsdp::testing::message_of;

// The spec's schedule (spec/gpt.md, "Optimizer"), written out here a second
// time by its formula: warmup lr * (s + 1) / warmup, then cosine to min_lr
// at the last step S - 1, or constant.
TEST(LrSchedule, WarmupThenCosineFollowsTheSpecFormula) {
  const double lr = 1e-3, min_lr = 1e-4;
  const int64_t warmup = 3, S = 10;
  auto cosine = fsdp::LrSchedule().kind(fsdp::LrScheduleKind::kCosine).lr(lr).warmup_steps(warmup).min_lr(min_lr).total_steps(S);
  cosine.validate();
  for (int64_t s = 0; s < S; ++s) {
    const double expected = s < warmup ? lr * (s + 1) / warmup
                                       : min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(M_PI * (s - warmup) / (S - 1.0 - warmup)));
    EXPECT_NEAR(cosine.lr_at(s), expected, 1e-15) << "step " << s;
  }
  EXPECT_DOUBLE_EQ(cosine.lr_at(0), lr / 3);
  EXPECT_DOUBLE_EQ(cosine.lr_at(warmup - 1), lr);  // warmup ends at the peak
  EXPECT_DOUBLE_EQ(cosine.lr_at(warmup), lr);      // the cosine starts there
  EXPECT_DOUBLE_EQ(cosine.lr_at(S - 1), min_lr);   // and ends at min_lr on the last step
  EXPECT_DOUBLE_EQ(cosine.lr_at(S + 5), min_lr);   // a loop running longer stays there
  // Without warmup the first step has the whole lr; one step after warmup is the last.
  EXPECT_DOUBLE_EQ(fsdp::LrSchedule(cosine).warmup_steps(0).lr_at(0), lr);
  EXPECT_DOUBLE_EQ(fsdp::LrSchedule(cosine).warmup_steps(S - 1).lr_at(S - 1), min_lr);

  auto constant = fsdp::LrSchedule().lr(lr).warmup_steps(4);
  constant.validate();
  EXPECT_DOUBLE_EQ(constant.lr_at(0), lr / 4);
  EXPECT_DOUBLE_EQ(constant.lr_at(3), lr);
  EXPECT_DOUBLE_EQ(constant.lr_at(1000), lr);
  EXPECT_DOUBLE_EQ(fsdp::LrSchedule().lr(lr).lr_at(0), lr);
}

TEST(LrSchedule, BadSettingsAreRefusedAndResumesCompareWhatMatters) {
  auto cosine = fsdp::LrSchedule().kind(fsdp::parse_enum<fsdp::LrScheduleKind>("cosine")).lr(1e-3).min_lr(1e-4).total_steps(10);
  EXPECT_NE(message_of([&] { fsdp::LrSchedule(cosine).warmup_steps(10).validate(); }).find("warmup_steps < total_steps"),
            std::string::npos);
  EXPECT_NE(message_of([&] { fsdp::LrSchedule(cosine).min_lr(2e-3).validate(); }).find("min_lr must be in [0, lr]"),
            std::string::npos);
  EXPECT_NE(message_of([&] { fsdp::LrSchedule(cosine).total_steps(0).validate(); }).find("total_steps"),
            std::string::npos);
  EXPECT_NE(message_of([&] { fsdp::LrSchedule().lr(0).validate(); }).find("lr must be positive"), std::string::npos);
  EXPECT_NE(message_of([&] { fsdp::parse_enum<fsdp::LrScheduleKind>("linear"); }).find("unknown learning-rate schedule 'linear': expected one of constant, cosine"),
            std::string::npos);
  EXPECT_STREQ(fsdp::enum_name(fsdp::parse_enum<fsdp::LrScheduleKind>("cosine")), "cosine");
  // A cosine's length and floor are part of it; a constant's are not.
  EXPECT_TRUE(cosine.same_as(fsdp::LrSchedule(cosine)));
  EXPECT_FALSE(cosine.same_as(fsdp::LrSchedule(cosine).total_steps(20)));
  EXPECT_FALSE(cosine.same_as(fsdp::LrSchedule(cosine).min_lr(0)));
  EXPECT_FALSE(cosine.same_as(fsdp::LrSchedule(cosine).warmup_steps(2)));
  const auto constant = fsdp::LrSchedule().lr(1e-3).total_steps(10);
  EXPECT_TRUE(constant.same_as(fsdp::LrSchedule(constant).total_steps(20).min_lr(5e-4)));
  EXPECT_FALSE(constant.same_as(fsdp::LrSchedule(constant).lr(2e-3)));
  EXPECT_FALSE(constant.same_as(fsdp::LrSchedule(cosine).lr(1e-3)));
}
