// fsdp-train's text: the tokenizer, the prompt and sample, bits per byte.

#include "train/text.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/strings.h"
#include "fsdp/error.h"

namespace fsdp_train {
namespace {

// Token data (ids), as opposed to raw text read one byte per token.
bool is_token_file(const std::string& path) {
  return fsdp::ends_with(path, ".bin") || fsdp::ends_with(path, ".u32");
}

}  // namespace

void apply_tokenizer(const TrainOptions& o, Run& run) {
  if (o.tokenizer.empty()) return;
  TORCH_CHECK(is_token_file(o.data), "--tokenizer needs --data of token ids that it encoded (a .bin or .u32 file), got ",
              o.data.empty() ? std::string("the built-in corpus, which is raw text") : "'" + o.data + "'",
              ": encode the text first with  fsdp-data encode --tokenizer ", o.tokenizer, " -o DATA.bin TEXT_FILES");
  try {
    run.tokenizer = std::make_shared<const fsdp::text::Tokenizer>(o.tokenizer);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "--tokenizer: ", e.what());
  }
  run.warnings.insert(run.warnings.end(), run.tokenizer->warnings().begin(), run.tokenizer->warnings().end());
}

void apply_chat_template(const TrainOptions& o, Run& run) {
  if (o.chat_template.empty()) return;
  TORCH_CHECK(run.tokenizer, "--chat-template needs --tokenizer: the prompt's rendering is encoded with it");
  try {
    if (std::filesystem::is_directory(o.chat_template)) {
      run.chat_template = std::make_shared<const fsdp::text::ChatTemplate>(
          fsdp::text::ChatTemplate::from_model_folder(o.chat_template));
    } else {
      std::ifstream in(o.chat_template, std::ios::binary);
      TORCH_CHECK(in, "cannot read the file");
      const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      run.chat_template = std::make_shared<const fsdp::text::ChatTemplate>(source, o.chat_template);
    }
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "--chat-template '", o.chat_template, "': ", fsdp::error_message(e));
  }
}

void check_tokenizer_fits(const TrainOptions& o, const Run& run) {
  if (!run.tokenizer) return;
  const int64_t needed = run.tokenizer->vocab_size();
  const int64_t vocab = run.model_config.shape().vocab;
  TORCH_CHECK(vocab >= needed, "the model's vocabulary (", vocab, o.vocab ? ", --vocab" : ", from --init-from",
              ") is smaller than the tokenizer's (", needed, " ids in '", o.tokenizer, "')");
}

std::vector<int64_t> encode_prompt(const Run& run, const std::string& prompt) {
  std::vector<int64_t> tokens;
  if (run.tokenizer) {
    for (uint32_t id : run.tokenizer->encode(prompt)) tokens.push_back(id);
  } else {
    for (unsigned char ch : prompt) tokens.push_back(static_cast<int64_t>(ch) % run.model_config.shape().vocab);
  }
  return tokens;
}

std::vector<int64_t> encode_chat_prompt(const Run& run, const std::string& message) {
  const nlohmann::json variables = {{"messages", {{{"role", "user"}, {"content", message}}}},
                                    {"add_generation_prompt", true}};
  std::vector<int64_t> tokens;
  for (uint32_t id : run.tokenizer->encode(run.chat_template->render(variables.dump()).text)) tokens.push_back(id);
  return tokens;
}

std::string decode_sample(const Run& run, const std::vector<int64_t>& tokens) {
  if (run.tokenizer) {
    std::vector<uint32_t> ids;
    // The model's vocabulary may be larger than the tokenizer's (--vocab):
    // an id past the tokenizer's decodes to nothing.
    for (int64_t t : tokens) {
      if (t < run.tokenizer->vocab_size()) ids.push_back(static_cast<uint32_t>(t));
    }
    return run.tokenizer->decode(ids);
  }
  std::string text;
  if (run.model_config.shape().vocab <= 256) {
    for (int64_t t : tokens) text += static_cast<char>(t);
    return text;
  }
  for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + std::to_string(tokens[i]);
  return text;
}

std::optional<int64_t> validation_bytes(const Run& run, int64_t sequences) {
  if (!run.data) return std::nullopt;  // conversations: the loss is over answers, not every byte
  const bool bytes_are_tokens = !run.tokenizer && !is_token_file(run.data->path());
  if (!run.tokenizer && !bytes_are_tokens) return std::nullopt;
  const torch::Tensor targets = run.data->val_batch(0, sequences).second.contiguous();
  if (bytes_are_tokens) return targets.numel();
  int64_t bytes = 0;
  const int64_t* ids = targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < targets.numel(); ++i) {
    bytes += static_cast<int64_t>(run.tokenizer->token_bytes(static_cast<uint32_t>(ids[i])).size());
  }
  return bytes;
}

double bits_per_byte(double mean_loss, int64_t sequences, int64_t context, int64_t bytes) {
  return mean_loss * static_cast<double>(sequences * context) / std::log(2.0) / static_cast<double>(bytes);
}

}  // namespace fsdp_train
