// What every language model shares: the seeded initialization in named order
// and the parameter count (fsdp/language_model.h).

#include "fsdp/language_model.h"

#include "fsdp/fully_shard.h"
#include "models/loss_slices.h"
#include "core/unit_plan.h"

namespace fsdp::models {

int64_t loss_slice_rows(int64_t vocab) {
  TORCH_CHECK(vocab > 0, "loss_slice_rows: the vocabulary must be positive, got ", vocab);
  return std::max<int64_t>(1, kLossSliceElements / vocab);
}

namespace {

constexpr int64_t kIgnoredTarget = -100;  // cross_entropy's default ignore_index

// next_token_loss where the rows take more than one slice. Forward sums the
// loss slice by slice and, where a gradient is wanted, computes it at once
// from the slice's probabilities while they exist, (softmax - one-hot) /
// count, into both products' gradients: nothing is recomputed, and what
// stays for backward is the gradients themselves (hidden's, and the head's
// in an fp32 accumulator), which backward scales by the upstream gradient.
// fp16 computes the gradients' products in fp32, so that an unscaled
// gradient cannot underflow before the loss scale reaches it.
struct SlicedNextTokenLoss : public torch::autograd::Function<SlicedNextTokenLoss> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets, bool want_gradients,
                               double loss_divisor) {
    const int64_t rows = hidden.size(0), slice = loss_slice_rows(weight.size(0));
    const torch::Tensor valid = targets.ne(kIgnoredTarget);
    // The mean's count (a tensor: no wait for a GPU here), or the given divisor.
    const torch::Tensor count = loss_divisor > 0 ? torch::full({}, loss_divisor, hidden.options().dtype(torch::kFloat))
                                                 : valid.sum().to(torch::kFloat);
    const bool want_hidden = want_gradients && hidden.requires_grad();
    const bool want_weight = want_gradients && weight.requires_grad();
    const auto product_dtype = hidden.scalar_type() == torch::kHalf ? torch::kFloat : hidden.scalar_type();
    const torch::Tensor product_weight = (want_hidden || want_weight) ? weight.to(product_dtype) : torch::Tensor();
    torch::Tensor grad_hidden = want_hidden ? torch::empty(hidden.sizes(), hidden.options().dtype(product_dtype))
                                            : torch::Tensor();
    torch::Tensor grad_weight =
        want_weight ? torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat)) : torch::Tensor();
    torch::Tensor total = torch::zeros({}, hidden.options().dtype(torch::kFloat));
    for (int64_t r = 0; r < rows; r += slice) {
      const int64_t n = std::min(slice, rows - r);
      const torch::Tensor h = hidden.narrow(0, r, n), ignored = valid.narrow(0, r, n).logical_not();
      const torch::Tensor index = targets.narrow(0, r, n).clamp_min(0).unsqueeze(1);
      torch::Tensor logits = torch::nn::functional::linear(h, weight).to(torch::kFloat);
      // log-sum-exp in place (logsumexp would take a temporary of the
      // slice's size), leaving the exponentials for the gradient.
      const torch::Tensor picked = logits.gather(1, index), largest = logits.amax(1, /*keepdim=*/true);
      torch::Tensor& exponentials = logits.sub_(largest).exp_();
      const torch::Tensor normalizer = exponentials.sum(1, /*keepdim=*/true);
      total += (largest + normalizer.log() - picked).squeeze(1).masked_fill_(ignored, 0).sum();
      if (!want_hidden && !want_weight) continue;
      // d loss / d logits, in place: (softmax - one-hot) / count, 0 on ignored rows.
      torch::Tensor& probs = exponentials.div_(normalizer);
      probs.scatter_(1, index, probs.gather(1, index) - 1);
      probs.masked_fill_(ignored.unsqueeze(1), 0).div_(count);
      const torch::Tensor grad_logits = probs.to(product_dtype);
      if (want_hidden) {
        torch::Tensor rows_of_grad = grad_hidden.narrow(0, r, n);
        torch::mm_out(rows_of_grad, grad_logits, product_weight);
      }
      if (want_weight) {
        if (product_dtype == torch::kFloat) {
          grad_weight.addmm_(grad_logits.t(), h.to(torch::kFloat));
        } else {
          grad_weight.add_(grad_logits.t().mm(h));
        }
      }
    }
    ctx->saved_data["grad_hidden"] = grad_hidden;
    ctx->saved_data["grad_weight"] = grad_weight;
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return total / count;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    TORCH_CHECK(ctx->saved_data.count("grad_hidden"),
                "next_token_loss: backward through a sliced loss runs once (its gradients are computed in forward "
                "and handed over); retain_graph is not supported");
    torch::Tensor grad_hidden = ctx->saved_data["grad_hidden"].toTensor();
    torch::Tensor grad_weight = ctx->saved_data["grad_weight"].toTensor();
    const auto hidden_dtype = static_cast<torch::ScalarType>(ctx->saved_data["hidden_dtype"].toInt());
    const auto weight_dtype = static_cast<torch::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    ctx->saved_data.clear();
    const torch::Tensor scale = grad_outputs[0].to(torch::kFloat);
    auto scaled = [&](torch::Tensor& grad, torch::ScalarType dtype) {
      return grad.defined() ? grad.mul_(scale.to(grad.scalar_type())).to(dtype) : torch::Tensor();
    };
    return {scaled(grad_hidden, hidden_dtype), scaled(grad_weight, weight_dtype), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

}  // namespace fsdp::models

namespace fsdp::detail {

const EnumNames& enum_names(EnumTag<models::ModelKind>) {
  static const EnumNames names = EnumNames::of<models::ModelKind>("model", {
      {models::ModelKind::kGpt, "gpt"},
      {models::ModelKind::kLlama, "llama"}});
  return names;
}

}  // namespace fsdp::detail

namespace fsdp::models {

TiedLMHeadImpl::TiedLMHeadImpl(const torch::Tensor& tied_weight) {
  weight = register_parameter("weight", tied_weight);
}

torch::Tensor TiedLMHeadImpl::forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }

torch::Tensor next_token_loss(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                              double loss_divisor) {
  TORCH_CHECK(loss_divisor >= 0, "next_token_loss: the loss divisor must be positive (or 0: the mean), got ",
              loss_divisor);
  TORCH_CHECK(weight.dim() == 2 && hidden.size(-1) == weight.size(1),
              "next_token_loss: expected a [vocab, C] weight for hidden states of width ", hidden.size(-1), ", got ",
              weight.sizes());
  const torch::Tensor rows = hidden.reshape({-1, hidden.size(-1)}), flat_targets = targets.reshape({-1});
  TORCH_CHECK(rows.size(0) == flat_targets.size(0), "next_token_loss: ", rows.size(0), " positions but ",
              flat_targets.size(0), " targets");
  if (rows.size(0) <= loss_slice_rows(weight.size(0))) {
    namespace F = torch::nn::functional;
    const torch::Tensor logits = F::linear(rows, weight).to(torch::kFloat);
    if (loss_divisor <= 0) return F::cross_entropy(logits, flat_targets);
    return F::cross_entropy(logits, flat_targets, F::CrossEntropyFuncOptions().reduction(torch::kSum)) / loss_divisor;
  }
  const bool want_gradients = torch::GradMode::is_enabled() && (rows.requires_grad() || weight.requires_grad());
  return SlicedNextTokenLoss::apply(rows, weight, flat_targets, want_gradients, loss_divisor);
}

void LanguageModel::init_weights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& [name, param] : fsdp::unique_named_parameters(*this)) init_parameter(name, param);  // a tied weight once
}

int64_t LanguageModel::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : fsdp::unique_named_parameters(*this)) n += p.second.numel();
  return n;
}

}  // namespace fsdp::models
