// The families' Hugging Face adapters, listed (hugging_face_adapter.h).

#include "models/hugging_face_adapter.h"

#include <sstream>

namespace fsdp::hugging_face::detail {

const std::vector<const Adapter*>& adapters() {
  static const std::vector<const Adapter*> all{&gpt2_adapter(), &llama_adapter()};
  return all;
}

const Adapter& adapter(models::ModelKind kind) {
  for (const Adapter* a : adapters()) {
    if (a->kind() == kind) return *a;
  }
  TORCH_CHECK(false, "no Hugging Face adapter for the model kind ", fsdp::enum_name(kind));
}

const Adapter* adapter_for_model_type(const std::string& model_type) {
  for (const Adapter* a : adapters()) {
    for (const std::string& type : a->model_types()) {
      if (type == model_type) return a;
    }
  }
  return nullptr;
}

std::string known_model_types() {
  std::vector<std::string> types;
  for (const Adapter* a : adapters()) {
    for (const std::string& type : a->model_types()) types.push_back(type);
  }
  std::string text;
  for (size_t i = 0; i < types.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == types.size() ? " or " : ", ") + types[i];
  }
  return text;
}

void note_ignored_dropout(const nlohmann::json& config, const std::string& path,
                          std::initializer_list<const char*> names, std::vector<std::string>& ignored) {
  for (const char* name : names) {
    const double rate = field<double>(config, path, name, 0.0);
    if (rate != 0.0) {
      std::ostringstream note;
      note << "'" << path << "': \"" << name << "\" " << rate << " is ignored: the model trains without dropout";
      ignored.push_back(note.str());
    }
  }
}

}  // namespace fsdp::hugging_face::detail
