// A Llama trained with FSDP, written the way a user of the installed
// library writes it: only the public fsdp/ headers and a training loop
// shaped like PyTorch's.
//
//   build/fsdp-run -n 2 -- build/example-llama --steps 50 --log run.jsonl
//
// The model is the library's fsdp::models::Llama (fsdp/llama.h: Hugging
// Face's LlamaForCausalLM, the one fsdp-train --model llama trains): token
// embeddings, `layers` decoder layers of (RMSNorm, causal grouped-query
// attention with rotary position embeddings, RMSNorm, SwiGLU MLP) with
// residuals, a final RMSNorm and an untied output head; no biases. Each
// decoder layer is one FSDP unit. The data order is the library's
// (fsdp::models::TokenData): W ranks with --batch B train the same model as
// 1 rank with --batch W*B.

#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include "fsdp/fsdp.h"

using fsdp::models::Llama;
using fsdp::models::LlamaConfig;

struct Args {
  int64_t steps = 20, batch = 4, micro_steps = 1, seed = 1337, lora_rank = 0;
  double lr = 3e-3;
  LlamaConfig model = LlamaConfig::preset("tiny");  // width 64, 2 layers, 4 heads sharing 2 kv heads, context 32
  std::string log, data;
};

template <class T>
T parse_number(const std::string& name, const std::string& value) {
  std::istringstream in(value);
  T x;
  if (!(in >> x) || !in.eof()) throw std::invalid_argument("option " + name + " needs a number, got '" + value + "'");
  return x;
}

// --name value pairs; anything else is an error (an example: no CLI library).
Args parse_args(int argc, char** argv) {
  Args a;
#ifdef FSDP_DEFAULT_CORPUS
  a.data = FSDP_DEFAULT_CORPUS;  // the built-in corpus, when built inside fsdp-cpp
#endif
  std::map<std::string, int64_t*> ints = {{"--steps", &a.steps},        {"--batch", &a.batch},
                                          {"--micro-steps", &a.micro_steps}, {"--seed", &a.seed},
                                          {"--width", &a.model.width},  {"--layers", &a.model.layers},
                                          {"--heads", &a.model.heads},  {"--context", &a.model.context},
                                          {"--vocab", &a.model.vocab},  {"--kv-heads", &a.model.kv_heads},
                                          {"--lora-rank", &a.lora_rank}};
  std::map<std::string, std::string*> strings = {{"--log", &a.log}, {"--data", &a.data}};
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("option " + name + " needs a value");
    const std::string value = argv[i + 1];
    if (ints.count(name)) {
      *ints[name] = parse_number<int64_t>(name, value);
    } else if (strings.count(name)) {
      *strings[name] = value;
    } else if (name == "--lr") {
      a.lr = parse_number<double>(name, value);
    } else {
      throw std::invalid_argument("unknown option " + name +
                                  " (options: --steps --batch --micro-steps --lr --seed --width --layers --heads "
                                  "--kv-heads --context --vocab --lora-rank --data --log)");
    }
  }
  if (a.data.empty()) throw std::invalid_argument("no --data FILE given (and no built-in corpus in this build)");
  if (a.steps < 1 || a.batch < 1 || a.micro_steps < 1) throw std::invalid_argument("need steps, batch, micro-steps >= 1");
  a.model.hidden = LlamaConfig::default_hidden(a.model.width);  // the SwiGLU width of --width
  a.model.validate();
  return a;
}

int main(int argc, char** argv) {
  fsdp::MpiEnvironment mpi(&argc, &argv);
  auto group = mpi.world();
  const int rank = group->rank(), world = group->size();
  try {
    const Args args = parse_args(argc, argv);
    fsdp::models::TokenData data(args.data, args.model.context, args.model.vocab);

    Llama net(args.model);
    net->init_weights(args.seed);  // every rank builds the same initial model
    if (args.lora_rank > 0) {  // LoRA: adapters on the attention's linears train, the rest is frozen
      const auto report = fsdp::lora::apply(*net, fsdp::lora::LoraOptions()
                                                      .rank(args.lora_rank)
                                                      .alpha(2.0 * args.lora_rank)
                                                      .targets({"q_proj", "k_proj", "v_proj", "o_proj"}));
      if (rank == 0) std::cout << "LoRA on " << report.adapted.size() << " linears: " << report.trainable << " trainable\n";
    }
    const int64_t total = net->num_parameters();
    auto model = fsdp::fully_shard(  // FSDP: every decoder layer a unit, the rest the root unit
        net, group,
        fsdp::FullyShardOptions().wrap_policy(fsdp::module_type_policy<fsdp::models::LlamaDecoderLayerImpl>()));
    torch::optim::AdamW optimizer(model.parameters(),  // this rank's shards
                                  torch::optim::AdamWOptions(args.lr).betas({0.9, 0.95}).weight_decay(0.0));
    fsdp::TrainStep train_step(model, optimizer, fsdp::TrainStepOptions().micro_steps(args.micro_steps));

    int64_t local = 0;
    for (const auto& shard : model.parameters()) local += shard.numel();
    if (rank == 0) {
      std::cout << "llama: " << total << " parameters in " << model.state().num_units() << " units; rank 0 holds "
                << local << " of them (" << world << " ranks)" << std::endl;
    }
    std::ofstream log;  // one JSON line per step, from rank 0
    if (rank == 0 && !args.log.empty()) log.open(args.log);
    const bool log_failed = rank == 0 && !args.log.empty() && !log.is_open();
    fsdp::throw_if_any_rank_failed(group, log_failed ? "cannot write the log '" + args.log + "'" : "");
    log << std::setprecision(17);

    double first_loss = 0.0, last_loss = 0.0;  // global-batch means, alike on every rank
    for (int64_t step = 0; step < args.steps; ++step) {
      fsdp::StepResult result = train_step([&](int64_t micro) {
        auto [tokens, targets] = data.batch(step, micro, rank, world, args.micro_steps, args.batch);
        return model(tokens, targets);  // this rank's mean loss of one micro-batch
      });
      if (rank == 0) std::cout << "step " << step << " loss " << result.loss << std::endl;
      if (log.is_open()) log << "{\"step\": " << step << ", \"loss\": " << result.loss << "}" << std::endl;
      last_loss = result.loss;
      if (step == 0) first_loss = last_loss;
    }
    // It learned: with more than one step, the last loss is below the first.
    if (args.steps > 1 && !(last_loss < first_loss)) {
      throw std::runtime_error("the loss did not fall: " + std::to_string(first_loss) + " at step 0, " +
                               std::to_string(last_loss) + " at step " + std::to_string(args.steps - 1));
    }
  } catch (const std::exception& e) {
    // Every rank fails alike on bad options or data; the message once
    // (LibTorch's errors without their C++ backtrace).
    const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
    if (rank == 0) {
      std::cerr << "example-llama: " << (torch_error ? torch_error->what_without_backtrace() : e.what()) << std::endl;
    }
    return 1;
  }
  return 0;
}
