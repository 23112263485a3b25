// fsdp-train: trains or fine-tunes a model (the reference GPT, a Llama-like
// one, a Hugging Face folder; fully, partly or with LoRA) with the chosen
// sharding strategy over the MPI ranks it is started on (through fsdp-run).
// Rank 0 prints progress and a summary and writes the log, checkpoints and
// the final weights.
//
// The program's parts: options.h (the command line), setup.h (options to
// the library's structs, the data and the model), train.h (sharding,
// checkpoints, the loop), report.h (what is printed and written).

#include <filesystem>
#include <iostream>

#include "fsdp/comm.h"
#include "fsdp/device_choice.h"
#include "fsdp/error.h"
#include "fsdp/memory.h"
#include "fsdp/preemption.h"
#include "train/options.h"
#include "train/setup.h"
#include "train/train.h"
#include "tool_support.h"

namespace {

// Collective: prepares the run; one rank's failure (its log file, say)
// stops every rank cleanly. Returns false when any rank failed.
// Rank 0 prints the first failing rank's message, whichever rank that is
// (rank 1's own file, say).
bool prepare_everywhere(const fsdp_train::TrainOptions& o, const fsdp::ProcessGroupPtr& world,
                        fsdp_train::Run& run) {
  std::string error;
  try {
    run = fsdp_train::prepare(o, world);
  } catch (const std::exception& e) {
    error = fsdp::error_message(e);
  }
  try {
    fsdp::throw_if_any_rank_failed(world, error);
  } catch (const std::exception& e) {
    if (world->rank() == 0) std::cerr << "fsdp-train: error: " << fsdp::error_message(e) << "\n";
    return false;
  }
  return true;
}

// A preemption before the first step: 75 where --ckpt-dir holds the newest
// state (nothing was lost; a requeued job resumes from it, or starts afresh),
// 76 without one; and what setup makes (rank 0's log, --plot's folder)
// removed, so that a job stopped (or failed: Preemption::failed_before_stepping)
// that early leaves nothing behind.
void note_early_outputs(const fsdp_train::TrainOptions& o, int rank, const fsdp::Preemption& preemption) {
  if (!o.ckpt_dir.empty()) preemption.set_status_before_stepping(fsdp_tools::kExitPreempted);
  if (rank != 0) return;
  if (!o.log.empty() && !std::filesystem::exists(o.log)) preemption.remove_before_stepping(o.log);
  if (!o.plot.empty() && !std::filesystem::exists(o.plot)) preemption.remove_before_stepping(o.plot);
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::memory::install_counting_allocator();
  // SIGTERM and SIGUSR1: at once until the first step (setup can take
  // minutes: a load, a plan), then save and stop at the next step boundary.
  const fsdp::Preemption preemption(fsdp_tools::kExitPreemptedUnsaved, "fsdp-train");
  fsdp::MpiEnvironment mpi(&argc, &argv);
  const auto world = mpi.world();
  try {
    fsdp::check_scheduler_world(world->size());
  } catch (const std::exception& e) {
    std::cerr << "fsdp-train: error: " << fsdp::error_message(e) << "\n";
    return 1;
  }
  fsdp_train::TrainOptions o;
  CLI::App app{"Train or fine-tune a model with fully sharded data parallelism. Start it through fsdp-run."};
  fsdp_train::add_options(app, o);
  try {
    app.parse(argc, argv);
    fsdp_tools::check_integers_fit(app);
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same arguments, so every rank leaves here alike.
    return fsdp_tools::parse_error_status(app, e, world->rank() == 0);
  }
  if (!o.plot.empty() && o.log.empty()) o.log = (std::filesystem::path(o.plot) / "log.jsonl").string();
  note_early_outputs(o, world->rank(), preemption);
  torch::set_num_threads(o.threads > 0 ? o.threads : fsdp_train::default_threads(world->size()));
  if (o.collective_timeout > 0) world->set_timeout(o.collective_timeout);  // the units' groups inherit it
  fsdp_train::Run run;
  if (!prepare_everywhere(o, world, run)) {
    preemption.failed_before_stepping();
    return 1;
  }
  try {
    return fsdp_train::train(o, run, world, preemption);
  } catch (const std::exception& e) {
    // Ranks that fail alike print one message; MPI then ends the job. A
    // failure before the first step (a resume refused) leaves no new log.
    preemption.failed_before_stepping();
    std::cout << std::flush;
    fsdp::MpiEnvironment::abort_with_message("fsdp-train: error: " + fsdp::error_message(e));
  }
}
