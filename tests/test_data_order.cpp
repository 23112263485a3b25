// The data order of the spec (single process): sequential and shuffled
// training sequences start where the spec says for every step, micro-step,
// rank and row; validation comes from the held-out tail; bad splits and bad
// data files are refused with the reason.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "fsdp/token_data.h"
#include "test_helpers.h"

using fsdp::testing::message_of;
using fsdp::testing::write_bytes;

TEST(DataOrder, SequencesStartWhereTheSpecSays) {
  // Tokens 0, 1, 2, ... (mod 256): a sequence's first input token is its start.
  const std::string path = "/tmp/fsdp_test_counting.txt";
  std::string bytes;
  for (int i = 0; i < 1000; ++i) bytes.push_back(static_cast<char>(i % 256));
  write_bytes(path, bytes);
  const int64_t T = 8, n = 1000, B = 2, W = 3, A = 2;
  fsdp::models::TokenData data(path, T, 256);
  const int64_t G = B * W * A;
  for (int64_t s : {0, 1, 7, 50}) {
    for (int64_t m = 0; m < A; ++m) {
      for (int64_t r = 0; r < W; ++r) {
        auto [x, y] = data.batch(s, m, r, W, A, B);
        for (int64_t b = 0; b < B; ++b) {
          int64_t j = (m * W + r) * B + b;
          int64_t start = ((s * G + j) * T) % (n - T - 1);
          EXPECT_EQ(x[b][0].item<int64_t>(), start % 256) << "s " << s << " m " << m << " r " << r << " b " << b;
          EXPECT_EQ(y[b][T - 1].item<int64_t>(), (start + T) % 256);
        }
      }
    }
  }
}

namespace {

// The spec's splitmix64, written out again here so that the library's copy
// is checked against the spec rather than against itself.
uint64_t spec_splitmix64(uint64_t z) {
  z = z + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

TEST(DataOrder, ShuffledSequencesStartWhereTheSpecSays) {
  // Tokens 0, 1, 2, ... (mod 251, prime so that a start is readable from
  // the first two tokens' values only up to 251): n = 5000, 10% held out.
  const std::string path = "/tmp/fsdp_test_counting_shuffled.txt";
  const int64_t T = 8, n = 5000, B = 2, W = 3, A = 2;
  std::string bytes;
  for (int64_t i = 0; i < n; ++i) bytes.push_back(static_cast<char>(i % 251));
  write_bytes(path, bytes);
  EXPECT_EQ(spec_splitmix64(0), 0xE220A8397B1DCDAFULL);  // the published first output of seed 0
  for (uint64_t d : {0ULL, 1ULL, 7ULL}) {
    fsdp::models::TokenData data(
        path, T, 256,
        fsdp::models::TokenDataOptions().order(fsdp::models::DataOrder::kShuffled).seed(d).val_fraction(0.1));
    const int64_t n_train = n - 500, G = B * W * A;
    ASSERT_EQ(data.train_size(), n_train);
    for (int64_t s : {0, 1, 7, 50, 123456789}) {
      for (int64_t m = 0; m < A; ++m) {
        for (int64_t r = 0; r < W; ++r) {
          auto [x, y] = data.batch(s, m, r, W, A, B);
          for (int64_t b = 0; b < B; ++b) {
            const int64_t j = (m * W + r) * B + b;
            const uint64_t k = static_cast<uint64_t>(s * G + j);
            const int64_t start = static_cast<int64_t>(spec_splitmix64(k + d * 0x100000000ULL) %
                                                       static_cast<uint64_t>(n_train - T - 1));
            EXPECT_EQ(data.train_start(s, j, G), start);
            EXPECT_EQ(x[b][0].item<int64_t>(), start % 251) << "d " << d << " s " << s << " m " << m << " r " << r;
            EXPECT_EQ(y[b][T - 1].item<int64_t>(), (start + T) % 251);
          }
        }
      }
    }
  }
}

TEST(DataOrder, ValidationSequencesComeFromTheHeldOutTail) {
  const std::string path = "/tmp/fsdp_test_counting_val.txt";
  const int64_t T = 8, n = 1003;
  std::string bytes;
  for (int64_t i = 0; i < n; ++i) bytes.push_back(static_cast<char>(i % 251));
  write_bytes(path, bytes);
  fsdp::models::TokenData data(path, T, 256, fsdp::models::TokenDataOptions().val_fraction(0.1));
  const int64_t n_val = 101, n_train = n - n_val;  // ceil(100.3)
  ASSERT_EQ(data.val_size(), n_val);
  auto [x, y] = data.val_batch(3, 20);
  for (int64_t i = 3; i < 23; ++i) {
    const int64_t start = n_train + (i * T) % (n_val - T - 1);
    EXPECT_EQ(x[i - 3][0].item<int64_t>(), start % 251) << "i " << i;
    EXPECT_EQ(y[i - 3][T - 1].item<int64_t>(), (start + T) % 251) << "i " << i;
  }
  // Training never reads the tail: the last token of any training target is before it.
  for (int64_t s = 0; s < 200; ++s) {
    EXPECT_LT(data.train_start(s, 0, 4) + T, n_train);
  }
}

TEST(DataOrder, BadValidationSplitsAreRefused) {
  write_bytes("/tmp/fsdp_test_val.txt", std::string(100, 'a'));
  auto with_fraction = [](double f) {
    return message_of([f] {
      fsdp::models::TokenData("/tmp/fsdp_test_val.txt", 8, 256, fsdp::models::TokenDataOptions().val_fraction(f));
    });
  };
  EXPECT_NE(with_fraction(1.0).find("must be in [0, 1), got 1"), std::string::npos);
  EXPECT_NE(with_fraction(-0.1).find("must be in [0, 1), got -0.1"), std::string::npos);
  // ceil(0.05 * 100) = 5 tokens held out, fewer than context + 2 = 10.
  EXPECT_NE(with_fraction(0.05).find("holds out 5 of its 100 tokens, too few for one validation sequence: need at "
                                     "least context + 2 = 10"),
            std::string::npos)
      << with_fraction(0.05);
  EXPECT_EQ(with_fraction(0.1), "<no error>");
  EXPECT_NE(message_of([] { fsdp::models::TokenData("/tmp/fsdp_test_val.txt", 8, 256).val_batch(0, 1); })
                .find("no validation split"),
            std::string::npos);
  EXPECT_NE(message_of([] { fsdp::parse_enum<fsdp::models::DataOrder>("random"); })
                .find("unknown data order 'random': expected one of sequential, shuffled"),
            std::string::npos);
}

TEST(DataOrder, BadDataFilesAreRefused) {
  write_bytes("/tmp/fsdp_test_short.txt", "too short");
  EXPECT_NE(message_of([] { fsdp::models::TokenData("/tmp/fsdp_test_short.txt", 32, 256); })
                .find("holds 9 tokens, too few for one training sequence"),
            std::string::npos);
  write_bytes("/tmp/fsdp_test_odd.bin", std::string(101, '\1'));
  EXPECT_NE(message_of([] { fsdp::models::TokenData("/tmp/fsdp_test_odd.bin", 8, 1000); }).find("odd size"),
            std::string::npos);
  std::string tokens;
  for (int i = 0; i < 100; ++i) tokens += std::string("\x10\x27", 2);  // 10000
  write_bytes("/tmp/fsdp_test_big.bin", tokens);
  EXPECT_NE(message_of([] { fsdp::models::TokenData("/tmp/fsdp_test_big.bin", 8, 256); })
                .find("token id 10000 at position 0, outside the vocabulary of 256"),
            std::string::npos);
  EXPECT_NO_THROW(fsdp::models::TokenData("/tmp/fsdp_test_big.bin", 8, 10001));
  EXPECT_NE(message_of([] { fsdp::models::TokenData("/nonexistent/file", 8, 256); }).find("cannot open"),
            std::string::npos);
}
