#pragma once
// What the engine records its own events with (fsdp/trace.h has what a
// program turns on, marks with a Span and writes): the switch, the clock, a
// thread's name, and an event whose start it read from the clock itself.

#include "fsdp/trace.h"

namespace fsdp::trace {

/// Whether events are being recorded.
bool enabled();

/// Microseconds since the process's first use of the tracer.
double now_us();

/// Names the calling thread in the trace (an offload's I/O thread: "offload
/// io"); unnamed threads other than the compute thread are "comm <n>".
void name_thread(std::string name);

/// Records a complete event [begin_us, now) on the calling thread.
void complete(std::string name, const char* category, double begin_us, std::string detail = "");

}  // namespace fsdp::trace
