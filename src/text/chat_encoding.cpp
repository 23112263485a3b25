// Conversations made into training tokens (fsdp/chat_encoding.h): the three
// input shapes, the template's rendering of each prefix, and the tokens of
// the messages trained on.

#include "fsdp/chat_encoding.h"

#include <algorithm>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace fsdp::text {
namespace {

using nlohmann::json;

// A "prompt" or "completion" field: a string is one message of `role`, a
// list is messages as they are (TRL's conversational prompt-completion).
json messages_of(const json& field, const char* name, const char* role) {
  if (field.is_string()) return json::array({{{"role", role}, {"content", field}}});
  if (field.is_array()) return field;
  throw std::invalid_argument(std::string("\"") + name + "\" must be a string or a list of messages, got " +
                              field.type_name());
}

json alpaca_messages(const json& line) {
  for (const char* key : {"instruction", "output"}) {
    if (!line[key].is_string()) throw std::invalid_argument(std::string("alpaca's \"") + key + "\" must be a string");
  }
  std::string user = line["instruction"].get<std::string>();
  if (line.contains("input")) {
    if (!line["input"].is_string()) throw std::invalid_argument("alpaca's \"input\" must be a string");
    if (!line["input"].get<std::string>().empty()) user += "\n\n" + line["input"].get<std::string>();
  }
  return json::array({{{"role", "user"}, {"content", user}}, {{"role", "assistant"}, {"content", line["output"]}}});
}

void check_messages(const json& messages) {
  if (!messages.is_array() || messages.empty()) {
    throw std::invalid_argument("\"messages\" must be a non-empty list of messages");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) throw std::invalid_argument("message " + std::to_string(i) + " is no object");
    if (!m.contains("role") || !m["role"].is_string() || m["role"].get<std::string>().empty()) {
      throw std::invalid_argument("message " + std::to_string(i) + " has no \"role\" (a non-empty string)");
    }
  }
}

// The template's variables: the conversation's fields, its first
// `count` messages, and whether to end with the generation prompt.
std::string variables(const json& conversation, size_t count, bool generation_prompt) {
  json v = conversation;
  const json& all = conversation["messages"];
  v["messages"] = json(std::vector<json>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(count)));
  v["add_generation_prompt"] = generation_prompt;
  return v.dump();
}

// The last 16 bytes of a message's text, reasoning (up to a "</think>")
// and surrounding whitespace left out: what any template writes of it.
std::string content_ending(const json& message) {
  if (!message.contains("content") || !message["content"].is_string()) return "";
  std::string text = message["content"];
  const size_t reasoning = text.rfind("</think>");
  if (reasoning != std::string::npos) text = text.substr(reasoning + 8);
  const size_t first = text.find_first_not_of(" \t\r\n"), last = text.find_last_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  text = text.substr(first, last - first + 1);
  return text.size() > 16 ? text.substr(text.size() - 16) : text;
}

// Where message i's turn lies in `whole` (the conversation's rendering):
// [start, end) bytes.
std::pair<size_t, size_t> turn_bytes(const ChatTemplate& chat_template, const json& conversation, size_t i,
                                     const std::string& whole) {
  const json& message = conversation["messages"][i];
  const bool answer = message["role"] == "assistant";
  const std::string before = chat_template.render(variables(conversation, i, answer)).text;
  if (whole.compare(0, before.size(), before) != 0) {
    throw std::invalid_argument("message " + std::to_string(i) + ": the conversation before it does not render as "
                                "the start of the whole conversation (the template rewrites earlier turns)");
  }
  const std::string upto = chat_template.render(variables(conversation, i + 1, false)).text;
  if (upto.compare(0, before.size(), before) != 0) {
    throw std::invalid_argument("message " + std::to_string(i) + ": the conversation up to it does not start as "
                                "the one before it renders");
  }
  // The turn as the template renders it last; in `whole`, the longest part
  // of it that ends it (a last turn may carry more at its start), holding
  // the end of the message's text (so that a stray "\n" in common is not
  // taken for the turn).
  const std::string_view last(upto.data() + before.size(), upto.size() - before.size());
  const std::string_view rest(whole.data() + before.size(), whole.size() - before.size());
  if (last.empty()) {
    throw std::invalid_argument("message " + std::to_string(i) + ": the template renders nothing for it");
  }
  const std::string ending = content_ending(message);
  for (size_t k = std::min(last.size(), rest.size()); k > 0; --k) {
    if (rest.substr(0, k) != last.substr(last.size() - k)) continue;
    if (rest.substr(0, k).find(ending) == std::string_view::npos) break;
    return {before.size(), before.size() + k};
  }
  throw std::invalid_argument("message " + std::to_string(i) + ": its turn, as the template renders it last, is not "
                              "found where it starts in the whole conversation");
}

// Each token's first byte in `text` (and the end), from the bytes the tokens
// spell; a SentencePiece-style tokenizer's "▁" prepended at the start is the
// one difference allowed.
std::vector<size_t> token_offsets(const Tokenizer& tokenizer, const std::vector<uint32_t>& ids,
                                  const std::string& text) {
  std::vector<size_t> offsets{0};
  std::string spelled;
  for (uint32_t id : ids) {
    spelled += tokenizer.token_bytes(id);
    offsets.push_back(spelled.size());
  }
  size_t shift = 0;
  if (spelled != text) {
    if (spelled.size() == text.size() + 1 && spelled[0] == ' ' && spelled.compare(1, text.size(), text) == 0) {
      shift = 1;
    } else {
      throw std::invalid_argument("the tokens of the rendered text do not spell it back (the tokenizer's normalizer "
                                  "changes it), so the trained messages' tokens cannot be found");
    }
  }
  for (size_t& o : offsets) o = o > shift ? o - shift : 0;
  return offsets;
}

}  // namespace

std::string conversation_json(const std::string& line) {
  json parsed;
  try {
    parsed = json::parse(line);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(std::string("not JSON: ") + e.what());
  }
  if (!parsed.is_object()) throw std::invalid_argument(std::string("expected a JSON object, got ") + parsed.type_name());
  json conversation = parsed;
  if (parsed.contains("messages")) {
    // as it is
  } else if (parsed.contains("prompt") && parsed.contains("completion")) {
    json messages = messages_of(parsed["prompt"], "prompt", "user");
    for (const json& m : messages_of(parsed["completion"], "completion", "assistant")) messages.push_back(m);
    conversation.erase("prompt");
    conversation.erase("completion");
    conversation["messages"] = messages;
  } else if (parsed.contains("instruction") && parsed.contains("output")) {
    conversation = {{"messages", alpaca_messages(parsed)}};
  } else {
    throw std::invalid_argument("expected \"messages\", \"prompt\" and \"completion\", or alpaca's \"instruction\", "
                                "\"input\" and \"output\"");
  }
  check_messages(conversation["messages"]);
  return conversation.dump();
}

EncodedConversation encode_conversation(const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                                        const std::string& conversation_text,
                                        const std::vector<std::string>& train_on) {
  json conversation;
  try {
    conversation = json::parse(conversation_text);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(std::string("the conversation is not JSON: ") + e.what());
  }
  if (!conversation.is_object() || !conversation.contains("messages")) {
    throw std::invalid_argument("expected a conversation as conversation_json gives it: {\"messages\": [...]}");
  }
  check_messages(conversation["messages"]);
  const size_t n = conversation["messages"].size();
  EncodedConversation encoded;
  const ChatRendering rendering = chat_template.render(variables(conversation, n, false));
  encoded.text = rendering.text;
  encoded.ids = tokenizer.encode(encoded.text);
  std::vector<char> marked(encoded.text.size(), 0);
  bool any = false;
  // The template's own {% generation %} blocks mark the answers, as transformers' assistant masks read them.
  const bool answers_by_markers =
      chat_template.has_generation_markers() && train_on == std::vector<std::string>{"assistant"};
  for (const auto& [start, end] : answers_by_markers ? rendering.generation_ranges
                                                     : std::vector<std::pair<size_t, size_t>>()) {
    std::fill(marked.begin() + static_cast<std::ptrdiff_t>(start), marked.begin() + static_cast<std::ptrdiff_t>(end), 1);
  }
  for (size_t i = 0; i < n && !answers_by_markers; ++i) {
    const std::string role = conversation["messages"][i]["role"];
    if (std::find(train_on.begin(), train_on.end(), role) == train_on.end()) continue;
    any = true;
    const auto [start, end] = turn_bytes(chat_template, conversation, i, encoded.text);
    std::fill(marked.begin() + static_cast<std::ptrdiff_t>(start), marked.begin() + static_cast<std::ptrdiff_t>(end), 1);
  }
  if (answers_by_markers) {
    for (const json& m : conversation["messages"]) any = any || m["role"] == "assistant";
  }
  if (!any) throw std::invalid_argument("no message has a role trained on (" + json(train_on).dump() + ")");
  const std::vector<size_t> offsets = token_offsets(tokenizer, encoded.ids, encoded.text);
  encoded.loss_mask.assign(encoded.ids.size(), 0);
  for (size_t t = 0; t < encoded.ids.size(); ++t) {
    encoded.loss_mask[t] = std::any_of(marked.begin() + static_cast<std::ptrdiff_t>(offsets[t]),
                                       marked.begin() + static_cast<std::ptrdiff_t>(offsets[t + 1]),
                                       [](char c) { return c != 0; });
  }
  return encoded;
}

std::optional<uint32_t> answer_end_token(const ChatTemplate& chat_template, const Tokenizer& tokenizer) {
  const std::string marker = "\x01answer\x01";
  const json conversation = {{"messages", json::array({{{"role", "user"}, {"content", "question"}},
                                                       {{"role", "assistant"}, {"content", marker}}})}};
  const std::string text = chat_template.render(variables(conversation, 2, false)).text;
  const size_t at = text.rfind(marker);
  if (at == std::string::npos || at + marker.size() == text.size()) return std::nullopt;
  const std::vector<uint32_t> after = tokenizer.encode(text.substr(at + marker.size()));
  if (after.empty()) return std::nullopt;
  return after.front();
}

}  // namespace fsdp::text
