#pragma once
// What the models ask of a linear LoRA may have adapted (fsdp/lora.h).

#include "fsdp/lora.h"

namespace fsdp::lora {

/// Whether apply() gave `linear` an adapter.
bool has_adapter(const torch::nn::Linear& linear);

}  // namespace fsdp::lora
