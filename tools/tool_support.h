// What every fsdp-cpp tool does alike at its edges (docs/debugging.md,
// "Errors and exit statuses"):
//   - one table of exit statuses;
//   - CLI11's parse errors mapped onto it (CLI11's own codes are 100-120);
//   - numbers checked finite and in range, by the option's name;
//   - a file it reads refused by name unless it is a regular file;
//   - a file it writes made under a temporary name and renamed once whole,
//     so that an error leaves nothing behind.
// Header only, without LibTorch: fsdp-data includes it too.
#pragma once

#include <CLI/CLI.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

namespace fsdp_tools {

/// This process's peak resident set so far, in bytes (getrusage's ru_maxrss).
inline int64_t peak_rss_bytes() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// The exit statuses of every tool.
enum ExitStatus : int {
  kExitOk = 0,      // done; also --help
  kExitError = 1,   // bad input (an option, a file, a folder: the message names it), or an error while running
  kExitPreempted = 75,  // fsdp-train, and fsdp-run passing it on: stopped by SIGTERM/SIGUSR1, a checkpoint saved
  kExitPreemptedUnsaved = 76,  // the same without --ckpt-dir: nothing saved
};

// CLI11 reads a whole number beyond 64 bits as the largest int64 (strtoll's
// saturation, unchecked): such a value is refused here instead, by the
// option's name. No option of the tools takes one.
inline void check_integers_fit(const CLI::App& app) {
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& text : option->results()) {
      const size_t start = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
      if (text.size() == start || text.find_first_not_of("0123456789", start) != std::string::npos) continue;
      errno = 0;
      (void)std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) {
        throw CLI::ValidationError(option->get_name(), "expected a number that fits in 64 bits, got " + text);
      }
    }
  }
  for (const CLI::App* subcommand : app.get_subcommands()) check_integers_fit(*subcommand);
}

// The status of a command line CLI11 refused (printed, when `print`), or of --help.
inline int parse_error_status(CLI::App& app, const CLI::ParseError& e, bool print = true) {
  if (print) app.exit(e);
  return e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success) ? kExitOk : kExitError;
}

// Parses the command line: nothing when the tool goes on, else the status
// to exit with (CLI11_PARSE, with this table's statuses).
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    check_integers_fit(app);
  } catch (const CLI::ParseError& e) {
    return parse_error_status(app, e);
  }
  return std::nullopt;
}

namespace detail {
// A check of a number an option was given; `accept` says whether it passes.
template <typename Accept>
CLI::Validator number_check(const std::string& wanted, Accept accept) {
  return CLI::Validator(
      [wanted, accept](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "expected a number, got '" + text + "'";
        if (!std::isfinite(value) || !accept(value)) return "expected " + wanted + ", got " + text;
        return std::string();
      },
      wanted);
}
}  // namespace detail

// ->check(fsdp_tools::positive()): a finite number above 0. (CLI11 itself
// refuses a value that does not fit the option's type, by the option's name.)
inline CLI::Validator positive() {
  return detail::number_check("a positive number", [](double v) { return v > 0; });
}
// ->check(fsdp_tools::non_negative()): a finite number, 0 or more.
inline CLI::Validator non_negative() {
  return detail::number_check("a number >= 0", [](double v) { return v >= 0; });
}

// Throws unless `path` is a regular file (or a link to one): a directory, a
// device or a missing path where a file is read, named as `what` names it.
inline void require_regular_file(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (status.type() == fs::file_type::not_found) throw std::runtime_error(what + " '" + path + "' does not exist");
  if (error) throw std::runtime_error(what + " '" + path + "': " + error.message());
  if (fs::is_directory(status)) throw std::runtime_error(what + " '" + path + "' is a directory, expected a file");
  if (!fs::is_regular_file(status)) throw std::runtime_error(what + " '" + path + "' is not a regular file");
}

// A file written whole or not at all: the stream writes `path`.tmp-PID
// beside it; commit() flushes it and renames it to `path`. Destroyed
// uncommitted (an error on the way), it removes the temporary file, and
// `path` is as it was.
class OutputFile {
 public:
  OutputFile(std::string path, std::ios::openmode mode = std::ios::binary)
      : path_(std::move(path)), temporary_(path_ + ".tmp-" + std::to_string(::getpid())) {
    if (std::filesystem::is_directory(path_)) {
      throw std::runtime_error("the output '" + path_ + "' is a directory, expected a file name");
    }
    stream_.open(temporary_, mode | std::ios::out | std::ios::trunc);
    if (!stream_) throw std::runtime_error("cannot write '" + path_ + "': " + std::strerror(errno));
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile() {
    if (committed_) return;
    stream_.close();
    std::remove(temporary_.c_str());
  }
  std::ofstream& stream() { return stream_; }
  const std::string& path() const { return path_; }
  void commit() {
    stream_.flush();
    const bool written = static_cast<bool>(stream_);
    stream_.close();
    if (!written || stream_.fail()) throw std::runtime_error("cannot write '" + path_ + "': " + std::strerror(errno));
    if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
      throw std::runtime_error("cannot rename '" + temporary_ + "' to '" + path_ + "': " + std::strerror(errno));
    }
    committed_ = true;
  }

 private:
  std::string path_, temporary_;
  std::ofstream stream_;
  bool committed_ = false;
};

}  // namespace fsdp_tools
