#pragma once
// The check every model's description makes of the unit lists it gives the
// planner (fsdp/model_description.h).

#include "fsdp/model_description.h"

namespace fsdp {

/// Throws, naming the units and `layers`, unless the planner's lists of
/// `units` units (a few lists of one int64 each) fit this host's available
/// memory: every family's config checks it before any list is made (two
/// billion layers once listed units until the kernel's OOM killer came).
void check_unit_lists_fit(int64_t units, int64_t layers);

}  // namespace fsdp
