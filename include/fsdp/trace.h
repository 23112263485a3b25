#pragma once
/// \file
/// Chrome/Perfetto traces of units and collectives.
///
/// A Chrome-trace / Perfetto timeline of one process: every unit's forward
/// and backward, every collective (on its group's communication thread), the
/// compute thread's waits on them, and whatever the caller marks (the
/// optimizer step). Off by default; recording costs a clock read and a
/// locked push per event while on.
///
/// \code{.cpp}
/// fsdp::trace::enable();
/// { fsdp::trace::Span span("optimizer.step", "optimizer"); optimizer.step(); }
/// fsdp::trace::write("run.rank0.json", rank);
/// \endcode

#include <chrono>
#include <string>

namespace fsdp::trace {

/// Starts (or, with false, stops) recording; the calling thread is named "compute".
void enable(bool on = true);

/// Records [construction, destruction) on the calling thread.
class Span {
 public:
  /// Begins the event (nothing while tracing is off); `detail` goes into its arguments.
  Span(std::string name, const char* category, std::string detail = "");
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  std::string name_;
  const char* category_;
  std::string detail_;
  double begin_us_ = -1.0;  // -1: tracing was off
};

/// Writes the events so far as a Chrome trace (JSON object format); the
/// process id is the rank, the threads are named "compute" (the one that
/// called enable()) and "comm <n>". Throws naming the file on failure.
void write(const std::string& path, int rank);

}  // namespace fsdp::trace
