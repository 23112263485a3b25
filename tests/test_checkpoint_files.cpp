// The files a checkpoint is made of (single process): safetensors written
// and read back, malformed files refused with the reason; checksums (XXH3
// against xxHash itself, FNV-1a in files from before it, unknown algorithms
// refused); full weights loaded with their names and shapes checked.

#include <gtest/gtest.h>

#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "fsdp/checkpoint.h"
#include "base/checksum.h"
#include "fsdp/gpt.h"
#include "fsdp/safetensors.h"
#include "fsdp/state_dict.h"
#include "state_dict/checkpoint_json.h"
#include "test_helpers.h"
#include "state_dict/safetensors_metadata.h"
#include "core/unit_plan.h"

// tests/fixtures/ of this checkout (fixtures_path.cpp).
const char* fsdp_test_fixtures();

using fsdp::models::GPTConfig;
using fsdp::models::GPT;
using fsdp::testing::le64;
using fsdp::testing::message_of;
using fsdp::testing::read_bytes;
using fsdp::testing::tiny;
using fsdp::testing::write_bytes;

TEST(Safetensors, WritesStandardFilesAndReadsThemBack) {
  const std::string path = "/tmp/fsdp_test_rt.safetensors";
  torch::Tensor a = torch::randn({3, 4}), b = torch::arange(5, torch::kLong);
  {
    fsdp::safetensors::Writer writer(path, {{"a", torch::kFloat, {3, 4}}, {"b", torch::kLong, {5}}}, {{"k", "v"}});
    writer.write(a);
    EXPECT_THROW(writer.write(a), c10::Error);  // b comes next, with another shape
    writer.write(b);
    writer.commit();
  }
  fsdp::safetensors::Reader reader(path);
  EXPECT_EQ(reader.tensors().size(), 2u);
  EXPECT_EQ(reader.metadata().at("k"), "v");
  EXPECT_TRUE(torch::equal(reader.read("a"), a));
  EXPECT_TRUE(torch::equal(reader.read("b"), b));
  // The header is the standard JSON, data aligned to 8 bytes.
  std::ifstream in(path, std::ios::binary);
  std::string file((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(file.find(R"("a":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]})"), std::string::npos);
  EXPECT_EQ((file.size() - 48 - 40) % 8, 0u);
}

TEST(Safetensors, AnUncommittedWriterLeavesNothingBehind) {
  const std::string path = "/tmp/fsdp_test_partial.safetensors";
  std::remove(path.c_str());
  {
    fsdp::safetensors::Writer writer(path, {{"a", torch::kFloat, {2}}, {"b", torch::kFloat, {2}}});
    writer.write(torch::zeros({2}));
    EXPECT_THROW(writer.commit(), c10::Error);  // b is missing
  }
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
}

TEST(Safetensors, MalformedFilesAreRefusedWithTheReason) {
  const std::string path = "/tmp/fsdp_test_bad.safetensors";
  auto reason = [&](const std::string& bytes) {
    write_bytes(path, bytes);
    return message_of([&] { fsdp::safetensors::Reader r(path); });
  };
  auto file = [](const std::string& header, size_t data_bytes) {
    return le64(header.size()) + header + std::string(data_bytes, '\0');
  };
  EXPECT_NE(reason("abc").find("shorter than the 8-byte header length"), std::string::npos);
  EXPECT_NE(reason(le64(1ull << 40) + "{}").find("does not fit the file"), std::string::npos);
  EXPECT_NE(reason(file("{not json", 0)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(reason(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})", 8)).find("outside the data section"),
            std::string::npos);
  EXPECT_NE(reason(file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)).find("need 3 x 4 bytes"),
            std::string::npos);
  EXPECT_NE(reason(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12))
                .find("overlap"),
            std::string::npos);
  EXPECT_NE(reason(file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", 8))
                .find("absurdly large"),
            std::string::npos);
  EXPECT_NE(reason(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)).find("hole of 4 bytes"),
            std::string::npos);
  EXPECT_NE(reason(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8)).find("4 bytes after its last tensor"),
            std::string::npos);
  EXPECT_NE(reason(file(R"({"a":{"dtype":"X9","shape":[2],"data_offsets":[0,8]}})", 8)).find("unsupported dtype 'X9'"),
            std::string::npos);
  EXPECT_NE(reason(file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)).find("non-negative"),
            std::string::npos);
}

TEST(Checksum, KnownAnswersAndEverySplitGivesTheSameDigest) {
  using fsdp::checksum::Algorithm;
  // FNV-1a as our old files carry it: from the offset 1469598103934665603,
  // not the published 14695981039346656037 (one digit fewer), so these are
  // not the published vectors but what files written before XXH3 hold.
  EXPECT_EQ(fsdp::checksum::hash(Algorithm::kFnv1a64, "", 0), 1469598103934665603ull);
  EXPECT_EQ(fsdp::checksum::hash(Algorithm::kFnv1a64, "foobar", 6), 9870438755804841970ull);
  // XXH3-64 against xxHash's own one-shot function.
  std::string bytes(100003, '\0');
  std::mt19937 random(7);
  for (auto& b : bytes) b = static_cast<char>(random());
  EXPECT_EQ(fsdp::checksum::hash(Algorithm::kXxh3_64, "", 0), XXH3_64bits("", 0));
  EXPECT_EQ(fsdp::checksum::hash(Algorithm::kXxh3_64, bytes.data(), bytes.size()), XXH3_64bits(bytes.data(), bytes.size()));
  for (Algorithm a : {Algorithm::kFnv1a64, Algorithm::kXxh3_64}) {
    fsdp::checksum::Hasher hasher(a);
    size_t at = 0;
    for (size_t piece : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{65536}}) {
      hasher.update(bytes.data() + at, piece);
      at += piece;
    }
    hasher.update(bytes.data() + at, bytes.size() - at);
    EXPECT_EQ(hasher.digest(), fsdp::checksum::hash(a, bytes.data(), bytes.size())) << fsdp::enum_name(a);
    EXPECT_EQ(fsdp::checksum::parse_algorithm(fsdp::enum_name(a), "f"), a);
  }
  EXPECT_EQ(std::string(fsdp::enum_name(fsdp::checksum::kWritten)), "xxh3_64");
  EXPECT_EQ(std::string(fsdp::enum_name(fsdp::checksum::kUnnamed)), "fnv1a64");
}

// The writer streams through 8 MiB blocks, hashing one while the one before
// is written: a file of several blocks, split mid-tensor, with a partial
// last block, must carry XXH3-64 of exactly its bytes.
TEST(Checksum, WrittenFilesCarryXxh3OfEveryByteAndNameIt) {
  const std::string path = "/tmp/fsdp_test_xxh3.safetensors";
  const torch::Tensor a = torch::randn({(20 << 20) / 4 + 3}), b = torch::arange(7, torch::kLong);
  fsdp::safetensors::Writer writer(path, {{"a", torch::kFloat, {a.numel()}}, {"b", torch::kLong, {7}}}, {{"k", "v"}});
  writer.write(a);
  writer.write(b);
  writer.commit();
  const fsdp::safetensors::Reader reader(path);
  EXPECT_EQ(reader.metadata().at(fsdp::safetensors::kChecksumAlgorithmKey), "xxh3_64");
  EXPECT_EQ(reader.checksum_algorithm(), fsdp::checksum::Algorithm::kXxh3_64);
  EXPECT_EQ(reader.metadata().at("k"), "v");
  // xxHash's own XXH3-64 of the file as it lies on disk, the stored digits read as zeros.
  std::string file = read_bytes(path);
  const std::string key = std::string("\"") + fsdp::safetensors::kChecksumKey + "\":\"";
  file.replace(file.find(key) + key.size(), 16, std::string(16, '0'));
  EXPECT_EQ(reader.stored_checksum(), XXH3_64bits(file.data(), file.size()));
  EXPECT_EQ(writer.checksum(), reader.stored_checksum());
  EXPECT_NO_THROW(reader.verify_checksum());
  EXPECT_TRUE(torch::equal(reader.read("a"), a));
  EXPECT_TRUE(torch::equal(reader.read("b"), b));
  torch::Tensor part = torch::empty({5});
  reader.read_into("a", a.numel() - 5, part);
  EXPECT_TRUE(torch::equal(part, a.narrow(0, a.numel() - 5, 5)));
  // A changed byte is found in the first, a middle and the last (partial) block.
  const std::string original = read_bytes(path);
  for (const size_t at : {size_t{300}, size_t{9} << 20, original.size() - 3}) {
    std::string changed = original;
    changed[at] ^= 0x20;
    write_bytes(path, changed);
    EXPECT_NE(message_of([&] { fsdp::safetensors::Reader(path).verify_checksum(); }).find("' is corrupt"),
              std::string::npos)
        << "a change at byte " << at << " was not found";
  }
}

// tests/fixtures/checkpoint-fnv1a64: written before checksums named their
// algorithm (FNV-1a everywhere, named nowhere).
TEST(Checksum, CheckpointsFromBeforeXxh3StayReadableAndVerifiable) {
  namespace fs = std::filesystem;
  const fs::path fixture = fs::path(fsdp_test_fixtures()) / "checkpoint-fnv1a64" / "step-2";
  nlohmann::json meta = nlohmann::json::parse(read_bytes((fixture / "metadata.json").string()));
  ASSERT_FALSE(meta.contains("checksum_algorithm")) << "the fixture must stay as written before XXH3";
  fsdp::SavedCheckpoint saved(fixture.string());  // every file verified
  ASSERT_EQ(saved.file_names().size(), 3u);
  std::vector<torch::Tensor> shards;
  for (const auto& name : saved.file_names()) {
    const fsdp::safetensors::Reader reader((fixture / name).string());
    EXPECT_FALSE(reader.metadata().count(fsdp::safetensors::kChecksumAlgorithmKey));
    EXPECT_EQ(reader.checksum_algorithm(), fsdp::checksum::Algorithm::kFnv1a64);
    EXPECT_NO_THROW(reader.verify_checksum());
    shards.push_back(reader.read("u1.exp_avg"));
  }
  const int64_t numel = saved.metadata().json.at("units").at(1).at("numel").get<int64_t>();
  torch::Tensor state = torch::empty({numel});
  saved.read_range(1, "exp_avg", 0, numel, state);
  EXPECT_TRUE(torch::equal(state, torch::cat(shards).narrow(0, 0, numel)));

  // Changed bytes are still found, by FNV-1a.
  const fs::path copy = "/tmp/fsdp_test_fnv1a64/step-2";
  auto fresh_copy = [&] {
    fs::remove_all(copy.parent_path());
    fs::create_directories(copy.parent_path());
    fs::copy(fixture, copy, fs::copy_options::recursive);
  };
  fresh_copy();
  std::string shard = read_bytes((copy / "shard-1.safetensors").string());
  shard[shard.size() - 100] ^= 0x20;
  write_bytes((copy / "shard-1.safetensors").string(), shard);
  EXPECT_NE(message_of([&] { fsdp::SavedCheckpoint s(copy.string()); }).find("shard-1.safetensors' is corrupt"),
            std::string::npos);
  fresh_copy();
  meta["step"] = 3;  // the checksum left as it was
  write_bytes((copy / "metadata.json").string(), meta.dump(2));
  EXPECT_NE(message_of([&] { fsdp::SavedCheckpoint s(copy.string()); }).find("metadata.json' is corrupt"),
            std::string::npos);
}

TEST(Checksum, AnUnknownAlgorithmIsRefusedNamingTheFileAndTheAlgorithms) {
  namespace fs = std::filesystem;
  const std::string expected = "which this version cannot check (expected fnv1a64, xxh3_64)";
  // A safetensors file naming another algorithm (of the same length: the header's offsets stay valid).
  const std::string path = "/tmp/fsdp_test_algorithm.safetensors";
  {
    fsdp::safetensors::Writer writer(path, {{"a", torch::kFloat, {2}}});
    writer.write(torch::ones({2}));
    writer.commit();
  }
  std::string file = read_bytes(path);
  file.replace(file.find("\"xxh3_64\""), 9, "\"xxh9_99\"");
  write_bytes(path, file);
  std::string message = message_of([&] { fsdp::safetensors::Reader r(path); });
  EXPECT_NE(message.find("'" + path + "' has a checksum by algorithm 'xxh9_99', " + expected), std::string::npos)
      << message;
  // A metadata.json naming one, or naming it other than by a string.
  const fs::path copy = "/tmp/fsdp_test_algorithm/step-2";
  fs::remove_all(copy.parent_path());
  fs::create_directories(copy.parent_path());
  fs::copy(fs::path(fsdp_test_fixtures()) / "checkpoint-fnv1a64" / "step-2", copy, fs::copy_options::recursive);
  nlohmann::json meta = nlohmann::json::parse(read_bytes((copy / "metadata.json").string()));
  meta["checksum_algorithm"] = "sha256";
  write_bytes((copy / "metadata.json").string(), meta.dump(2));
  message = message_of([&] { fsdp::SavedCheckpoint s(copy.string()); });
  EXPECT_NE(message.find("'" + (copy / "metadata.json").string() + "' has a checksum by algorithm 'sha256', " + expected),
            std::string::npos)
      << message;
  meta["checksum_algorithm"] = 64;
  write_bytes((copy / "metadata.json").string(), meta.dump(2));
  message = message_of([&] { fsdp::SavedCheckpoint s(copy.string()); });
  EXPECT_NE(message.find("checksum_algorithm must be a string"), std::string::npos) << message;
}

TEST(FullWeights, LoadChecksNamesShapesAndExtras) {
  GPTConfig c = GPTConfig::preset("tiny");
  GPT source(c);
  source->init_weights(5);
  auto params = fsdp::unique_named_parameters(*source);
  auto save = [&](const std::string& path, const std::function<void(std::vector<fsdp::safetensors::TensorSpec>&,
                                                                      std::vector<torch::Tensor>&)>& edit) {
    std::vector<fsdp::safetensors::TensorSpec> specs;
    std::vector<torch::Tensor> values;
    for (const auto& [name, p] : params) {
      specs.push_back({name, torch::kFloat, p.sizes().vec()});
      values.push_back(p.detach());
    }
    edit(specs, values);
    fsdp::safetensors::Writer w(path, specs);
    for (const auto& v : values) w.write(v);
    w.commit();
  };
  const std::string path = "/tmp/fsdp_test_weights.safetensors";
  save(path, [](auto&, auto&) {});
  GPT target(c);
  target->init_weights(6);
  fsdp::load_full_weights(*target, path);
  EXPECT_TRUE(torch::equal(target->transformer->h[1]->as<fsdp::models::BlockImpl>()->mlp->c_fc->weight,
                           source->transformer->h[1]->as<fsdp::models::BlockImpl>()->mlp->c_fc->weight));

  save(path, [](auto& specs, auto& values) {
    specs.erase(specs.begin() + 3);
    values.erase(values.begin() + 3);
  });
  GPT fresh(c);
  fresh->init_weights(6);
  torch::Tensor before = fresh->transformer->wte->weight.clone();
  std::string msg = message_of([&] { fsdp::load_full_weights(*fresh, path); });
  EXPECT_NE(msg.find("has no tensor '" + params[3].first + "'"), std::string::npos) << msg;
  EXPECT_TRUE(torch::equal(fresh->transformer->wte->weight, before)) << "a failed load changed the model";

  save(path, [](auto& specs, auto& values) {
    specs[1].shape = {1, specs[1].shape[0] * specs[1].shape[1]};
    values[1] = values[1].reshape(specs[1].shape);
  });
  msg = message_of([&] { fsdp::load_full_weights(*fresh, path); });
  EXPECT_NE(msg.find("tensor 'transformer.wpe.weight' has shape [1, 2048], expected [32, 64]"), std::string::npos) << msg;

  save(path, [](auto& specs, auto& values) {
    specs.push_back({"extra.weight", torch::kFloat, {2}});
    values.push_back(torch::zeros({2}));
  });
  msg = message_of([&] { fsdp::load_full_weights(*fresh, path); });
  EXPECT_NE(msg.find("has a tensor 'extra.weight' that the model does not have"), std::string::npos) << msg;
}
