#include "base/checksum.h"

#include <c10/util/Exception.h>
#include <xxhash.h>

// XXH3's streaming API is stable from xxHash 0.8.0 on.
static_assert(XXH_VERSION_NUMBER >= 800, "xxHash 0.8.0 or newer is needed (Debian: libxxhash-dev)");

namespace fsdp::detail {

const EnumNames& enum_names(EnumTag<checksum::Algorithm>) {
  static const EnumNames names = EnumNames::of<checksum::Algorithm>(
      "checksum algorithm", {{checksum::Algorithm::kFnv1a64, "fnv1a64"}, {checksum::Algorithm::kXxh3_64, "xxh3_64"}});
  return names;
}

}  // namespace fsdp::detail

namespace fsdp::checksum {
namespace {

// The offset our first checkpoints were written with: one digit short of
// FNV's published 14695981039346656037. Kept, or their checksums would not
// match.
constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;
constexpr Algorithm kAlgorithms[] = {Algorithm::kFnv1a64, Algorithm::kXxh3_64};

}  // namespace

Algorithm parse_algorithm(const std::string& name, const std::string& file) {
  std::string known;
  for (Algorithm a : kAlgorithms) {
    if (name == enum_name(a)) return a;
    known += (known.empty() ? "" : ", ") + std::string(enum_name(a));
  }
  TORCH_CHECK(false, "'", file, "' has a checksum by algorithm '", name, "', which this version cannot check (expected ",
              known, ")");
}

Hasher::Hasher(Algorithm algorithm) : algorithm_(algorithm) {
  if (algorithm_ == Algorithm::kFnv1a64) {
    fnv_ = kFnvOffset;
    return;
  }
  xxh3_ = XXH3_createState();
  TORCH_CHECK(xxh3_ && XXH3_64bits_reset(xxh3_) == XXH_OK, "checksum: cannot start an XXH3 hash (out of memory?)");
}

Hasher::~Hasher() { XXH3_freeState(xxh3_); }

void Hasher::update(const void* data, size_t bytes) {
  if (algorithm_ == Algorithm::kXxh3_64) {
    XXH3_64bits_update(xxh3_, data, bytes);
    return;
  }
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) fnv_ = (fnv_ ^ p[i]) * kFnvPrime;
}

uint64_t Hasher::digest() const { return algorithm_ == Algorithm::kXxh3_64 ? XXH3_64bits_digest(xxh3_) : fnv_; }

uint64_t hash(Algorithm algorithm, const void* data, size_t bytes) {
  if (algorithm == Algorithm::kXxh3_64) return XXH3_64bits(data, bytes);
  Hasher hasher(algorithm);
  hasher.update(data, bytes);
  return hasher.digest();
}

}  // namespace fsdp::checksum
