// A Llama-style decoder trained with FSDP, written the way a user of the
// installed library writes it: only the public fsdp/ headers, a model of
// plain LibTorch modules, and a training loop shaped like PyTorch's.
//
//   build/fsdp-run -n 2 -- build/example-llama --steps 50 --log run.jsonl
//
// The model: token embeddings, `layers` blocks of (RMSNorm, causal attention
// with rotary position embeddings, RMSNorm, SwiGLU MLP) with residuals, a
// final RMSNorm and an untied output head; no biases. Each block is one FSDP
// unit. The data order is the library's (fsdp::models::TokenData): W ranks
// with --batch B train the same model as 1 rank with --batch W*B.

#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include "fsdp/fsdp.h"

struct LlamaConfig {
  int64_t vocab = 256, context = 32, width = 64, layers = 2, heads = 4;
  double rope_theta = 10000.0, norm_eps = 1e-5;
  // SwiGLU's hidden size: 2/3 of the usual 4x, rounded up to a multiple of
  // 32 (Llama's choice: the same parameter count as a 4x GELU MLP).
  int64_t hidden() const { return (8 * width / 3 + 31) / 32 * 32; }
};

// Root-mean-square norm with a learned gain (no mean subtraction, no bias).
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t width, double eps) : eps(eps) { weight = register_parameter("weight", torch::ones({width})); }
  torch::Tensor forward(const torch::Tensor& x) {
    return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
  }
  double eps;
  torch::Tensor weight;
};
TORCH_MODULE(RMSNorm);

// Rotary position embeddings (the "rotate half" form): channel pairs (i,
// i + hs/2) of each head are rotated by angle position * theta^(-2i/hs).
// Computed per call: no state, and any length up to the context.
torch::Tensor apply_rotary(const torch::Tensor& x, double theta) {  // x: [B, heads, T, hs]
  const int64_t T = x.size(2), hs = x.size(3);
  torch::Tensor inv_freq = torch::pow(theta, -torch::arange(0, hs, 2, torch::kFloat) / hs);
  torch::Tensor angles = torch::outer(torch::arange(T, torch::kFloat), inv_freq);  // [T, hs/2]
  torch::Tensor cos = torch::cat({angles, angles}, -1).cos().to(x.dtype());
  torch::Tensor sin = torch::cat({angles, angles}, -1).sin().to(x.dtype());
  auto halves = x.chunk(2, -1);
  torch::Tensor rotated = torch::cat({-halves[1], halves[0]}, -1);
  return x * cos + rotated * sin;
}

struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const LlamaConfig& c) : heads(c.heads), theta(c.rope_theta) {
    auto linear = [&](const char* name) {
      return register_module(name, torch::nn::Linear(torch::nn::LinearOptions(c.width, c.width).bias(false)));
    };
    wq = linear("wq"), wk = linear("wk"), wv = linear("wv"), wo = linear("wo");
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hs = C / heads;
    auto split_heads = [&](const torch::Tensor& t) { return t.view({B, T, heads, hs}).transpose(1, 2); };
    torch::Tensor q = apply_rotary(split_heads(wq(x)), theta), k = apply_rotary(split_heads(wk(x)), theta);
    torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hs));
    torch::Tensor future = torch::ones({T, T}, torch::kBool).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    torch::Tensor y = torch::matmul(torch::softmax(scores, -1), split_heads(wv(x)));
    return wo(y.transpose(1, 2).contiguous().view({B, T, C}));
  }
  int64_t heads;
  double theta;
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
};
TORCH_MODULE(Attention);

struct FeedForwardImpl : torch::nn::Module {  // SwiGLU: w2(silu(w1 x) * w3 x)
  explicit FeedForwardImpl(const LlamaConfig& c) {
    auto linear = [&](const char* name, int64_t in, int64_t out) {
      return register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
    };
    w1 = linear("w1", c.width, c.hidden()), w2 = linear("w2", c.hidden(), c.width);
    w3 = linear("w3", c.width, c.hidden());
  }
  torch::Tensor forward(const torch::Tensor& x) { return w2(torch::silu(w1(x)) * w3(x)); }
  torch::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(FeedForward);

struct TransformerBlockImpl : torch::nn::Module {
  explicit TransformerBlockImpl(const LlamaConfig& c)
      : attention_norm(register_module("attention_norm", RMSNorm(c.width, c.norm_eps))),
        attention(register_module("attention", Attention(c))),
        ffn_norm(register_module("ffn_norm", RMSNorm(c.width, c.norm_eps))),
        feed_forward(register_module("feed_forward", FeedForward(c))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = x + attention(attention_norm(x));
    return h + feed_forward(ffn_norm(h));
  }
  RMSNorm attention_norm;
  Attention attention;
  RMSNorm ffn_norm;
  FeedForward feed_forward;
};
TORCH_MODULE(TransformerBlock);

struct LlamaImpl : torch::nn::Module {
  explicit LlamaImpl(const LlamaConfig& c)
      : tok_embeddings(register_module("tok_embeddings", torch::nn::Embedding(c.vocab, c.width))),
        layers(register_module("layers", torch::nn::ModuleList())),
        norm(register_module("norm", RMSNorm(c.width, c.norm_eps))),
        output(register_module("output", torch::nn::Linear(torch::nn::LinearOptions(c.width, c.vocab).bias(false)))) {
    for (int64_t i = 0; i < c.layers; ++i) layers->push_back(TransformerBlock(c));
    // GPT-2's initialization: N(0, 0.02) for every matrix, gains of one.
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) {
      if (p.dim() == 2) p.normal_(0.0, 0.02);
    }
  }
  // The mean next-token cross-entropy of a [B, T] batch.
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& targets) {
    torch::Tensor h = tok_embeddings(tokens);
    for (const auto& layer : *layers) {
      h = fsdp::unit_forward(*layer->as<TransformerBlockImpl>(), h);  // FSDP: a unit boundary
    }
    torch::Tensor logits = output(norm(h)).to(torch::kFloat);
    return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
  }
  torch::nn::Embedding tok_embeddings;
  torch::nn::ModuleList layers;
  RMSNorm norm;
  torch::nn::Linear output;
};
TORCH_MODULE(Llama);

struct Args {
  int64_t steps = 20, batch = 4, micro_steps = 1, seed = 1337;
  double lr = 3e-3;
  LlamaConfig model;
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
                                          {"--vocab", &a.model.vocab}};
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
                                  "--context --vocab --data --log)");
    }
  }
  if (a.data.empty()) throw std::invalid_argument("no --data FILE given (and no built-in corpus in this build)");
  if (a.steps < 1 || a.batch < 1 || a.micro_steps < 1 || a.model.width % a.model.heads != 0 ||
      a.model.width / a.model.heads % 2 != 0) {
    throw std::invalid_argument("need steps, batch, micro-steps >= 1 and an even head size (width / heads)");
  }
  return a;
}

int main(int argc, char** argv) {
  fsdp::MpiEnvironment mpi(&argc, &argv);
  auto group = mpi.world();
  const int rank = group->rank(), world = group->size();
  try {
    const Args args = parse_args(argc, argv);
    fsdp::models::TokenData data(args.data, args.model.context, args.model.vocab);

    torch::manual_seed(args.seed);  // every rank builds the same initial model
    Llama net(args.model);
    int64_t total = 0;
    for (const auto& p : net->parameters()) total += p.numel();
    auto model = fsdp::fully_shard(  // FSDP: every TransformerBlock a unit, the rest the root unit
        net, group, fsdp::FullyShardOptions().wrap_policy(fsdp::module_type_policy<TransformerBlockImpl>()));
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
