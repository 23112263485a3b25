// Conversations (fsdp/token_data.h's ConversationData, fsdp/attention.h's
// SequencePacking): the rows packed from encode-chat's files, and a packed
// row's loss and gradients against each conversation's alone.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "fsdp/gpt.h"
#include "fsdp/language_model.h"
#include "fsdp/llama.h"
#include "fsdp/token_data.h"

namespace conversations_test {

using fsdp::SequencePacking;
using fsdp::models::ConversationData;
using fsdp::models::ConversationDataOptions;

struct Conversation {
  std::vector<uint16_t> ids;
  std::vector<uint8_t> mask;
};

// encode-chat's three files under /tmp; returns the token file's path.
std::string write_conversations(const std::string& name, const std::vector<Conversation>& conversations) {
  const std::string path = "/tmp/fsdp_test_" + name + "_" + std::to_string(::getpid()) + ".bin";
  std::ofstream ids(path, std::ios::binary), mask(path + ".mask", std::ios::binary),
      offsets(path + ".conversations", std::ios::binary);
  uint64_t at = 0;
  offsets.write(reinterpret_cast<const char*>(&at), 8);
  for (const Conversation& c : conversations) {
    ids.write(reinterpret_cast<const char*>(c.ids.data()), static_cast<std::streamsize>(2 * c.ids.size()));
    mask.write(reinterpret_cast<const char*>(c.mask.data()), static_cast<std::streamsize>(c.mask.size()));
    at += c.ids.size();
    offsets.write(reinterpret_cast<const char*>(&at), 8);
  }
  return path;
}

void remove_conversations(const std::string& path) {
  for (const char* suffix : {"", ".mask", ".conversations"}) std::remove((path + suffix).c_str());
}

// A conversation of `length` tokens (ids from `first`), its answer the tokens from `answer_from`.
Conversation conversation(int64_t length, int64_t answer_from, uint16_t first) {
  Conversation c;
  for (int64_t i = 0; i < length; ++i) {
    c.ids.push_back(static_cast<uint16_t>((first + 3 * i) % 32));
    c.mask.push_back(i >= answer_from ? 1 : 0);
  }
  return c;
}

TEST(Conversations, RowsArePackedBestFitWithPositionsRestartingAndPromptsIgnored) {
  // Slots (length - 1): 8, 2, 4, 6 and one cut from 20 to context + 1 = 11 tokens (10 slots).
  const std::vector<Conversation> all = {conversation(9, 5, 1), conversation(3, 1, 2), conversation(5, 3, 3),
                                         conversation(7, 6, 4), conversation(20, 2, 5), conversation(4, 9, 6)};
  const std::string path = write_conversations("packing", all);
  ConversationData data(path, 10, 32, ConversationDataOptions().order(fsdp::models::DataOrder::kSequential));
  EXPECT_EQ(data.truncated(), 1);
  EXPECT_EQ(data.skipped(), 1);  // the last: its answer would start past its end
  EXPECT_EQ(data.train_conversations(), 5);
  // Best fit by decreasing slots: [10], [8, 2], [6, 4].
  ASSERT_EQ(data.train_rows(), 3);
  EXPECT_DOUBLE_EQ(data.packing_efficiency(), 30.0 / 30.0);
  const fsdp::models::PackedBatch b = data.batch(0, 0, 0, 1, 1, 3);
  const torch::Tensor expected_positions =
      torch::tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3},
                    torch::kLong)
          .view({3, 10});
  EXPECT_TRUE(torch::equal(b.positions, expected_positions)) << b.positions;
  // Row 1 is conversation 0 (targets 1..8, answers from token 5) then 1 (target 1..2, answers from 1).
  const auto& c0 = all[0];
  for (int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(b.inputs[1][t].item<int64_t>(), c0.ids[t]);
    EXPECT_EQ(b.targets[1][t].item<int64_t>(), t + 1 >= 5 ? c0.ids[t + 1] : -100) << t;
  }
  EXPECT_EQ(b.targets[1][8].item<int64_t>(), all[1].ids[1]);
  // Every target that carries loss, and the global count the trainer divides by.
  EXPECT_EQ(b.loss_targets, b.targets.ne(-100).sum().item<int64_t>());
  EXPECT_EQ(data.global_loss_targets(0, 3), b.loss_targets);
  EXPECT_EQ(data.train_loss_targets(), b.loss_targets);
  // Without packing: one a row, padded; the padding a sequence of its own, with no target.
  ConversationData padded(path, 10, 32, ConversationDataOptions().pack(false));
  EXPECT_EQ(padded.train_rows(), 5);
  EXPECT_DOUBLE_EQ(padded.packing_efficiency(), 30.0 / 50.0);
  remove_conversations(path);
}

TEST(Conversations, ShuffledOrderReadsEveryRowOnceAnEpochAndHoldsOutTheLast) {
  std::vector<Conversation> all;
  for (int i = 0; i < 12; ++i) all.push_back(conversation(4 + i % 5, 2, static_cast<uint16_t>(i)));
  const std::string path = write_conversations("order", all);
  ConversationData data(path, 8, 32, ConversationDataOptions().seed(7).val_fraction(0.25).pack(false));
  EXPECT_EQ(data.train_conversations(), 9);
  EXPECT_EQ(data.val_conversations(), 3);
  std::vector<int64_t> seen;
  for (int64_t step = 0; step < 3; ++step) {
    const torch::Tensor x = data.batch(step, 0, 0, 1, 1, 3).inputs;
    for (int64_t r = 0; r < 3; ++r) seen.push_back(x[r][0].item<int64_t>() * 100 + x[r][1].item<int64_t>());
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end()) << "a row read twice in the first epoch";
  // A blank validation row past the last carries no target.
  EXPECT_EQ(data.val_batch(data.val_rows(), 1).loss_targets, 0);
  remove_conversations(path);
}

TEST(Conversations, InconsistentFilesAndPositionsAreRefused) {
  const std::string path = write_conversations("bad", {conversation(5, 2, 1)});
  { std::ofstream(path + ".mask", std::ios::binary | std::ios::app) << '\1'; }
  EXPECT_THROW(ConversationData(path, 8, 32), c10::Error);
  remove_conversations(path);
  EXPECT_THROW(SequencePacking::from_positions(torch::tensor({{0, 1, 3}}, torch::kLong)), c10::Error);
  EXPECT_THROW(SequencePacking::from_positions(torch::tensor({{1, 2, 3}}, torch::kLong)), c10::Error);
  const auto packing = SequencePacking::from_positions(torch::tensor({{0, 1, 0, 1, 2}}, torch::kLong));
  // Query 3 reads keys 2 and 3 only.
  EXPECT_TRUE(torch::equal(packing.allowed[0][0][3], torch::tensor({false, false, true, true, false})));
}

// Relative distance of two gradients: |a - b| / |b|.
double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

// A packed row's loss and gradients against each conversation's alone,
// both summed over the same answer tokens and divided by their count.
template <class Model>
void expect_packed_equals_alone(Model& model) {
  const std::vector<Conversation> all = {conversation(6, 3, 1), conversation(8, 2, 5), conversation(4, 1, 9)};
  const std::string path = write_conversations("alone", all);
  ConversationData data(path, 20, 32, ConversationDataOptions().order(fsdp::models::DataOrder::kSequential));
  ASSERT_EQ(data.train_rows(), 1);
  const fsdp::models::PackedBatch b = data.batch(0, 0, 0, 1, 1, 1);
  const double divisor = static_cast<double>(b.loss_targets);
  model->zero_grad();
  const torch::Tensor packed = model->forward(b.inputs, b.targets, SequencePacking::from_positions(b.positions), divisor);
  packed.backward();
  std::vector<torch::Tensor> packed_grads;
  for (const auto& p : model->parameters()) packed_grads.push_back(p.grad().clone());
  model->zero_grad();
  torch::Tensor alone = torch::zeros({});
  for (const Conversation& c : all) {
    std::vector<int64_t> x(c.ids.begin(), c.ids.end() - 1), y;
    for (size_t i = 1; i < c.ids.size(); ++i) y.push_back(c.mask[i] ? c.ids[i] : -100);
    const auto T = static_cast<int64_t>(x.size());
    const torch::Tensor loss = model->forward(torch::tensor(x).view({1, T}), torch::tensor(y).view({1, T}),
                                              SequencePacking(), divisor);
    loss.backward();
    alone += loss.detach();
  }
  EXPECT_LE(std::abs(packed.item<double>() - alone.item<double>()), 1e-6 * alone.item<double>());
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_LE(relative(packed_grads[i], params[i].grad()), 1e-6) << i;
  remove_conversations(path);
}

// The loss over a global batch's targets: the summed cross-entropy over a
// divisor, in the sliced path too (a hub vocabulary's rows always take it).
TEST(Conversations, LossDividedByTheGlobalCountInBothPaths) {
  torch::manual_seed(5);
  for (int64_t rows : {int64_t{64}, int64_t{5000}}) {  // 5000 rows of 4096 logits: three slices of 2048
    const torch::Tensor hidden = torch::randn({rows, 8}, torch::requires_grad());
    const torch::Tensor weight = torch::randn({4096, 8}, torch::requires_grad());
    torch::Tensor targets = torch::randint(0, 4096, {rows}, torch::kLong);
    targets.index_put_({torch::arange(0, rows, 3)}, -100);
    const double divisor = 12345.0;
    const torch::Tensor loss = fsdp::models::next_token_loss(hidden, weight, targets, divisor);
    loss.backward();
    const torch::Tensor grad_hidden = hidden.grad().clone(), grad_weight = weight.grad().clone();
    hidden.mutable_grad().reset();
    weight.mutable_grad().reset();
    namespace F = torch::nn::functional;
    const torch::Tensor expected = F::cross_entropy(F::linear(hidden, weight), targets,
                                                    F::CrossEntropyFuncOptions().reduction(torch::kSum)) / divisor;
    expected.backward();
    EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-6 * expected.item<double>()) << rows;
    EXPECT_LE(relative(grad_hidden, hidden.grad()), 1e-5) << rows;
    EXPECT_LE(relative(grad_weight, weight.grad()), 1e-5) << rows;
  }
  // Every target ignored: 0, not the mean's NaN.
  const torch::Tensor none = torch::full({6}, -100, torch::kLong);
  EXPECT_EQ(fsdp::models::next_token_loss(torch::randn({6, 8}), torch::randn({32, 8}), none, 3.0).item<double>(), 0.0);
}

TEST(Conversations, PackedLossAndGradientsEqualEachConversationAlone) {
  for (auto kernel : {fsdp::AttentionKernel::kWrittenOut, fsdp::AttentionKernel::kAuto}) {
    fsdp::models::LlamaConfig c;
    c.vocab = 32, c.context = 20, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.width = 16, c.hidden = 40;
    c.attention = kernel;
    torch::manual_seed(3);
    fsdp::models::Llama llama(c);
    llama->init_weights(3);
    expect_packed_equals_alone(llama);
    fsdp::models::GPTConfig g;
    g.vocab = 32, g.context = 20, g.layers = 2, g.heads = 4, g.width = 16;
    g.attention = kernel;
    fsdp::models::GPT gpt(g);
    gpt->init_weights(3);
    expect_packed_equals_alone(gpt);
  }
}

}  // namespace conversations_test
