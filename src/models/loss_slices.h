#pragma once
// How next_token_loss (fsdp/language_model.h) slices its logits: the rule the
// loss and the planner share.

#include "fsdp/language_model.h"

namespace fsdp::models {

/// The next-token loss (models::next_token_loss) computes its logits in
/// slices of at most this many elements (32 MiB in fp32), recomputed in
/// backward, so that no B x T x vocab tensor is ever kept: at hub
/// vocabularies (50 k to 152 k) the full logits and their gradients were
/// the largest tensors of a step.
constexpr int64_t kLossSliceElements = int64_t{1} << 23;

/// The rows of one slice of the loss at `vocab` (at least 1). A step whose
/// B x T rows fit in one slice computes the loss whole, as before slicing.
int64_t loss_slice_rows(int64_t vocab);

}  // namespace fsdp::models
