#pragma once
/// \file
/// Conversations made into training tokens: a JSON line in any of the three
/// shapes people bring, rendered with the model's own chat template
/// (fsdp/chat_template.h), tokenized, and a loss mask over the tokens of the
/// messages trained on (the answers by default). Free of LibTorch (fsdp_text).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/chat_template.h"
#include "fsdp/tokenizer.h"

namespace fsdp::text {

/// One conversation rendered and tokenized (encode_conversation).
struct EncodedConversation {
  std::string text;                ///< the template's rendering
  std::vector<uint32_t> ids;       ///< its tokens (Tokenizer::encode: the template writes the special tokens)
  std::vector<uint8_t> loss_mask;  ///< per token: 1 where it belongs to a message trained on
};

/// The conversation of one JSON line as {"messages": [...]}, from any of:
/// {"messages": [{"role", "content"}, ...]} (the other fields kept, e.g.
/// "tools"); {"prompt", "completion"} (strings: a user and an assistant
/// message; or lists of messages, as TRL's conversational prompt-completion);
/// alpaca's {"instruction", "input", "output"} (the user's message is the
/// instruction, then a blank line and the input when it is not empty).
/// Throws std::invalid_argument saying what is wrong: not JSON, none of the
/// shapes, a message that is no object or has no string "role", no message.
std::string conversation_json(const std::string& line);

/// Renders `conversation` (conversation_json's) with `chat_template`,
/// tokenizes the text with `tokenizer`, and marks the tokens of each message
/// whose role is in `train_on`. Where the template marks its answers with
/// {% generation %} blocks and `train_on` is {"assistant"}, the marked text is
/// what those blocks wrote (transformers' return_assistant_tokens_mask).
/// Otherwise a message's text runs from where the
/// conversation's prefix before it ends (rendered with the generation prompt
/// for an assistant message, so that the header is not trained on) to where
/// its own turn ends, the end-of-turn token included, as the whole
/// conversation renders it. Where the template renders a last turn with
/// more at its start than it renders the same turn later followed (Qwen3's
/// empty think block), the turn is the part both end with. A token is
/// marked if any of its bytes is in a marked text (as transformers'
/// assistant masks mark tokens). Throws std::invalid_argument naming the
/// message where a prefix does not render as the start of the whole (the
/// template rewrites earlier turns), where the turn's text cannot be found,
/// or where no message is trained on; std::runtime_error from the template
/// (raise_exception, a render error).
EncodedConversation encode_conversation(const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                                        const std::string& conversation, const std::vector<std::string>& train_on);

/// The token that ends an answer as `chat_template` writes it (Qwen's
/// <|im_end|>, Llama 3's <|eot_id|>): the first token of what it renders
/// after an assistant message's content. What generation stops at. Nothing
/// where the template writes nothing after an answer.
std::optional<uint32_t> answer_end_token(const ChatTemplate& chat_template, const Tokenizer& tokenizer);

}  // namespace fsdp::text
