// Wrap policies (single process): which modules become units, planned
// bottom up, the root keeping what no unit took.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fsdp/wrap_policy.h"
#include "test_helpers.h"
#include "core/unit_plan.h"



TEST(WrapPolicy, SizePolicyWrapsBottomUpAndRootKeepsTheRest) {
  torch::nn::ModuleList net(torch::nn::Linear(10, 10),                                      // 110
                            torch::nn::ModuleList(torch::nn::Linear(10, 20), torch::nn::Linear(20, 10)),  // 220 + 210
                            torch::nn::Linear(10, 1));                                       // 11
  auto plans = fsdp::plan_units(*net, fsdp::min_params_policy(200));
  std::vector<std::string> names;
  for (const auto& p : plans) names.push_back(p.name);
  // 1.0 (220) and 1.1 (210) become units; "1" then has nothing left.
  EXPECT_EQ(names, (std::vector<std::string>{"", "1.0", "1.1"}));
  std::vector<std::string> root_params;
  for (const auto& [name, t] : plans[0].params) root_params.push_back(name);
  EXPECT_EQ(root_params, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));

  auto by_type = fsdp::plan_units(*net, fsdp::module_type_policy<torch::nn::ModuleListImpl>());
  ASSERT_EQ(by_type.size(), 2u);
  EXPECT_EQ(by_type[1].name, "1");
  EXPECT_EQ(by_type[1].params.size(), 4u);
}
