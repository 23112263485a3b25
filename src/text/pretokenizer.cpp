#include "text/pretokenizer.h"

#include <oniguruma.h>

#include <algorithm>
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

// One match parameter per thread, reused; each search sets its Regex's bounds on it.
OnigMatchParam* thread_match_param() {
  thread_local std::unique_ptr<OnigMatchParam, void (*)(OnigMatchParam*)> param(
      [] {
        OnigMatchParam* p = onig_new_match_param();
        onig_initialize_match_param(p);
        return p;
      }(),
      onig_free_match_param);
  return param.get();
}

}  // namespace

Regex::Regex(const std::string& pattern, unsigned long steps_per_match, unsigned long steps_per_search)
    : pattern_(pattern), steps_per_match_(steps_per_match), steps_per_search_(steps_per_search) {
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
  OnigMatchParam* bound = thread_match_param();
  onig_set_retry_limit_in_match_of_match_param(bound, steps_per_match_);
  onig_set_retry_limit_in_search_of_match_param(bound, steps_per_search_);
  const auto* start = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* stop = start + text.size();
  const int rc = onig_search_with_param(static_cast<regex_t*>(regex_), start, stop, start + from, stop, region,
                                        ONIG_OPTION_NONE, bound);
  if (rc == ONIG_MISMATCH) return false;
  if (rc < 0) {
    const bool bounded = rc == ONIGERR_RETRY_LIMIT_IN_MATCH_OVER || rc == ONIGERR_RETRY_LIMIT_IN_SEARCH_OVER;
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc);
    throw std::runtime_error(
        "the regex '" + pattern_ + "' " +
        (bounded ? "backtracks catastrophically: it gave up after " +
                       std::to_string(rc == ONIGERR_RETRY_LIMIT_IN_MATCH_OVER ? steps_per_match_ : steps_per_search_) +
                       " steps on a text of " + std::to_string(text.size()) +
                       " bytes (nested quantifiers such as (a+)+ or (a|a)* try every way to split the text: "
                       "expected a pattern without them)"
                 : std::string("failed: ") + reinterpret_cast<char*>(message)));
  }
  begin = static_cast<size_t>(region->beg[0]);
  end = static_cast<size_t>(region->end[0]);
  return true;
}

bool Regex::found_in(std::string_view text) const {
  size_t begin = 0, end = 0;
  return search(text, 0, begin, end);
}

void PreTokenizer::add_split(const std::string& pattern) {
  Step step;
  step.regex = std::make_shared<Regex>(pattern);
  steps_.push_back(std::move(step));
}

void PreTokenizer::add_byte_level(bool add_prefix_space, bool use_regex) {
  Step step;
  if (use_regex) step.regex = std::make_shared<Regex>(kGpt2Pattern);
  step.add_prefix_space = add_prefix_space;
  step.byte_level = true;
  steps_.push_back(std::move(step));
}

void PreTokenizer::add_metaspace(const std::string& replacement, MetaspacePrepend prepend, bool split) {
  if (replacement.empty()) throw std::runtime_error("a Metaspace pre-tokenizer needs a replacement, found \"\"");
  Step step;
  step.metaspace = replacement;
  step.prepend = prepend;
  step.metaspace_split = split;
  steps_.push_back(std::move(step));
}

bool PreTokenizer::has_byte_level() const {
  return std::any_of(steps_.begin(), steps_.end(), [](const Step& s) { return s.byte_level; });
}

bool PreTokenizer::replaces_spaces_with(std::string_view replacement) const {
  return std::any_of(steps_.begin(), steps_.end(), [&](const Step& s) { return s.metaspace == replacement; });
}

bool PreTokenizer::prepends_metaspace() const {
  return std::any_of(steps_.begin(), steps_.end(),
                     [](const Step& s) { return !s.metaspace.empty() && s.prepend != MetaspacePrepend::kNever; });
}

void PreTokenizer::for_each_piece(std::string_view text, Start start,
                                  const std::function<void(std::string_view)>& emit) const {
  if (!text.empty()) apply(0, text, start, emit);
}

// As the `tokenizers` package's Metaspace: spaces replaced, the replacement
// prepended by the scheme (kFirst: only to the piece at offset 0 of the
// text; never to text that continues), then cut before each replacement if split.
void PreTokenizer::apply_metaspace(size_t step, std::string_view piece, Start start,
                                   const std::function<void(std::string_view)>& emit) const {
  const Step& s = steps_[step];
  std::string replaced;
  replaced.reserve(piece.size() + s.metaspace.size() * 4);
  const bool starts_with_it = piece.substr(0, s.metaspace.size()) == s.metaspace || piece.front() == ' ';
  if (!starts_with_it && ((s.prepend == MetaspacePrepend::kAlways && start != Start::kContinued) ||
                          (s.prepend == MetaspacePrepend::kFirst && start == Start::kText))) {
    replaced += s.metaspace;
  }
  for (const char c : piece) {
    if (c == ' ') replaced += s.metaspace;
    else replaced += c;
  }
  const std::string_view text = replaced;
  if (!s.metaspace_split) {
    apply(step + 1, text, start, emit);
    return;
  }
  size_t begin = 0;
  for (size_t at = text.find(s.metaspace, 1); at != std::string_view::npos; at = text.find(s.metaspace, at + 1)) {
    apply(step + 1, text.substr(begin, at - begin), begin == 0 ? start : Start::kPiece, emit);
    begin = at;
  }
  apply(step + 1, text.substr(begin), begin == 0 ? start : Start::kPiece, emit);
}

void PreTokenizer::apply(size_t step, std::string_view piece, Start start,
                         const std::function<void(std::string_view)>& emit) const {
  if (step == steps_.size()) {
    emit(piece);
    return;
  }
  const Step& s = steps_[step];
  if (!s.metaspace.empty()) {
    apply_metaspace(step, piece, start, emit);
    return;
  }
  std::string prefixed;  // ByteLevel's prefix space: not inside a text that continues
  if (s.add_prefix_space && start != Start::kContinued && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  if (!s.regex) {
    apply(step + 1, piece, start, emit);
    return;
  }
  // The first piece keeps where the text stands; the others are pieces of their own.
  const auto where = [&](size_t at) { return at == 0 ? start : Start::kPiece; };
  size_t position = 0, from = 0, begin = 0, end = 0;
  while (from < piece.size() && s.regex->search(piece, from, begin, end)) {
    if (end == begin) {  // an empty match splits nothing: search again one character on
      from = begin + 1;
      while (from < piece.size() && (static_cast<unsigned char>(piece[from]) & 0xC0) == 0x80) ++from;
      continue;
    }
    if (begin > position) apply(step + 1, piece.substr(position, begin - position), where(position), emit);
    apply(step + 1, piece.substr(begin, end - begin), where(begin), emit);
    position = from = end;
  }
  if (position < piece.size()) apply(step + 1, piece.substr(position), where(position), emit);
}

}  // namespace fsdp::text
