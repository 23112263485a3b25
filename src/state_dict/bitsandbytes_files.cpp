// bitsandbytes' NF4 weights in a Hugging Face folder (bitsandbytes_files.h).

#include "state_dict/bitsandbytes_files.h"

#include "base/strings.h"
#include "core/nf4.h"

namespace fsdp::hugging_face::detail {
namespace {

const char* const kQuantState = ".quant_state.bitsandbytes__nf4";
const char* const kSideTensors[] = {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                                    ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4"};

torch::Tensor read_side(const std::string& name, const TensorLookup& find, const std::string& weight) {
  const auto [reader, entry] = find(name);
  TORCH_CHECK(reader, "'", weight, "' is stored in NF4 but its '", name, "' is missing");
  return reader->read(entry->spec.name);
}

}  // namespace

void check_quantization_config(const nlohmann::json& config, const std::string& path) {
  if (!config.contains("quantization_config") || config.at("quantization_config").is_null()) return;
  const nlohmann::json& q = config.at("quantization_config");
  auto text = [&](const char* field) { return q.contains(field) ? q.at(field).dump() : std::string("absent"); };
  TORCH_CHECK(q.is_object() && q.value("quant_method", std::string()) == "bitsandbytes", "'", path,
              "': \"quantization_config.quant_method\" is ", text("quant_method"),
              "; only bitsandbytes' 4-bit NF4 folders (-bnb-4bit) are read");
  TORCH_CHECK(!q.value("load_in_8bit", false), "'", path,
              "': \"quantization_config.load_in_8bit\" is true; bitsandbytes' 8-bit weights are not read, only its "
              "4-bit NF4");
  TORCH_CHECK(q.value("load_in_4bit", false), "'", path, "': \"quantization_config.load_in_4bit\" is ",
              text("load_in_4bit"), "; expected true (bitsandbytes' 4-bit NF4)");
  TORCH_CHECK(q.value("bnb_4bit_quant_type", std::string()) == "nf4", "'", path,
              "': \"quantization_config.bnb_4bit_quant_type\" is ", text("bnb_4bit_quant_type"),
              "; only \"nf4\" is read");
}

bool is_quantization_side_tensor(const std::string& hf_name) {
  for (const char* suffix : kSideTensors)
    if (ends_with(hf_name, suffix)) return true;
  return false;
}

std::optional<Nf4State> nf4_state(const std::string& hf_name, const TensorLookup& find) {
  const auto fp4 = find(hf_name + ".quant_state.bitsandbytes__fp4");
  TORCH_CHECK(!fp4.first, "'", fp4.first ? fp4.first->path() : "", "': '", hf_name,
              "' is stored in bitsandbytes' FP4; only NF4 is read");
  const auto [reader, entry] = find(hf_name + kQuantState);
  if (!reader) return std::nullopt;
  const torch::Tensor bytes = reader->read(entry->spec.name).to(torch::kByte).contiguous();
  const std::string text(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), bytes.numel());
  const std::string where = "'" + reader->path() + "': '" + entry->spec.name + "'";
  nlohmann::json q;
  try {
    q = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, where, " is not JSON: ", e.what());
  }
  TORCH_CHECK(q.is_object() && q.value("quant_type", std::string()) == "nf4", where, ": \"quant_type\" is ",
              q.contains("quant_type") ? q.at("quant_type").dump() : "absent", "; only \"nf4\" is read");
  TORCH_CHECK(q.value("blocksize", 0) == nf4::kBlock, where, ": \"blocksize\" is ",
              q.contains("blocksize") ? q.at("blocksize").dump() : "absent", "; only ", nf4::kBlock,
              " is read (the blocks fsdp-cpp holds)");
  TORCH_CHECK(q.contains("shape") && q.at("shape").is_array(), where, ": no \"shape\"");
  Nf4State state;
  state.shape = q.at("shape").get<std::vector<int64_t>>();
  state.nested = q.contains("nested_offset");
  if (state.nested) {
    TORCH_CHECK(q.value("nested_blocksize", 0) == nf4::kNestedBlock, where, ": \"nested_blocksize\" is ",
                q.contains("nested_blocksize") ? q.at("nested_blocksize").dump() : "absent", ", expected ",
                nf4::kNestedBlock);
    state.nested_offset = q.at("nested_offset").get<float>();  // a float32 written as a Python float: exact
  }
  return state;
}

torch::Tensor read_nf4(const std::string& hf_name, const Nf4State& state, const TensorLookup& find) {
  int64_t n = 1;
  for (int64_t d : state.shape) n *= d;
  const torch::Tensor packed = read_side(hf_name, find, hf_name).reshape({-1}).contiguous();
  TORCH_CHECK(packed.scalar_type() == torch::kByte && packed.numel() == (n + 1) / 2, "'", hf_name, "' holds ",
              packed.numel(), " ", packed.scalar_type(), " elements; ", n, " NF4 codes take ", (n + 1) / 2, " bytes");
  const torch::Tensor quant_map = read_side(hf_name + ".quant_map", find, hf_name);
  TORCH_CHECK(torch::equal(quant_map.to(torch::kFloat), nf4::code_values()), "'", hf_name,
              ".quant_map' is not bitsandbytes' NF4 table");
  torch::Tensor absmax = read_side(hf_name + ".absmax", find, hf_name).reshape({-1});
  if (state.nested) {
    nf4::NestedAbsmax nested;
    nested.codes = absmax.to(torch::kByte);
    nested.absmax = read_side(hf_name + ".nested_absmax", find, hf_name).reshape({-1}).to(torch::kFloat);
    nested.quant_map = read_side(hf_name + ".nested_quant_map", find, hf_name).reshape({-1}).to(torch::kFloat);
    nested.offset = torch::tensor(state.nested_offset, torch::kFloat);
    absmax = nf4::expand_absmax(nested);
  }
  TORCH_CHECK(absmax.scalar_type() == torch::kFloat && absmax.numel() == nf4::blocks(n), "'", hf_name,
              ".absmax' holds ", absmax.numel(), " ", absmax.scalar_type(), " values; ", n, " elements take ",
              nf4::blocks(n), " float32 absmax");
  return nf4::dequantize(packed, absmax.contiguous(), n, torch::kFloat).view(state.shape);
}

}  // namespace fsdp::hugging_face::detail
