// fsdp::text::ChatTemplate: a parsed Jinja chat template and the model
// folder lookup transformers does (see fsdp/chat_template.h).
#include "fsdp/chat_template.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "text/jinja_ast.h"
#include "text/jinja_eval.h"

namespace fsdp::text {

struct ChatTemplate::Impl {
  std::string origin;
  jinja::Body body;
  bool has_generation = false;
  jinja::Dict defaults;  // a model folder's special tokens
};

ChatTemplate::ChatTemplate(const std::string& source, const std::string& origin) : impl_(std::make_unique<Impl>()) {
  impl_->origin = origin;
  impl_->body = jinja::parse_template(source, origin, impl_->has_generation);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

const std::string& ChatTemplate::origin() const { return impl_->origin; }
bool ChatTemplate::has_generation_markers() const { return impl_->has_generation; }

namespace {

bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  out = buffer.str();
  return true;
}

// tokenizer_config.json's "chat_template": a string, or named templates of
// which transformers takes "default".
bool template_from_config(const nlohmann::ordered_json& config, std::string& source) {
  auto found = config.find("chat_template");
  if (found == config.end() || found->is_null()) return false;
  if (found->is_string()) {
    source = found->get<std::string>();
    return true;
  }
  if (found->is_array())
    for (const auto& entry : *found)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        source = entry["template"].get<std::string>();
        return true;
      }
  return false;
}

}  // namespace

ChatTemplate ChatTemplate::from_model_folder(const std::string& dir) {
  std::string config_text, source, origin;
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (read_file(dir + "/tokenizer_config.json", config_text)) {
    try {
      config = nlohmann::ordered_json::parse(config_text);
    } catch (const std::exception& e) {
      throw std::runtime_error(dir + "/tokenizer_config.json: not JSON: " + e.what());
    }
  }
  if (read_file(dir + "/chat_template.jinja", source)) {
    origin = dir + "/chat_template.jinja";
  } else if (config.is_object() && template_from_config(config, source)) {
    origin = dir + "/tokenizer_config.json";
  } else {
    throw std::runtime_error(dir + ": no chat template (expected chat_template.jinja, or \"chat_template\" in "
                             "tokenizer_config.json)");
  }
  ChatTemplate chat(source, origin);
  for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (!config.is_object() || !config.contains(name)) continue;
    const auto& token = config[name];
    if (token.is_string()) chat.impl_->defaults.set(jinja::Value::from(name), jinja::Value::from(token.get<std::string>()));
    else if (token.is_object() && token.contains("content") && token["content"].is_string())
      chat.impl_->defaults.set(jinja::Value::from(name), jinja::Value::from(token["content"].get<std::string>()));
  }
  return chat;
}

ChatRendering ChatTemplate::render(const std::string& variables_json) const {
  nlohmann::ordered_json variables;
  try {
    variables = nlohmann::ordered_json::parse(variables_json);
  } catch (const std::exception& e) {
    throw std::runtime_error(impl_->origin + ": the variables are not JSON: " + e.what());
  }
  if (!variables.is_object())
    throw std::runtime_error(impl_->origin + ": expected the variables as a JSON object, found " +
                             std::string(variables.type_name()));
  jinja::Dict all = impl_->defaults;
  jinja::Value given;
  try {
    given = jinja::from_json(variables);
  } catch (const std::exception& e) {
    throw std::runtime_error(impl_->origin + ": the variables: " + e.what());
  }
  for (const auto& [key, value] : given.dict->items) all.set(key, value);
  jinja::RenderOutput out = jinja::render(impl_->body, all, impl_->origin);
  return ChatRendering{std::move(out.text), std::move(out.generation_ranges)};
}

}  // namespace fsdp::text
