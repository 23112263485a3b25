#pragma once
/// \file
/// Hugging Face chat templates: the Jinja subset that hub templates use,
/// rendered byte for byte as transformers' apply_chat_template(...,
/// tokenize=False) renders them (its sandboxed environment: trim_blocks,
/// lstrip_blocks, {% generation %}, loop controls, tojson, raise_exception,
/// strftime_now). Free of LibTorch (library target fsdp_text).

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::text {

/// A rendered conversation: the text, and the byte ranges [begin, end) of it
/// that the template wrote inside {% generation %} ... {% endgeneration %}
/// (transformers' assistant masks), in order.
struct ChatRendering {
  /// The rendered conversation.
  std::string text;
  /// Byte ranges [begin, end) of `text` written inside {% generation %} blocks.
  std::vector<std::pair<size_t, size_t>> generation_ranges;
};

/// A parsed chat template, ready to render conversations.
class ChatTemplate {
 public:
  /// Parses `source`; `origin` names it in errors (a file name). Throws
  /// std::runtime_error naming origin, line and the construct for anything
  /// outside the supported subset (parse everything up front: an unsupported
  /// statement, filter or test is refused at load, not midway through a dataset).
  ChatTemplate(const std::string& source, const std::string& origin);
  /// The template of a model folder as transformers finds it:
  /// chat_template.jinja; else tokenizer_config.json's "chat_template" (a
  /// string, or a list of {"name","template"} from which "default" is taken);
  /// plus tokenizer_config.json's bos_token, eos_token, unk_token, pad_token
  /// (strings, or objects with "content") as default variables. Throws naming
  /// the folder if it has none.
  static ChatTemplate from_model_folder(const std::string& dir);
  /// Releases the parsed template.
  ~ChatTemplate();
  /// Takes over `other`'s template (`other` is left empty).
  ChatTemplate(ChatTemplate&& other) noexcept;
  /// Takes over `other`'s template (`other` is left empty).
  ChatTemplate& operator=(ChatTemplate&& other) noexcept;
  /// Renders with `variables_json`, a JSON object of the template's variables
  /// ("messages", "add_generation_prompt", "tools", ...); the folder's special
  /// tokens are defaults these override. Throws std::runtime_error naming
  /// origin and line: raise_exception's own message, or an error at render time.
  ChatRendering render(const std::string& variables_json) const;
  /// The name given to the template in errors (a file name).
  const std::string& origin() const;
  /// Whether the template has {% generation %} blocks.
  bool has_generation_markers() const;
  /// The parsed template (defined in the implementation).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::text
