// The C++ side of tests/text/chat_template_reference.py: reads a JSON file of
// cases [{"template": path, "variables": {...}}, ...], renders each with
// fsdp::text::ChatTemplate, and writes [{"text": ..., "ranges": [[b, e], ...]}
// or {"error": ...}, ...] (the parse error where the template is refused).
//   chat_template_check CASES.json RESULTS.json
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fsdp/chat_template.h"

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// One entry per template path: the parsed template, or its parse error.
struct Loaded {
  std::unique_ptr<fsdp::text::ChatTemplate> chat;
  std::string error;
};

nlohmann::json render_case(Loaded& loaded, const nlohmann::ordered_json& variables) {
  nlohmann::json result;
  if (!loaded.chat) {
    result["error"] = loaded.error;
    result["refused_at_load"] = true;
    return result;
  }
  try {
    fsdp::text::ChatRendering r = loaded.chat->render(variables.dump());
    result["text"] = r.text;
    result["ranges"] = nlohmann::json::array();
    for (const auto& [b, e] : r.generation_ranges) result["ranges"].push_back({b, e});
  } catch (const std::exception& e) {
    result["error"] = e.what();
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: chat_template_check CASES.json RESULTS.json\n";
    return 2;
  }
  try {
    // ordered: the templates see the messages' keys in the order given, as Python does
    nlohmann::ordered_json cases = nlohmann::ordered_json::parse(read_all(argv[1]));
    std::map<std::string, Loaded> templates;
    nlohmann::json results = nlohmann::json::array();
    for (const auto& c : cases) {
      std::string path = c.at("template").get<std::string>();
      auto found = templates.find(path);
      if (found == templates.end()) {
        Loaded loaded;
        std::string name = path.substr(path.find_last_of('/') + 1);
        try {
          loaded.chat = std::make_unique<fsdp::text::ChatTemplate>(read_all(path), name);
        } catch (const std::exception& e) {
          loaded.error = e.what();
        }
        found = templates.emplace(path, std::move(loaded)).first;
      }
      results.push_back(render_case(found->second, c.at("variables")));
    }
    std::ofstream(argv[2], std::ios::binary) << results.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const std::exception& e) {
    std::cerr << "chat_template_check: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
