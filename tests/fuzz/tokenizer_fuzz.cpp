// libFuzzer target: the input is a tokenizer.json, written to disk and read
// with fsdp::text::Tokenizer as fsdp-data and fsdp-train read one. Each
// input must either be refused with a std::runtime_error naming the file, or
// give a tokenizer that encodes and decodes a text holding every byte value,
// with every id it gives inside its vocabulary; never crash, hang, read out
// of bounds or allocate without bound (a huge id once asked for 64 GiB).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "fsdp/tokenizer.h"
#include "input_file.h"

namespace {

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tokenizer_fuzz: %s\n", what);
    std::abort();
  }
}

// Text with words, digits, an added token's usual spelling and every byte.
std::string probe_text() {
  std::string text = "Hello world, 1234 tokens\n<|endoftext|> \xc3\xa9t\xc3\xa9 ";
  for (int b = 0; b < 256; ++b) text += static_cast<char>(b);
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fsdp_fuzz::InputFile input("tokenizer.json");
  static const std::string text = probe_text();
  input.write(data, size);
  try {
    const fsdp::text::Tokenizer tokenizer(input.path());
    const auto ids = tokenizer.encode(text);
    for (const uint32_t id : ids) expect(id < tokenizer.vocab_size(), "encode gave an id outside the vocabulary");
    (void)tokenizer.decode(ids);
    const auto continued = tokenizer.encode_continuation(text);  // the chunked encoder's path
    for (const uint32_t id : continued) expect(id < tokenizer.vocab_size(), "encode_continuation gave an id outside the vocabulary");
    (void)tokenizer.decode_continuation(continued);
    (void)tokenizer.restart_point(text, text.size());
    for (const auto* added : {&tokenizer.template_prefix_ids(), &tokenizer.template_suffix_ids()}) {
      for (const uint32_t id : *added) expect(id < tokenizer.vocab_size(), "the post-processor's id is outside the vocabulary");
    }
  } catch (const std::runtime_error& e) {
    // A refusal is the expected outcome for malformed input; it names the file.
    expect(std::string(e.what()).find(input.path()) != std::string::npos, "a refusal that does not name the file");
  }
  return 0;
}
