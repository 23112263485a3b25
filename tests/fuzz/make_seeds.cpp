// Writes the safetensors seeds of corpus-safetensors/ (run.sh BUILD seeds):
// files the library's Writer makes (every dtype, a scalar, an empty tensor;
// the checksum in the metadata), and standard files it did not write (no
// metadata, other metadata, tensors listed out of offset order), each a few
// hundred bytes.
//   make_seeds DIR

#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "fsdp/safetensors.h"
#include "state_dict/safetensors_metadata.h"

namespace st = fsdp::safetensors;

namespace {

void write_with_writer(const std::string& path, const std::vector<torch::Tensor>& tensors,
                       std::map<std::string, std::string> metadata = {}) {
  std::vector<st::TensorSpec> specs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    specs.push_back({"t" + std::to_string(i) + "." + st::dtype_code(tensors[i].scalar_type()), tensors[i].scalar_type(),
                     tensors[i].sizes().vec()});
  }
  st::Writer writer(path, specs, std::move(metadata));
  for (const auto& t : tensors) writer.write(t);
  writer.commit();
}

// A file as another program writes it: the header text as given, then the
// data bytes.
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  TORCH_CHECK(f, "cannot create ", path);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>((header.size() >> (8 * i)) & 0xff);
  std::fwrite(length, 1, 8, f);
  std::fwrite(header.data(), 1, header.size(), f);
  std::fwrite(data.data(), 1, data.size(), f);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  TORCH_CHECK(argc == 2, "usage: make_seeds DIR");
  const std::string dir = argv[1];
  torch::manual_seed(0);
  const auto values = torch::randn({2, 3});
  std::vector<torch::Tensor> every_dtype;
  for (auto type : {torch::kDouble, torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kLong, torch::kInt,
                    torch::kShort, torch::kChar, torch::kByte, torch::kBool}) {
    every_dtype.push_back((values * 3).to(type));
  }
  write_with_writer(dir + "/writer_every_dtype", every_dtype);
  write_with_writer(dir + "/writer_scalar_empty_3d",
                    {torch::tensor(1.5), torch::empty({0, 4}), torch::arange(24, torch::kFloat).view({2, 3, 4})},
                    {{"format", "pt"}, {"note", "a scalar, an empty and a 3-d tensor"}});
  write_with_writer(dir + "/writer_one_tensor", {torch::arange(5, torch::kFloat)});
  write_raw(dir + "/standard_no_metadata",
            R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]}})",
            std::string("\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x3c\x00\x40", 12));
  // Padding after the JSON, listed out of offset order, other metadata.
  write_raw(dir + "/standard_out_of_order",
            R"({"__metadata__":{"format":"np"},"second":{"dtype":"I32","shape":[1],"data_offsets":[2,6]},)"
            R"("first":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}   )",
            std::string("\x01\x02\x03\x00\x00\x00", 6));
  return 0;
}
