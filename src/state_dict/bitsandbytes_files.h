#pragma once
// A -bnb-4bit folder's weights read as the values bitsandbytes computes
// with: the folders transformers' save_pretrained writes for a model loaded
// with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4").
// Beside each quantized linear weight `W` (uint8, its packed codes) it
// stores W.absmax (fp32, or uint8 codes when double-quantized, with
// W.nested_absmax and W.nested_quant_map), W.quant_map (the 16 NF4 values)
// and W.quant_state.bitsandbytes__nf4 (a JSON of its shape, blocksize, dtype
// and nested offset, as bytes).

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/safetensors.h"

namespace fsdp::hugging_face::detail {

// config.json's quantization_config: none, or bitsandbytes' 4-bit NF4;
// anything else (FP4, 8-bit, another quant_method) is refused naming the field.
void check_quantization_config(const nlohmann::json& config, const std::string& path);

// Whether `hf_name` is one of the tensors bitsandbytes stores beside a quantized weight.
bool is_quantization_side_tensor(const std::string& hf_name);

// A file's tensor by its Hugging Face name: its reader and entry, or nulls.
using TensorLookup =
    std::function<std::pair<const safetensors::Reader*, const safetensors::TensorEntry*>(const std::string&)>;

// What a quantized weight's quant_state says.
struct Nf4State {
  std::vector<int64_t> shape;  // the weight's
  bool nested = false;         // its absmax double-quantized
  float nested_offset = 0;
};

// The quant_state of weight `hf_name` (null if it is stored plain); throws
// naming the file and the field for anything but NF4 in blocks of 64.
std::optional<Nf4State> nf4_state(const std::string& hf_name, const TensorLookup& find);

// The weight's values in fp32, as bitsandbytes' dequantize_4bit computes
// them (nf4[code] * absmax, the absmax expanded first where nested):
// quantized again (core/nf4.h) they give the file's codes and, in fp32,
// the absmax bitsandbytes computes with.
torch::Tensor read_nf4(const std::string& hf_name, const Nf4State& state, const TensorLookup& find);

}  // namespace fsdp::hugging_face::detail
