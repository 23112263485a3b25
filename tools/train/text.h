#pragma once
// fsdp-train's text: --tokenizer (the vocabulary, the prompt encoded, the
// sample decoded) and the bytes behind the validation tokens, which turn the
// validation loss into bits per byte, so that runs with different
// tokenizers (or none: one token per byte) compare.

#include <optional>
#include <string>
#include <vector>

#include "train/setup.h"

namespace fsdp_train {

// --tokenizer: loads it into run.tokenizer and takes the model's vocabulary
// from it unless --vocab gives one. Refuses data that is not token ids (a
// .bin or .u32 file fsdp-data encode wrote).
void apply_tokenizer(const TrainOptions& o, Run& run);
// --prompt as a user's message rendered with --chat-template's generation prompt, encoded.
std::vector<int64_t> encode_chat_prompt(const Run& run, const std::string& message);
// --chat-template: the template read (a folder's, or a file), before training.
void apply_chat_template(const TrainOptions& o, Run& run);

// Once the model's shape is final (--init-from's config.json may set the
// vocabulary): refuses a model whose vocabulary cannot hold every id of the
// tokenizer.
void check_tokenizer_fits(const TrainOptions& o, const Run& run);

// The prompt's token ids: the tokenizer's, or one per byte without one.
std::vector<int64_t> encode_prompt(const Run& run, const std::string& prompt);

// The generated tokens as the text they stand for (with a tokenizer, or
// byte-level data), else the ids separated by spaces.
std::string decode_sample(const Run& run, const std::vector<int64_t>& tokens);

// The bytes of text the targets of the first `sequences` validation
// sequences stand for; none when the data's tokens have no known bytes (a
// .bin without --tokenizer).
std::optional<int64_t> validation_bytes(const Run& run, int64_t sequences);

// The mean validation loss (nats per token over `sequences` sequences of the
// run's context) in bits per byte of the text those tokens encode.
double bits_per_byte(double mean_loss, int64_t sequences, int64_t context, int64_t bytes);

}  // namespace fsdp_train
