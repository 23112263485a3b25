#pragma once
// fsdp-data's conversation subcommands: encode-chat and render-chat
// (fsdp/chat_encoding.h does the work; this is their command line).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}

namespace fsdp_data {

struct ChatOptions {
  std::string model;          // --model: a folder with tokenizer.json and the chat template
  std::string chat_template;  // --chat-template FILE: instead of the folder's
  std::string output;         // encode-chat -o: NAME.bin or NAME.u32
  std::vector<std::string> train_on{"assistant"};
  int64_t context = 0;                // --context: the longest conversation, context + 1 tokens (0: any)
  std::string too_long = "truncate";  // --too-long: truncate or drop
  bool add_generation_prompt = false, ids = false, quiet = false;
  std::vector<std::string> files;
};

// The encode-chat and render-chat subcommands of `app`, their flags into `o`.
std::pair<CLI::App*, CLI::App*> add_chat_subcommands(CLI::App& app, ChatOptions& o);
// encode-chat: the token file, its .mask and .conversations, and a report
// in .chat.json (fsdp/token_data.h's ConversationData reads them).
int encode_chat(const ChatOptions& o);
// render-chat: each conversation as the template renders it, or with --ids
// a JSON line of its ids and loss mask.
int render_chat(const ChatOptions& o);

}  // namespace fsdp_data
