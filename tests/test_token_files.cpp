// TokenData reads fsdp-data's .u32 token files (little-endian uint32, no
// header) as it reads .bin (uint16): the same ids give the same batches.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "fsdp/token_data.h"
#include "test_helpers.h"

namespace {

std::string token_file_path(const std::string& name) { return "/tmp/fsdp_test_token_files_" + name; }

void token_files_write(const std::string& path, const std::vector<uint32_t>& ids, int width) {
  std::string bytes;
  for (const uint32_t id : ids) {
    for (int k = 0; k < width; ++k) bytes += static_cast<char>((id >> (8 * k)) & 0xFF);
  }
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string token_files_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(TokenFiles, U32ReadsTheSameBatchesAsBin) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 500; ++i) ids.push_back((i * 7919u) % 60000u);
  token_files_write(token_file_path("a.bin"), ids, 2);
  token_files_write(token_file_path("a.u32"), ids, 4);
  const auto options = fsdp::models::TokenDataOptions().order(fsdp::models::DataOrder::kShuffled).val_fraction(0.2);
  fsdp::models::TokenData bin(token_file_path("a.bin"), 16, 60000, options);
  fsdp::models::TokenData u32(token_file_path("a.u32"), 16, 60000, options);
  EXPECT_EQ(u32.size(), 500);
  for (int64_t step = 0; step < 3; ++step) {
    const auto [x16, y16] = bin.batch(step, 0, 0, 1, 1, 4);
    const auto [x32, y32] = u32.batch(step, 0, 0, 1, 1, 4);
    EXPECT_TRUE(torch::equal(x16, x32));
    EXPECT_TRUE(torch::equal(y16, y32));
  }
  EXPECT_TRUE(torch::equal(bin.val_batch(0, 2).first, u32.val_batch(0, 2).first));
}

TEST(TokenFiles, U32HoldsIdsBeyondUint16AndChecksThem) {
  std::vector<uint32_t> ids(100, 7);
  ids[42] = 150000;
  token_files_write(token_file_path("big.u32"), ids, 4);
  fsdp::models::TokenData data(token_file_path("big.u32"), 8, 150001);
  EXPECT_EQ(data.size(), 100);
  EXPECT_NE(token_files_message([] { fsdp::models::TokenData(token_file_path("big.u32"), 8, 128000); })
                .find("token id 150000 at position 42, outside the vocabulary of 128000"),
            std::string::npos);
  std::ofstream(token_file_path("ragged.u32"), std::ios::binary) << std::string(102, '\0');
  EXPECT_NE(token_files_message([] { fsdp::models::TokenData(token_file_path("ragged.u32"), 8, 1000); })
                .find("not a multiple of 4"),
            std::string::npos);
}

}  // namespace
