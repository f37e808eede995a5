#include "fsdp/nn/lm_loss.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include "fsdp/common/error.h"
#include "fsdp/nn/logits_layout.h"
#include "kernels/kernels.h"

namespace fsdp::nn {
namespace {

// PyTorch's cross_entropy default: rows with this target add nothing.
constexpr int64_t kIgnoreIndex = -100;

int64_t counted_rows(const at::Tensor& targets, int64_t vocab) {
  const auto* t = targets.data_ptr<int64_t>();
  int64_t valid = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    if (t[i] == kIgnoreIndex) continue;
    FSDP_CHECK(t[i] >= 0 && t[i] < vocab, "lm_loss: target ", t[i], " at row ", i, " is outside the vocabulary [0, ",
               vocab, ")");
    ++valid;
  }
  return valid;
}

// Turns logits (n, V), fp32 or bf16, in place into the gradient of
// sum(row losses) * grad_scale and returns the sum of the row losses: one
// read and one write of the logits (kernels::softmax_cross_entropy_row),
// where log_softmax, nll_loss and their backwards make five passes.
double loss_and_gradient_(at::Tensor& logits, const at::Tensor& targets, float grad_scale,
                          std::vector<double>* rows_out = nullptr) {
  RECORD_USER_SCOPE("fsdp::cross_entropy_rows");
  const int64_t n = logits.size(0), vocab = logits.size(1);
  const bool bf16 = logits.scalar_type() == at::kBFloat16;
  auto* floats = bf16 ? nullptr : logits.data_ptr<float>();
  auto* halves = bf16 ? reinterpret_cast<uint16_t*>(logits.data_ptr<at::BFloat16>()) : nullptr;
  const auto* t = targets.data_ptr<int64_t>();
  std::vector<double> row_loss(static_cast<size_t>(n), 0.0);
  at::parallel_for(0, n, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(bf16 ? static_cast<size_t>(vocab) : 0);
    for (int64_t i = begin; i < end; ++i) {
      if (t[i] == kIgnoreIndex) {
        if (bf16) {
          std::fill(halves + i * vocab, halves + (i + 1) * vocab, uint16_t{0});
        } else {
          std::fill(floats + i * vocab, floats + (i + 1) * vocab, 0.0f);
        }
        continue;
      }
      row_loss[static_cast<size_t>(i)] =
          bf16 ? kernels::softmax_cross_entropy_row_bf16(halves + i * vocab, scratch.data(), vocab, t[i], grad_scale)
               : kernels::softmax_cross_entropy_row(floats + i * vocab, vocab, t[i], grad_scale);
    }
  });
  double total = 0;
  for (double l : row_loss) total += l;  // in row order: the same for any thread count
  if (rows_out != nullptr) *rows_out = std::move(row_loss);
  return total;
}

// The same for fp32 logits stored transposed, (V, n): a column per row of
// hidden. Blocks of kernels::kColumns columns go to threads.
double loss_and_gradient_columns_(at::Tensor& logits_t, const at::Tensor& targets, float grad_scale) {
  RECORD_USER_SCOPE("fsdp::cross_entropy_columns");
  const int64_t vocab = logits_t.size(0), n = logits_t.size(1), stride = logits_t.stride(0);
  auto* floats = logits_t.data_ptr<float>();
  const auto* t = targets.data_ptr<int64_t>();
  std::vector<double> row_loss(static_cast<size_t>(n), 0.0);
  const int64_t blocks = (n + kernels::kColumns - 1) / kernels::kColumns;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * kernels::kColumns, width = std::min(kernels::kColumns, n - first);
      int64_t block_targets[kernels::kColumns];
      for (int64_t j = 0; j < width; ++j) block_targets[j] = t[first + j] == kIgnoreIndex ? 0 : t[first + j];
      kernels::softmax_cross_entropy_columns(floats + first, stride, vocab, width, block_targets, grad_scale,
                                             row_loss.data() + first);
      for (int64_t j = 0; j < width; ++j) {
        if (t[first + j] != kIgnoreIndex) continue;
        row_loss[static_cast<size_t>(first + j)] = 0;
        for (int64_t v = 0; v < vocab; ++v) floats[v * stride + first + j] = 0;
      }
    }
  });
  double total = 0;
  for (double l : row_loss) total += l;  // in row order: the same for any thread count
  return total;
}

// fp32 logits are computed transposed, weight x hidden^T, into rows padded
// off a 4 KiB multiple: with a vocabulary far wider than the model, that
// product runs at the machine's matmul rate where hidden x weight^T does
// not. On gpt2-d6 (1024 x 384 x 50257, 2 threads, AMD EPYC) the step's
// matmuls took 966 ms against 1058 and the loss kernel 40 ms against 22
// (bench/profile_summary.py). bf16's head product ran faster the usual
// way round (96 ms against 114), so bf16 keeps it.
bool transposed_logits(const at::Tensor& hidden) { return hidden.scalar_type() == at::kFloat; }

// Logits, contiguous, in bf16 when the matmul runs in bf16, else fp32.
at::Tensor head_logits(const at::Tensor& hidden, const at::Tensor& weight) {
  auto logits = hidden.mm(weight.t());
  if (logits.scalar_type() != at::kBFloat16) logits = logits.to(at::kFloat);
  return logits.contiguous();
}

// grad_logits (n, V) to the gradient of the hidden rows (written
// into grad_hidden) and of the weight (returned, in the matmul's dtype),
// both times `scale`.
at::Tensor head_backward(const at::Tensor& grad_logits, const at::Tensor& hidden, const at::Tensor& weight,
                         double scale, at::Tensor grad_hidden) {
  const auto g = grad_logits.to(hidden.scalar_type());
  auto grad_weight = at::empty(weight.sizes(), hidden.options());
  // The scale rides on the matmuls (beta 0: the outputs are not read), not
  // on a pass over the (V, C) weight gradient afterwards.
  at::addmm_out(grad_hidden, grad_hidden, g, weight, 0, scale);
  at::addmm_out(grad_weight, grad_weight, g.t(), hidden, 0, scale);
  return grad_weight;
}

// The head's matmul and the mean cross-entropy together: forward leaves
// the loss's gradient with respect to the logits where the logits were,
// so backward is two matmuls.
struct LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets) {
    const int64_t valid = counted_rows(targets, weight.size(0));
    const float grad_scale = 1.0f / static_cast<float>(valid);
    double total = 0;
    at::Tensor logits;
    if (transposed_logits(hidden)) {
      const int64_t n = hidden.size(0);
      logits = at::empty({weight.size(0), transposed_logits_stride(n)}, hidden.options()).narrow(1, 0, n);
      at::mm_out(logits, weight, hidden.t());
      total = loss_and_gradient_columns_(logits, targets, grad_scale);
    } else {
      logits = head_logits(hidden, weight);
      total = loss_and_gradient_(logits, targets, grad_scale);
    }
    ctx->save_for_backward({hidden, weight, logits});
    return torch::full({}, total / static_cast<double>(valid), hidden.options().dtype(torch::kFloat));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &grad_logits = saved[2];
    const double scale = grad_outputs[0].item<double>();
    auto grad_hidden = torch::empty_like(hidden);
    if (!transposed_logits(hidden)) {
      return {grad_hidden, head_backward(grad_logits, hidden, weight, scale, grad_hidden), torch::Tensor()};
    }
    // grad_logits is (V, n): its transpose times the weight, and it times hidden.
    auto grad_weight = at::empty(weight.sizes(), hidden.options());
    at::addmm_out(grad_hidden, grad_hidden, grad_logits.t(), weight, 0, scale);
    at::addmm_out(grad_weight, grad_weight, grad_logits, hidden, 0, scale);
    return {grad_hidden, grad_weight, torch::Tensor()};
  }
};

// The same, a chunk of rows at a time, never holding all (N, V) logits:
// backward recomputes each chunk's logits.
struct ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets, int64_t chunk) {
    const int64_t valid = counted_rows(targets, weight.size(0));
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["valid"] = valid;
    double total = 0;
    for (int64_t start = 0; start < hidden.size(0); start += chunk) {
      const int64_t n = std::min(chunk, hidden.size(0) - start);
      auto logits = head_logits(hidden.narrow(0, start, n), weight);
      total += loss_and_gradient_(logits, targets.narrow(0, start, n), 1.0f);
    }
    return torch::full({}, total / static_cast<double>(valid), hidden.options().dtype(torch::kFloat));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &targets = saved[2];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto valid = static_cast<float>(ctx->saved_data["valid"].toInt());
    const double scale = grad_outputs[0].item<double>();
    auto grad_hidden = torch::empty_like(hidden);
    auto grad_weight = torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat));  // summed in fp32
    for (int64_t start = 0; start < hidden.size(0); start += chunk) {
      const int64_t n = std::min(chunk, hidden.size(0) - start);
      const auto h = hidden.narrow(0, start, n);
      auto g = head_logits(h, weight);
      loss_and_gradient_(g, targets.narrow(0, start, n), 1.0f / valid);
      grad_weight.add_(head_backward(g, h, weight, scale, grad_hidden.narrow(0, start, n)));
    }
    return {grad_hidden, grad_weight.to(weight.scalar_type()), torch::Tensor(), torch::Tensor()};
  }
};

// Each sequence's summed log-probability of its targets, the head's matmul
// and the softmax together as in LinearCrossEntropy: forward leaves
// d(-log p)/d(logits) where the logits were (one (n, V) tensor kept, as
// the language-model loss keeps), and backward scales each row by its
// sequence's incoming gradient (negated) before the two matmuls.
struct LinearSequenceLogProbs : public torch::autograd::Function<LinearSequenceLogProbs> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets, int64_t sequences) {
    counted_rows(targets, weight.size(0));
    at::Tensor logits = head_logits(hidden, weight);
    std::vector<double> rows;
    loss_and_gradient_(logits, targets, 1.0f, &rows);
    const int64_t per_sequence = hidden.size(0) / sequences;
    auto out = torch::zeros({sequences}, hidden.options().dtype(torch::kDouble));
    auto* sums = out.data_ptr<double>();
    for (int64_t r = 0; r < hidden.size(0); ++r) sums[r / per_sequence] -= rows[static_cast<size_t>(r)];
    ctx->save_for_backward({hidden, weight, logits});
    ctx->saved_data["per_sequence"] = per_sequence;
    return out.to(torch::kFloat);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1];
    auto grad_logits = saved[2];
    const int64_t per_sequence = ctx->saved_data["per_sequence"].toInt();
    // d(sum log p)/d(logits) is minus what forward left: each row times
    // minus its sequence's incoming gradient.
    const auto row_scale = (-grad_outputs[0].to(torch::kFloat)).repeat_interleave(per_sequence).unsqueeze(1);
    grad_logits.mul_(row_scale.to(grad_logits.scalar_type()));
    auto grad_hidden = torch::empty_like(hidden);
    return {grad_hidden, head_backward(grad_logits, hidden, weight, 1.0, grad_hidden), torch::Tensor(), torch::Tensor()};
  }
};

bool fusable(const torch::Tensor& hidden, const torch::Tensor& weight) {
  return hidden.device().is_cpu() && weight.device().is_cpu();
}

}  // namespace

torch::Tensor lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets) {
  auto h = hidden.reshape({-1, hidden.size(-1)});
  auto t = targets.reshape({-1}).to(torch::kLong).contiguous();
  if (!fusable(h, weight)) {
    return torch::nn::functional::cross_entropy(h.matmul(weight.t()).to(torch::kFloat), t);
  }
  return LinearCrossEntropy::apply(h, weight, t);
}

torch::Tensor chunked_lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                              int64_t chunk_rows) {
  FSDP_CHECK(chunk_rows > 0, "chunked_lm_loss: chunk_rows must be positive, got ", chunk_rows);
  auto h = hidden.reshape({-1, hidden.size(-1)});
  auto t = targets.reshape({-1}).to(torch::kLong).contiguous();
  if (!fusable(h, weight)) return lm_loss(h, weight, t);
  return ChunkedCrossEntropy::apply(h, weight, t, chunk_rows);
}

torch::Tensor sequence_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets) {
  FSDP_CHECK(hidden.dim() == 3 && targets.dim() == 2 && hidden.size(0) == targets.size(0) &&
                 hidden.size(1) == targets.size(1),
             "sequence_log_probs: expected hidden (B, T, C) and targets (B, T)");
  if (fusable(hidden, weight)) {
    return LinearSequenceLogProbs::apply(hidden.reshape({-1, hidden.size(-1)}), weight,
                                         targets.reshape({-1}).to(torch::kLong).contiguous(), hidden.size(0));
  }
  const torch::Tensor logits = torch::matmul(hidden, weight.t()).to(torch::kFloat);
  const torch::Tensor ignored = targets.eq(kIgnoreIndex);
  const torch::Tensor picked =
      torch::log_softmax(logits, -1).gather(-1, targets.masked_fill(ignored, 0).unsqueeze(-1)).squeeze(-1);
  return picked.masked_fill(ignored, 0.0).sum(-1);
}

}  // namespace fsdp::nn
