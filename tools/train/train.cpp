// fsdp-train's training: the model sharded, the optimizer and the step,
// checkpoints, the loop, and the end of the run.

#include "train/train.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fsdp/chat_encoding.h"
#include "fsdp/checkpoint_manager.h"
#include "fsdp/error.h"
#include "fsdp/evaluation.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/hugging_face.h"
#include "fsdp/lora.h"
#include "fsdp/memory.h"
#include "fsdp/peft.h"
#include "fsdp/state_dict.h"
#include "fsdp/trace.h"
#include "fsdp/train_step.h"
#include "train/report.h"
#include "tool_support.h"
#include "train/text.h"
#include "state_dict/hugging_face_files.h"
#include "models/evaluation_defaults.h"

namespace fsdp_train {
namespace {

using Clock = std::chrono::steady_clock;
using Model = fsdp::FullyShardedModule<fsdp::models::LanguageModel>;  // --model gpt or llama

// A Hugging Face --init-from was built as shapes only (make_model): each
// rank reads its own shards of the weights once they are sharded.
// LoRA's adapters get lora::init_parameter's values, seeded by --seed and
// their names, as lora::apply gave them on the unsharded path (they draw
// nothing from the global generator, so the base weights' draws are those of
// a run without LoRA); --init-from-adapter's tensors are read after sharding.
Model shard_model(const TrainOptions& o, Run& run) {
  namespace hf = fsdp::hugging_face;
  const bool from_hub = hf::is_model(o.init_from);
  const uint64_t seed = o.seed;
  if (o.sharded_init) {
    // The same draws as init_weights: seeded alike, parameter by parameter in named order.
    torch::manual_seed(o.seed);
    std::shared_ptr<fsdp::models::LanguageModel> model = run.model;
    run.fsdp_options.param_init_fn([model, seed](const std::string& name, torch::Tensor& param) {
      if (fsdp::lora::is_adapter_parameter(name)) return fsdp::lora::init_parameter(name, param, seed);
      model->init_parameter(name, param);
    });
  } else if (from_hub) {
    run.fsdp_options.param_init_fn([seed](const std::string& name, torch::Tensor& param) {
      // The files' values come next for the base model; they hold no adapters.
      if (fsdp::lora::is_adapter_parameter(name)) fsdp::lora::init_parameter(name, param, seed);
    });
  }
  auto model = fsdp::fully_shard(run.model, run.group, run.fsdp_options);
  run.sharded_model = std::make_shared<Model>(model);
  const auto start = Clock::now();
  if (from_hub) hf::load_weights(model.state(), hf::find_model(o.init_from), run.model_config);
  if (!o.init_from_adapter.empty()) {
    fsdp::peft::load_adapter(model.state(), o.init_from_adapter, run.model_config, fsdp::lora::adapters(*run.model));
  }
  if (from_hub || !o.init_from_adapter.empty()) {
    run.init_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    run.init_peak_rss = fsdp_tools::peak_rss_bytes();
  }
  return model;
}

// Both are torch::optim::AdamW to the library and to checkpoints: a run may
// resume with the other.
std::unique_ptr<torch::optim::AdamW> make_optimizer(const TrainOptions& o, Model& model) {
  const auto options = torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0);
  if (o.adamw == "fused") return std::make_unique<fsdp::FusedAdamW>(model.parameters(), options);
  return std::make_unique<torch::optim::AdamW>(model.parameters(), options);
}

// The objects a checkpoint saves beside the model and the optimizer (their
// keys are those of metadata.json's "extra" that checkpoints have always had).
// --lora-* (or --init-from-adapter's) settings as a checkpoint records them:
// "none" without LoRA. A resume needs the same (the units' trainable and
// frozen parts, and the parameters, follow from them).
std::string lora_record(const Run& run) {
  if (!run.fine_tuned.lora) return "none";
  const fsdp::lora::LoraOptions& l = *run.fine_tuned.lora;
  std::ostringstream out;
  out << "r=" << l.rank() << " alpha=" << l.alpha() << " dropout=" << l.dropout() << " targets="
      << c10::Join(",", l.targets());
  return out.str();
}

// What the rows of the run hold, as a checkpoint records it: token
// sequences, or conversations packed or one a row (they are other batches).
std::string data_record(const TrainOptions& o, const Run& run) {
  if (!run.conversations) return "token sequences";
  return o.pack ? "conversations, packed" : "conversations, one a row";
}

struct CheckpointedState {
  fsdp::RecordedValue model, config, preset, weight_decay, lora, rows;
  fsdp::DataOrderState data;
  fsdp::LrScheduleState schedule;
  std::unique_ptr<fsdp::LossScaleState> loss_scale;
  CheckpointedState(const TrainOptions& o, const Run& run, fsdp::GradScaler* scaler)
      : model(fsdp::RecordedValue::text(run.model->model_type())),
        config(fsdp::RecordedValue::text(run.model->describe())),  // a GPT's is its config's
        preset(fsdp::RecordedValue::text(o.preset)),
        weight_decay(fsdp::RecordedValue::number(o.weight_decay)),
        lora(fsdp::RecordedValue::text(lora_record(run))),
        rows(fsdp::RecordedValue::text(data_record(o, run))),
        data(fsdp::models::TokenDataOptions()
                 .order(fsdp::parse_enum<fsdp::models::DataOrder>(o.data_order))
                 .seed(o.data_seed)
                 .val_fraction(o.val_fraction),
             ": pass the same --data-order, --data-seed and --val-fraction to continue the same batches"),
        schedule(run.schedule, ": pass the same --lr, --lr-schedule, --warmup-steps, --min-lr (and --steps for cosine)"),
        loss_scale(scaler ? std::make_unique<fsdp::LossScaleState>(*scaler) : nullptr) {}
  void add_to(fsdp::CheckpointManager& manager) {
    manager.add("model", model);
    manager.add("config", config);
    manager.add("preset", preset);
    manager.add("data", data);
    manager.add("lr_schedule", schedule);
    if (loss_scale) manager.add("loss_scale", *loss_scale);
    manager.add("weight_decay", weight_decay);
    manager.add("lora", lora);
    manager.add("rows", rows);
  }
};

// --resume: a checkpoint of another model family, or of another LoRA setting
// (or of a run with LoRA for one without, or the other way), is refused
// before its tensors are read, naming the setting, rather than by the units'
// layout that follows from it. A checkpoint from before the family was
// recorded ("model") is told by its configuration's text, as fsdp-ckpt does
// (a Llama's names kv_heads); one from before LoRA was recorded counts as one
// without it.
void check_resumed_settings(const std::string& checkpoint, const TrainOptions& o, const Run& run) {
  const fsdp::SavedCheckpoint saved(checkpoint, fsdp::SavedCheckpoint::Verify::kHeadersOnly);
  const auto& extra = saved.info().extra;
  auto recorded = [&](const char* key) {
    const auto it = extra.find(key);
    return it == extra.end() ? std::string() : nlohmann::json::parse(it->second).get<std::string>();
  };
  const std::string their_config = recorded("config");
  std::string their_model = recorded("model");
  if (their_model.empty() && !their_config.empty())
    their_model = their_config.find("kv_heads") != std::string::npos ? "llama" : "gpt";
  const std::string our_model = run.model->model_type();
  TORCH_CHECK(their_model.empty() || their_model == our_model, "--resume: the checkpoint ", checkpoint,
              " holds a ", their_model, " model (", their_config, "), but this run builds a ", our_model, " (",
              run.model->describe(), "): pass the --model, --preset (or shape flags) and --init-from of the run "
              "that saved it, or another --ckpt-dir");
  const std::string their_lora = extra.count("lora") ? recorded("lora") : "none";
  const std::string our_lora = lora_record(run);
  TORCH_CHECK(their_lora == our_lora, "--resume: the checkpoint ", checkpoint, " was trained with LoRA ", their_lora,
              ", but this run has LoRA ", our_lora, ": pass the same --lora-rank, --lora-alpha, --lora-dropout and "
              "--lora-targets (or --init-from-adapter) as the run that saved it");
  // Rows of another kind are other batches: a checkpoint from before they were recorded read token sequences.
  const std::string their_rows = extra.count("rows") ? recorded("rows") : "token sequences";
  TORCH_CHECK(their_rows == data_record(o, run), "--resume: the checkpoint ", checkpoint, " was trained on ",
              their_rows, ", but this run reads ", data_record(o, run), ": pass the --data (and --pack or --no-pack) "
              "of the run that saved it");
}

// --sample N: rank 0 generates N tokens from --prompt with the whole
// parameters (an UnshardScope: collective on entry and exit, nothing
// collective inside it), greedily at temperature 0, else sampled.
void print_sample(Model& model, const TrainOptions& o, const Run& run, int rank) {
  fsdp::UnshardScope whole(model.state());
  if (rank != 0) return;
  const int64_t context = model->context();
  torch::NoGradGuard no_grad;
  torch::manual_seed(o.sample_seed);
  std::vector<int64_t> tokens = run.chat_template ? encode_chat_prompt(run, o.prompt) : encode_prompt(run, o.prompt);
  if (tokens.empty()) tokens.push_back(encode_prompt(run, "\n").front());
  const size_t prompt_length = tokens.size();
  const std::optional<uint32_t> stop =
      run.chat_template ? fsdp::text::answer_end_token(*run.chat_template, *run.tokenizer) : std::nullopt;
  for (int64_t i = 0; i < o.sample; ++i) {
    const int64_t window = std::min<int64_t>(static_cast<int64_t>(tokens.size()), context);
    torch::Tensor idx = torch::tensor(std::vector<int64_t>(tokens.end() - window, tokens.end()), torch::kLong)
                            .view({1, -1})
                            .to(run.device);
    torch::Tensor last = model->logits(idx).select(1, window - 1).squeeze(0).to(torch::kFloat);
    const int64_t next = o.temperature <= 0 ? last.argmax().item<int64_t>()
                                            : torch::multinomial(torch::softmax(last / o.temperature, 0), 1).item<int64_t>();
    if (stop && next == static_cast<int64_t>(*stop)) break;
    tokens.push_back(next);
  }
  std::ostringstream temperature;  // as given (std::cout may hold std::fixed from the progress lines)
  temperature << o.temperature;
  const std::string how = o.temperature <= 0 ? std::string("greedy") : "temperature " + temperature.str();
  if (run.chat_template) {
    std::cout << "\n== answer to --prompt (" << tokens.size() - prompt_length << " tokens, at most " << o.sample
              << ", " << how << ", the template's generation prompt before it) ==\n"
              << decode_sample(run, std::vector<int64_t>(tokens.begin() + static_cast<std::ptrdiff_t>(prompt_length),
                                                         tokens.end()))
              << "\n" << std::flush;
    return;
  }
  std::cout << "\n== sample (" << o.sample << " tokens, " << how << ", prompt included) ==\n";
  std::cout << decode_sample(run, tokens) << "\n" << std::flush;
}

// One run once sharded: the model, its optimizer and step, the checkpoints,
// the figures, and the reports' view of them.
class Trainer {
 public:
  Trainer(const TrainOptions& o, Run& run, const fsdp::ProcessGroupPtr& world, const fsdp::Preemption& preemption)
      : o_(o),
        run_(run),
        world_(world),
        preemption_(preemption),
        rank_(world->rank()),
        num_params_(run.model->num_parameters()),
        model_(shard_model(o, run)),
        construction_peak_(fsdp::memory::usage().peak_total),  // building and sharding: this rank's peak so far
        optimizer_(make_optimizer(o, model_)),
        // The step itself (accumulation, loss scaling, clipping, skipping on
        // overflow, the figures) is the library's: this tool is a front end to it.
        train_step_(model_, *optimizer_,
                    fsdp::TrainStepOptions()
                        .micro_steps(o.grad_accum)
                        .no_sync(o.no_sync)
                        .clip_grad_norm(o.clip_grad_norm)
                        .weight_decay(o.weight_decay)),
        nvme_(nvme_report(model_.state())),
        predicted_(predict(o, run, model_.state(), num_params_, world->size())),
        report_{o, run, model_.state(), train_step_, predicted_, nvme_, world->size()},
        checkpointed_(o, run, train_step_.scaler()) {
    predicted_.construction_peak = construction_peak_;
    figures_.eval_sequences = o.eval_sequences.value_or(fsdp::default_evaluation_sequences(world->size()));
  }

  int run() {
    if (rank_ == 0) print_banner(report_);
    if (o_.steps == 0) return write_as_loaded();
    if (!o_.ckpt_dir.empty()) open_checkpoints();
    if (figures_.first_step >= o_.steps) {
      if (rank_ == 0) {
        std::cout << "nothing left to train: the checkpoint is at step " << figures_.first_step << " and --steps is "
                  << o_.steps << " (raise --steps to continue training)\n";
      }
      return 0;
    }
    if (!o_.trace.empty()) fsdp::trace::enable();
    const auto start = Clock::now();
    loop();
    figures_.elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    return finish();
  }

 private:
  const TrainOptions& o_;
  Run& run_;
  fsdp::ProcessGroupPtr world_;
  const fsdp::Preemption& preemption_;
  int rank_;
  int64_t num_params_;
  Model model_;
  int64_t construction_peak_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  fsdp::TrainStep train_step_;
  NvmeReport nvme_;
  Predictions predicted_;
  ReportContext report_;
  CheckpointedState checkpointed_;
  std::optional<fsdp::CheckpointManager> checkpoints_;
  RunFigures figures_;
  std::optional<int64_t> val_bytes_;  // of the validation targets, once counted (0: unknown)
  int64_t step_answer_tokens_ = 0;    // conversations: the answer tokens of this step's global batch

  // --ckpt-dir: the shared-folder probe, then --resume from the newest checkpoint.
  void open_checkpoints() {
    checkpoints_.emplace(model_.state(), *optimizer_,
                         fsdp::CheckpointManagerOptions(o_.ckpt_dir)
                             .every(o_.ckpt_every)
                             .keep(o_.ckpt_keep)
                             .format(run_.ckpt_format)
                             .async(o_.ckpt_async)
                             .barrier_group(world_));  // the MPI world: a host-only barrier on GPUs too
    checkpointed_.add_to(*checkpoints_);
    try {
      fsdp::check_folder_shared(o_.ckpt_dir, world_);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "--ckpt-dir: ", fsdp::error_message(e));
    }
    if (!o_.resume) return;
    const std::string latest = fsdp::latest_checkpoint(o_.ckpt_dir);
    if (!latest.empty()) check_resumed_settings(latest, o_, run_);
    const auto resumed = checkpoints_->resume();
    if (!resumed) {
      if (rank_ == 0) std::cout << "  no checkpoint in " << o_.ckpt_dir << ": starting at step 0\n";
      return;
    }
    figures_.first_step = resumed->info.step;
    figures_.resumed_from = resumed->info.path;
    if (rank_ == 0) print_resumed(*resumed);
  }

  void save(int64_t completed_steps) {
    const fsdp::CheckpointSave saved = checkpoints_->save(completed_steps);
    if (!saved.previous_path.empty()) {  // --ckpt-async: the save before, waited for and published first
      fsdp::CheckpointSave previous;
      previous.path = saved.previous_path;
      previous.write_seconds = saved.previous_write_seconds;
      published(previous);
    }
    figures_.record_save(saved);
    if (rank_ == 0) print_saved(saved);
  }

  // --ckpt-async: a background save published (by poll at a step boundary,
  // or wait at the end); collective only while one is in flight.
  void published(const std::optional<fsdp::CheckpointSave>& saved) {
    if (!saved) return;
    figures_.record_published(*saved);
    if (rank_ == 0) print_published(*saved);
  }

  std::optional<double> maybe_evaluate(int64_t step) {
    if (o_.eval_every == 0 || ((step + 1) % o_.eval_every != 0 && step + 1 != o_.steps)) return std::nullopt;
    const auto options = fsdp::EvaluationOptions()
                             .sequences(figures_.eval_sequences)
                             .batch(run_.model_config.shape().batch)
                             .device(run_.device);
    if (run_.conversations) {
      auto summed = [this](const fsdp::models::PackedBatch& b) {
        return model_.forward(b.inputs, b.targets, fsdp::SequencePacking::from_positions(b.positions), 1.0);
      };
      figures_.final_val_loss = fsdp::evaluate_loss(model_.state(), summed, *run_.conversations, world_, options);
      return figures_.final_val_loss;
    }
    auto loss = [this](const torch::Tensor& x, const torch::Tensor& y) { return model_.forward(x, y); };
    figures_.final_val_loss = fsdp::evaluate_loss(model_.state(), loss, *run_.data, world_, options);
    // The text behind the validation targets: the same every evaluation.
    if (!val_bytes_) val_bytes_ = validation_bytes(run_, figures_.eval_sequences).value_or(0);
    if (*val_bytes_ > 0) {
      figures_.final_val_bpb =
          bits_per_byte(*figures_.final_val_loss, figures_.eval_sequences, run_.model_config.shape().context, *val_bytes_);
    }
    return figures_.final_val_loss;
  }

  // A non-finite loss or gradient norm ends the run before anything of its
  // step is saved, so the newest checkpoint stays the last good one. Both
  // figures are the same on every rank, so every rank stops here alike.
  // Under loss scaling, a step skipped for an inf or NaN is by design
  // (result.stepped false), and the run goes on.
  void check_finite(const fsdp::StepResult& result, int64_t step, double lr) const {
    if (!result.stepped) return;
    const bool loss_finite = std::isfinite(result.loss);
    if (loss_finite && (!result.grad_norm || std::isfinite(*result.grad_norm))) return;
    const double value = loss_finite ? *result.grad_norm : result.loss;
    TORCH_CHECK(false, "step ", step + 1, ": ", loss_finite ? "the gradient norm" : "the loss", " is ", value,
                ", not a finite number (learning rate ", lr, "); the run stops before saving this step",
                checkpoints_ ? ", and the newest checkpoint in --ckpt-dir is from before it" : "");
  }

  // This rank's loss of micro-step `micro`: the mean over its sequences'
  // tokens, or for conversations the sum over its answer tokens divided so
  // that the step's loss is the mean over the whole global batch's.
  torch::Tensor micro_step_loss(int64_t step, int64_t micro) {
    const int W = world_->size();
    const int64_t A = o_.grad_accum, batch = run_.model_config.shape().batch;
    if (!run_.conversations) {
      auto [x, y] = run_.data->batch(step, micro, rank_, W, A, batch);
      return model_.forward(x.to(run_.device, /*non_blocking=*/true), y.to(run_.device, /*non_blocking=*/true));
    }
    const fsdp::models::PackedBatch b = run_.conversations->batch(step, micro, rank_, W, A, batch);
    const int64_t answer_tokens = run_.conversations->global_loss_targets(step, batch * W * A);
    if (micro == 0) step_answer_tokens_ = answer_tokens;
    // Checked and made on the host (no wait for the device), then moved.
    auto packing = fsdp::SequencePacking::from_positions(b.positions);
    packing.positions = packing.positions.to(run_.device, /*non_blocking=*/true);
    packing.allowed = packing.allowed.to(run_.device, /*non_blocking=*/true);
    return model_.forward(b.inputs.to(run_.device, /*non_blocking=*/true),
                          b.targets.to(run_.device, /*non_blocking=*/true), packing,
                          train_step_.token_loss_divisor(answer_tokens));
  }

  // The loop: a step, the evaluation and checkpoint when due, the ranks'
  // agreement on a preemption, the step's report.
  void loop() {
    preemption_.start_stepping();  // until here a signal ended the run at once (nothing to save)
    for (int64_t step = figures_.first_step; step < o_.steps; ++step) {
      fsdp::trace::Span step_span("step " + std::to_string(step + 1), "step");
      const double lr = run_.schedule.lr_at(step);
      fsdp::set_learning_rate(*optimizer_, lr);
      figures_.fold_device_peak(run_.device);
      figures_.checkpoints.in_flight_this_step = checkpoints_ && checkpoints_->in_flight();
      figures_.checkpoints.blocked_this_step = 0.0;
      const fsdp::StepResult result = train_step_([&](int64_t micro) { return micro_step_loss(step, micro); });
      check_finite(result, step, lr);
      if (result.stepped) figures_.answer_tokens += step_answer_tokens_;
      figures_.record(result, model_.state().cross_host_comm_stats(), step, o_.steps, rank_);
      const std::optional<double> val_loss = maybe_evaluate(step);
      if (checkpoints_) published(checkpoints_->poll());
      const bool saved = checkpoints_ && checkpoints_->due(step + 1, o_.steps);
      if (saved) save(step + 1);
      // Every rank learns whether any rank was signalled (a signal during the
      // save above is seen here, after it completed).
      if (preemption_.agreed_to_stop(world_)) {
        figures_.preempted_after = step + 1;
        if (!saved && checkpoints_) save(step + 1);
      }
      if (rank_ == 0) report_step(report_, figures_, result, step, lr, val_loss);
      if (figures_.preempted_after) break;
    }
  }

  // After the loop: the summary, plot, trace, sample, final weights and
  // printout; returns the exit status.
  int finish() {
    // The last save's background write (the final save, a preemption's):
    // published, or its error thrown, before the run reports and exits.
    if (checkpoints_) published(checkpoints_->wait());
    EndFigures end = gather_end_figures(world_, figures_, run_.device);
    if (rank_ == 0 && !o_.summary.empty()) write_summary(report_, figures_, end);
    if (rank_ == 0 && !o_.plot.empty()) plot();
    if (!o_.trace.empty()) {
      fsdp::trace::enable(false);
      fsdp::trace::write(trace_path(o_.trace, rank_), rank_);
      if (rank_ == 0) std::cout << "trace written to " << trace_path(o_.trace, 0) << " (one file per rank)\n";
    }
    if (o_.sample > 0) print_sample(model_, o_, run_, rank_);
    if (!o_.save_final.empty()) save_final(end);
    figures_.signalled_here = preemption_.signal_here() != 0;
    if (rank_ == 0) print_summary(report_, figures_, end);
    if (!figures_.preempted_after) return 0;
    return o_.ckpt_dir.empty() ? fsdp_tools::kExitPreemptedUnsaved : fsdp_tools::kExitPreempted;
  }

  void plot() {
    run_.log.close();
    // fsdp-plot sits next to this executable.
    const auto self = std::filesystem::read_symlink("/proc/self/exe").parent_path();
    const std::string command = "'" + (self / "fsdp-plot").string() + "' '" + o_.log + "' '" + o_.plot + "'";
    if (std::system(command.c_str()) != 0) std::cerr << "fsdp-train: warning: plotting failed: " << command << "\n";
  }

  // --save-format hf: the gathered units streamed into the folder's shards
  // by rank 0, then --init-from's tokenizer and chat template files, and
  // --tokenizer's tokenizer.json.
  void save_hugging_face() {
    namespace hf = fsdp::hugging_face;
    hf::HubConfig config;
    config.model = run_.model_config;
    hf::SaveOptions options;
    options.max_shard_bytes(hf::parse_size(o_.hf_shard_size));
    const bool from_hub = hf::is_model(o_.init_from);
    if (from_hub) config.source_json = hf::read_config(hf::find_model(o_.init_from).config).source_json;
    if (o_.save_dtype != "source") {
      options.dtype(fsdp::parse_enum<torch::ScalarType>(o_.save_dtype));
    } else if (from_hub) {
      options.dtype(hf::stored_dtype(hf::find_model(o_.init_from)));
    }
    fsdp::save_full_weights(model_.state(), [&](std::vector<fsdp::safetensors::TensorSpec> specs)
                                                -> std::unique_ptr<fsdp::WeightWriter> {
      if (!o_.merge_lora) return std::make_unique<hf::FolderWriter>(o_.save_final, config, specs, options);
      // --merge-lora: W + (alpha / r) B A in our layout, before the folder's writer transposes GPT-2's Conv1D.
      auto folder = std::make_unique<hf::FolderWriter>(o_.save_final, config, fsdp::peft::without_adapters(specs),
                                                       options);
      return std::make_unique<fsdp::peft::MergingWriter>(specs, fsdp::lora::adapters(*run_.model), std::move(folder));
    });
    if (rank_ != 0) return;
    if (o_.merge_lora && o_.base_dtype == "nf4") {  // as PEFT's merge_and_unload of a 4-bit model
      std::cout << "--merge-lora: the NF4 base dequantized and the adapters merged into it, written in "
                << fsdp::enum_name(options.dtype()) << " (a plain model: the merge is not quantized again)\n";
    }
    if (from_hub) {  // the folder, also where --init-from named its model.safetensors
      hf::copy_tokenizer_files(std::filesystem::path(hf::find_model(o_.init_from).config).parent_path().string(),
                               o_.save_final);
    }
    if (!o_.tokenizer.empty()) {
      std::filesystem::copy_file(o_.tokenizer, std::filesystem::path(o_.save_final) / "tokenizer.json",
                                 std::filesystem::copy_options::overwrite_existing);
    }
  }

  // --steps 0: no step, no checkpoint; the model as it was loaded written
  // to --save-final (a PEFT adapter merged into its base, a format converted
  // on many ranks).
  int write_as_loaded() {
    EndFigures end;
    save_final(end);
    if (rank_ == 0) {
      std::cout << "--steps 0: nothing trained; the weights as loaded written to " << o_.save_final << " ("
                << o_.save_format << ") in " << end.save_final_s << " s\n";
    }
    return 0;
  }

  // --save-format peft: the adapters alone, streamed from the gathered
  // units (the base weights gathered and dropped), in PEFT's folder.
  void save_peft() {
    namespace hf = fsdp::hugging_face;
    const std::string base = hf::is_model(o_.init_from) ? o_.init_from : "";
    const fsdp::peft::AdapterConfig config = fsdp::peft::adapter_config(run_.model_config, *run_.fine_tuned.lora, base);
    const torch::ScalarType dtype = o_.save_dtype == "source" ? torch::kFloat : fsdp::parse_enum<torch::ScalarType>(o_.save_dtype);
    fsdp::save_full_weights(model_.state(), [&](std::vector<fsdp::safetensors::TensorSpec> specs) {
      return std::make_unique<fsdp::peft::AdapterWriter>(o_.save_final, run_.model_config, config, specs, dtype);
    });
  }

  void save_final(EndFigures& end) {
    const auto start = Clock::now();
    fsdp::memory::reset_peaks();
    const int64_t live_before = fsdp::memory::usage().live_total;
    if (o_.save_format == "hf") {
      save_hugging_face();
    } else if (o_.save_format == "peft") {
      save_peft();
    } else {
      fsdp::save_full_state_dict(model_.state(), o_.save_final,
                                 {{"format", "pt"},
                                  {"model", run_.model->model_type()},
                                  {"config", run_.model->describe()},
                                  {"steps", std::to_string(o_.steps)}});
    }
    end.save_final_peak_extra = fsdp::memory::usage().peak_total - live_before;
    end.save_final_s = std::chrono::duration<double>(Clock::now() - start).count();
  }
};

}  // namespace

int train(const TrainOptions& o, Run& run, const fsdp::ProcessGroupPtr& world, const fsdp::Preemption& preemption) {
  Trainer trainer(o, run, world, preemption);
  return trainer.run();
}

}  // namespace fsdp_train
