// nf4_check IN OUT: every tensor W of the safetensors file IN quantized to
// NF4 as fsdp-cpp does (core/nf4.h), written to OUT for
// nf4_reference.py to compare with bitsandbytes byte for byte:
//   W.packed, W.absmax                   quantize_4bit(W, blocksize=64, quant_type="nf4")
//   W.nested_codes, .nested_absmax, .offset   its compress_statistics=True absmax
//   W.expanded                           those absmax as dequantize_4bit expands them
//   W.float32, W.bfloat16                dequantize_4bit to each dtype (plain absmax)
//   W.nested_bfloat16                    dequantize_4bit from the nested absmax

#include <iostream>

#include "core/nf4.h"
#include "fsdp/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: nf4_check IN.safetensors OUT.safetensors\n";
    return 2;
  }
  try {
    fsdp::safetensors::Reader reader(argv[1]);
    std::vector<fsdp::safetensors::TensorSpec> specs;
    std::vector<torch::Tensor> outputs;
    auto add = [&](const std::string& name, const torch::Tensor& t) {
      specs.push_back({name, t.scalar_type(), t.sizes().vec()});
      outputs.push_back(t.contiguous());
    };
    for (const auto& entry : reader.tensors()) {
      const std::string& name = entry.spec.name;
      const torch::Tensor w = reader.read(name);
      const int64_t n = w.numel();
      const fsdp::nf4::Quantized q = fsdp::nf4::quantize(w);
      add(name + ".packed", q.packed);
      add(name + ".absmax", q.absmax);
      const fsdp::nf4::NestedAbsmax nested = fsdp::nf4::nest_absmax(q.absmax);
      add(name + ".nested_codes", nested.codes);
      add(name + ".nested_absmax", nested.absmax);
      add(name + ".offset", nested.offset.reshape({1}));
      const torch::Tensor expanded = fsdp::nf4::expand_absmax(nested);
      add(name + ".expanded", expanded);
      add(name + ".float32", fsdp::nf4::dequantize(q.packed, q.absmax, n, torch::kFloat));
      add(name + ".bfloat16", fsdp::nf4::dequantize(q.packed, q.absmax, n, torch::kBFloat16));
      add(name + ".nested_bfloat16", fsdp::nf4::dequantize(q.packed, expanded, n, torch::kBFloat16));
    }
    fsdp::safetensors::Writer writer(argv[2], specs);
    for (const auto& t : outputs) writer.write(t);
    writer.commit();
  } catch (const std::exception& e) {
    std::cerr << "nf4_check: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
