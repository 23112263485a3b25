// fsdp-data encode-chat and render-chat: JSON lines of conversations through
// the model's chat template and tokenizer (fsdp/chat_encoding.h), into the
// files fsdp-train's --data reads as conversations, or onto the terminal.

#include "fsdp_data_chat.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "base/strings.h"
#include "fsdp/chat_encoding.h"
#include "tool_support.h"

namespace fsdp_data {
namespace {

using fsdp::text::ChatTemplate;
using fsdp::text::Tokenizer;

ChatTemplate load_template(const ChatOptions& o) {
  if (o.chat_template.empty()) return ChatTemplate::from_model_folder(o.model);
  std::ifstream in(o.chat_template, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read --chat-template '" + o.chat_template + "'");
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ChatTemplate(source, o.chat_template);
}

Tokenizer load_tokenizer(const ChatOptions& o) {
  const std::string path = (std::filesystem::path(o.model) / "tokenizer.json").string();
  fsdp_tools::require_regular_file(path, "the model's tokenizer.json");
  return Tokenizer(path);
}

// Calls visit(conversation_json, where) for each non-blank line of the
// files; an error in a line is rethrown naming the file and the line.
template <class Visit>
void for_each_conversation(const std::vector<std::string>& files, Visit visit) {
  for (const std::string& file : files) {
    fsdp_tools::require_regular_file(file, "the conversations file");
    std::ifstream in(file, std::ios::binary);
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = file + ":" + std::to_string(number);
      try {
        visit(fsdp::text::conversation_json(line), where);
      } catch (const std::exception& e) {
        throw std::runtime_error(where + ": " + e.what());
      }
    }
  }
}

void append_le(std::string& out, uint64_t value, int width) {
  for (int k = 0; k < width; ++k) out += static_cast<char>((value >> (8 * k)) & 0xFF);
}

struct EncodeCounts {
  int64_t conversations = 0, truncated = 0, dropped_too_long = 0, dropped_no_answer = 0, tokens = 0,
          answer_tokens = 0;
};

// Applies --context and --too-long to one conversation; false: leave it out.
bool fit_to_context(const ChatOptions& o, fsdp::text::EncodedConversation& c, EncodeCounts& counts) {
  const auto limit = static_cast<size_t>(o.context + 1);
  if (o.context > 0 && c.ids.size() > limit) {
    if (o.too_long == "drop") {
      ++counts.dropped_too_long;
      return false;
    }
    c.ids.resize(limit);
    c.loss_mask.resize(limit);
    ++counts.truncated;
  }
  // The first token is no target: a conversation needs a marked token after it.
  if (c.ids.size() < 2 || std::count(c.loss_mask.begin() + 1, c.loss_mask.end(), 1) == 0) {
    ++counts.dropped_no_answer;
    return false;
  }
  return true;
}

void write_report(const ChatOptions& o, const ChatTemplate& chat_template, const EncodeCounts& counts) {
  fsdp_tools::OutputFile report(o.output + ".chat.json");
  report.stream() << nlohmann::json{{"format", "fsdp-chat-1"},
                                    {"model", o.model},
                                    {"chat_template", chat_template.origin()},
                                    {"train_on", o.train_on},
                                    {"context", o.context},
                                    {"too_long", o.too_long},
                                    {"conversations", counts.conversations},
                                    {"tokens", counts.tokens},
                                    {"answer_tokens", counts.answer_tokens},
                                    {"truncated", counts.truncated},
                                    {"dropped_too_long", counts.dropped_too_long},
                                    {"dropped_without_answer", counts.dropped_no_answer}}
                            .dump(2)
                     << "\n";
  report.commit();
}

}  // namespace

int encode_chat(const ChatOptions& o) {
  if (o.too_long != "truncate" && o.too_long != "drop") {
    throw std::runtime_error("--too-long: expected truncate or drop, got '" + o.too_long + "'");
  }
  const int width = fsdp::ends_with(o.output, ".bin") ? 2 : fsdp::ends_with(o.output, ".u32") ? 4 : 0;
  if (width == 0) throw std::runtime_error("-o '" + o.output + "': expected NAME.bin (uint16 ids) or NAME.u32 (uint32)");
  const ChatTemplate chat_template = load_template(o);
  const Tokenizer tokenizer = load_tokenizer(o);
  if (width == 2 && tokenizer.vocab_size() > 65536) {
    throw std::runtime_error("the vocabulary of " + std::to_string(tokenizer.vocab_size()) +
                             " tokens does not fit a .bin (uint16 ids): write a .u32 file instead");
  }
  fsdp_tools::OutputFile tokens(o.output), mask(o.output + ".mask"), offsets(o.output + ".conversations");
  std::string bytes;
  append_le(bytes, 0, 8);
  offsets.stream().write(bytes.data(), 8);
  EncodeCounts counts;
  for_each_conversation(o.files, [&](const std::string& conversation, const std::string&) {
    auto encoded = fsdp::text::encode_conversation(chat_template, tokenizer, conversation, o.train_on);
    if (!fit_to_context(o, encoded, counts)) return;
    bytes.clear();
    for (uint32_t id : encoded.ids) append_le(bytes, id, width);
    tokens.stream().write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    mask.stream().write(reinterpret_cast<const char*>(encoded.loss_mask.data()),
                        static_cast<std::streamsize>(encoded.loss_mask.size()));
    counts.tokens += static_cast<int64_t>(encoded.ids.size());
    counts.answer_tokens += std::count(encoded.loss_mask.begin() + 1, encoded.loss_mask.end(), 1);
    ++counts.conversations;
    bytes.clear();
    append_le(bytes, static_cast<uint64_t>(counts.tokens), 8);
    offsets.stream().write(bytes.data(), 8);
  });
  if (counts.conversations == 0) {
    throw std::runtime_error("no conversation to write: " + std::to_string(counts.dropped_too_long) +
                             " dropped as longer than --context " + std::to_string(o.context) + ", " +
                             std::to_string(counts.dropped_no_answer) + " without an answer token (--train-on " +
                             nlohmann::json(o.train_on).dump() + ")");
  }
  tokens.commit();
  mask.commit();
  offsets.commit();
  write_report(o, chat_template, counts);
  if (!o.quiet) {
    std::cerr << "fsdp-data encode-chat: " << counts.conversations << " conversations, " << counts.tokens
              << " tokens, " << counts.answer_tokens << " of them answer tokens (trained on: "
              << nlohmann::json(o.train_on).dump() << "); " << counts.truncated << " truncated and "
              << counts.dropped_too_long << " dropped at --context " << o.context << ", "
              << counts.dropped_no_answer << " dropped without an answer token; template " << chat_template.origin()
              << "\n";
  }
  return 0;
}

int render_chat(const ChatOptions& o) {
  const ChatTemplate chat_template = load_template(o);
  std::optional<Tokenizer> tokenizer;
  if (o.ids) tokenizer.emplace(load_tokenizer(o));
  for_each_conversation(o.files, [&](const std::string& conversation, const std::string&) {
    if (!o.ids) {
      nlohmann::json variables = nlohmann::json::parse(conversation);
      variables["add_generation_prompt"] = o.add_generation_prompt;
      std::cout << chat_template.render(variables.dump()).text << "\n";
      return;
    }
    const auto encoded = fsdp::text::encode_conversation(chat_template, *tokenizer, conversation, o.train_on);
    std::cout << nlohmann::json{{"ids", encoded.ids}, {"loss_mask", encoded.loss_mask}}.dump() << "\n";
  });
  return 0;
}

std::pair<CLI::App*, CLI::App*> add_chat_subcommands(CLI::App& app, ChatOptions& o) {
  auto* enc_chat = app.add_subcommand("encode-chat",
                                      "render JSON lines of conversations with the model's chat template into a token "
                                      "file, its loss mask (.mask) and conversation offsets (.conversations)");
  auto* render = app.add_subcommand("render-chat", "print each conversation as the model's chat template renders it");
  for (auto* sub : {enc_chat, render}) {
    sub->add_option("--model", o.model, "a model folder: tokenizer.json and chat_template.jinja or "
                                         "tokenizer_config.json's chat_template")->required();
    sub->add_option("--chat-template", o.chat_template, "a Jinja chat template file to use instead of the folder's");
    sub->add_option("--train-on", o.train_on, "the roles whose messages carry loss")->delimiter(',')
        ->capture_default_str();
    sub->add_option("files", o.files, "JSON lines: {\"messages\": [...]}, {\"prompt\", \"completion\"} or "
                                       "alpaca's {\"instruction\", \"input\", \"output\"}")->required();
  }
  enc_chat->add_option("-o,--output", o.output, "token file: NAME.bin (uint16) or NAME.u32 (uint32)")->required();
  enc_chat->add_option("--context", o.context, "conversations longer than context + 1 tokens are cut or dropped "
                                                "(0: none)")->check(fsdp_tools::non_negative())->capture_default_str();
  enc_chat->add_option("--too-long", o.too_long, "truncate or drop")->capture_default_str();
  enc_chat->add_flag("-q,--quiet", o.quiet, "no counts on stderr");
  render->add_flag("--add-generation-prompt", o.add_generation_prompt,
                   "end with the template's generation prompt (the start of an answer)");
  render->add_flag("--ids", o.ids, "print one JSON line a conversation: its ids and loss mask, as encode-chat "
                                    "writes them");
  return {enc_chat, render};
}

}  // namespace fsdp_data
