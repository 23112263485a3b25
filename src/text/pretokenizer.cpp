#include "text/pretokenizer.h"

#include <oniguruma.h>

#include <mutex>
#include <stdexcept>

namespace fsdp::text {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

void initialize_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

// One region per thread, reused: a search allocates nothing.
OnigRegion* thread_region() {
  thread_local std::unique_ptr<OnigRegion, void (*)(OnigRegion*)> region(
      onig_region_new(), [](OnigRegion* r) { onig_region_free(r, 1); });
  return region.get();
}

}  // namespace

Regex::Regex(const std::string& pattern) {
  initialize_oniguruma();
  OnigErrorInfo info;
  regex_t* compiled = nullptr;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&compiled, begin, begin + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_DEFAULT, &info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &info);
    throw std::runtime_error("cannot compile the regex '" + pattern + "': " + reinterpret_cast<char*>(message));
  }
  regex_ = compiled;
}

Regex::~Regex() {
  if (regex_) onig_free(static_cast<regex_t*>(regex_));
}

bool Regex::search(std::string_view text, size_t from, size_t& begin, size_t& end) const {
  OnigRegion* region = thread_region();
  const auto* start = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* stop = start + text.size();
  const int rc = onig_search(static_cast<regex_t*>(regex_), start, stop, start + from, stop, region, ONIG_OPTION_NONE);
  if (rc < 0) return false;  // ONIG_MISMATCH (or an error: treated as no match)
  begin = static_cast<size_t>(region->beg[0]);
  end = static_cast<size_t>(region->end[0]);
  return true;
}

void PreTokenizer::add_split(const std::string& pattern) {
  steps_.push_back(Step{std::make_shared<Regex>(pattern), false});
}

void PreTokenizer::add_byte_level(bool add_prefix_space, bool use_regex) {
  steps_.push_back(Step{use_regex ? std::make_shared<Regex>(kGpt2Pattern) : nullptr, add_prefix_space});
}

void PreTokenizer::for_each_piece(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  if (!text.empty()) apply(0, text, emit);
}

void PreTokenizer::apply(size_t step, std::string_view piece, const std::function<void(std::string_view)>& emit) const {
  if (step == steps_.size()) {
    emit(piece);
    return;
  }
  const Step& s = steps_[step];
  std::string prefixed;
  if (s.add_prefix_space && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  if (!s.regex) {
    apply(step + 1, piece, emit);
    return;
  }
  size_t position = 0, from = 0, begin = 0, end = 0;
  while (from < piece.size() && s.regex->search(piece, from, begin, end)) {
    if (end == begin) {  // an empty match splits nothing: search again one character on
      from = begin + 1;
      while (from < piece.size() && (static_cast<unsigned char>(piece[from]) & 0xC0) == 0x80) ++from;
      continue;
    }
    if (begin > position) apply(step + 1, piece.substr(position, begin - position), emit);
    apply(step + 1, piece.substr(begin, end - begin), emit);
    position = from = end;
  }
  if (position < piece.size()) apply(step + 1, piece.substr(position), emit);
}

}  // namespace fsdp::text
