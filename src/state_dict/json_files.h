#pragma once
// JSON and text files of the folders the library writes and reads beside
// its weights (Hugging Face's config.json, PEFT's adapter_config.json).

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/file_io.h"

namespace fsdp {

// A JSON file, parsed; throws naming the file.
inline nlohmann::json read_json_file(const std::string& path) {
  file_io::require_regular_file(path);  // a named pipe would block the open; a directory read as bad JSON
  std::ifstream in(path);
  TORCH_CHECK(in, "cannot open '", path, "' for reading");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", path, "' is not valid JSON: ", e.what());
    throw;
  }
}

// `text` as the file `path`, through a temporary file renamed into place:
// a reader never sees half of it.
inline void write_text_file(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path temp = path.string() + ".tmp";
  {
    std::ofstream out(temp, std::ios::trunc);
    TORCH_CHECK(out, "cannot open '", temp.string(), "' for writing");
    out << text;
    out.flush();
    TORCH_CHECK(out, "writing '", temp.string(), "' failed");
  }
  std::filesystem::rename(temp, path);
}

}  // namespace fsdp
