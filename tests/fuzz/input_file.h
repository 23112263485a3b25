// A fuzz target's input as a file, for the readers that take a path: one
// file per process under TMPDIR (run.sh gives each target its own; several
// fuzzers may run at once), rewritten for each input, removed at exit.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace fsdp_fuzz {

class InputFile {
 public:
  // `name`: the file's name, which the process id prefixes.
  explicit InputFile(const std::string& name) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/" + std::to_string(::getpid()) + "_" + name;
  }
  ~InputFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }
  // Writes the input; a failure is the harness's, not the library's: abort.
  void write(const uint8_t* data, size_t size) const {
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
      std::perror(path_.c_str());
      std::abort();
    }
  }

 private:
  std::string path_;
};

}  // namespace fsdp_fuzz
