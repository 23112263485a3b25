// libFuzzer target: the input is a Hugging Face config.json, written to disk
// and read with hugging_face::read_config as fsdp-train --init-from and
// fsdp-ckpt read one. Each input must either be refused with a c10::Error,
// or give a configuration (its dimensions validated) whose config_json, as
// the trainer's export writes it, reads back as the same model; never
// crash or hang.

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fsdp/hugging_face.h"
#include "input_file.h"
#include "state_dict/hugging_face_files.h"

namespace {

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "config_fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace hf = fsdp::hugging_face;
  static const fsdp_fuzz::InputFile input("config.json");
  input.write(data, size);
  try {
    const hf::HubConfig config = hf::read_config(input.path());
    const std::string description = config.model.describe();
    // What the trainer's export writes, read back: the same model.
    const std::string text = hf::config_json(config);
    input.write(reinterpret_cast<const uint8_t*>(text.data()), text.size());
    const hf::HubConfig again = hf::read_config(input.path());
    expect(again.model.describe() == description, "config_json wrote a config.json that reads back as another model");
  } catch (const c10::Error&) {
    // A refusal is the expected outcome for malformed input.
  }
  return 0;
}
