// accelkit: the fused recurrent cells (_thnn_fused_lstm_cell,
// _thnn_fused_gru_cell and their backward), which PyTorch's LSTM and GRU
// call on a PrivateUse1 device as on CUDA (Note [Fused recurrent cells]).
#pragma once

#include <accelkit/torch/common.hpp>
#include <accelkit/torch/fallback.hpp>
#include <accelkit/torch/kernel_table.hpp>

#include <ATen/ATen.h>
#include <ATen/TensorUtils.h>
#include <c10/core/DeviceGuard.h>

#include <optional>
#include <tuple>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Fused recurrent cells]
// ATen's LSTM and GRU cells (nn.LSTM, nn.GRU, LSTMCell, GRUCell) take the
// fused path for a CUDA, XPU or PrivateUse1 input: the matrix products are
// dispatched, and the gates' pointwise work is one operator,
// _thnn_fused_lstm_cell or _thnn_fused_gru_cell, whose backward autograd
// calls (_thnn_fused_lstm_cell_backward_impl, _thnn_fused_gru_cell_backward)
// when it does not record a graph; under create_graph it differentiates
// _thnn_differentiable_*_backward instead, which are composites. The CPU
// has no kernel for the fused operators, so the fallback cannot run them.
// The SDK's kernels compose them from dispatched operators (the backend's
// kernels, or the fallback's), with CUDA's contract: the same argument
// checks and messages, the workspace holding what the backward reads
// (LSTM: the four activated gates, [N, 4H]; GRU: reset, input and new gates,
// hx and the hidden new-gate term, [N, 5H]), and the gates summed as the
// CPU's unfused cell sums them (hidden + input, biases added to each first),
// so results and gradients match the CPU's to rounding. Limits: several
// small operators per step instead of one kernel; a vendor may register its
// own kernel for any of the four (Note [Vendor kernel registration]).
struct RecurrentCells {
  using OptionalTensor = std::optional<at::Tensor>;

  static at::Tensor value(const OptionalTensor& t) { return t.has_value() ? *t : at::Tensor(); }
  static at::Tensor one_minus(const at::Tensor& t) { return at::rsub(t, 1); }

  // CUDA's checks (aten/src/ATen/native/cuda/RNN.cu checkSizes): 2-D gates
  // of one size, 1-D biases of the gates' width, the previous state's
  // numel, every tensor on one device.
  static void check(at::CheckedFrom c, const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                    const at::Tensor& input_bias, const at::Tensor& hidden_bias, int64_t factor,
                    const at::Tensor& prev, const char* prev_name) {
    at::TensorArg ig{input_gates, "input_gates", 1}, hg{hidden_gates, "hidden_gates", 2},
        ib{input_bias, "input_bias", 4}, hb{hidden_bias, "hidden_bias", 5}, p{prev, prev_name, 3};
    at::checkDim(c, ig, 2);
    at::checkSameSize(c, ig, hg);
    int64_t gates_size = input_gates.size(1);
    if (input_bias.defined()) {
      at::checkDim(c, ib, 1);
      at::checkNumel(c, ib, gates_size);
      at::checkSameSize(c, ib, hb);
    }
    at::checkDim(c, p, 2);
    at::checkNumel(c, p, input_gates.size(0) * gates_size / factor);
    for (const at::Tensor* t : {&hidden_gates, &input_bias, &hidden_bias, &prev})
      if (t->defined()) check_same_device(input_gates.device(), t->device(), c);
  }

  // The gates as the CPU's cell sums them: (hidden + b_hh) + (input + b_ih).
  static at::Tensor gates(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                          const at::Tensor& input_bias, const at::Tensor& hidden_bias) {
    if (!input_bias.defined()) return hidden_gates + input_gates;
    return (hidden_gates + hidden_bias) + (input_gates + input_bias);
  }

  // (hy, cy, workspace)
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(
      const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
      const OptionalTensor& input_bias_opt, const OptionalTensor& hidden_bias_opt) {
    at::Tensor input_bias = value(input_bias_opt), hidden_bias = value(hidden_bias_opt);
    check("_thnn_fused_lstm_cell", input_gates, hidden_gates, input_bias, hidden_bias, 4, cx, "cx");
    c10::OptionalDeviceGuard guard(input_gates.device());
    auto g = gates(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1);
    at::Tensor ig = g[0].sigmoid(), fg = g[1].sigmoid(), cg = g[2].tanh(), og = g[3].sigmoid();
    at::Tensor cy = fg * cx + ig * cg;
    at::Tensor hy = og * cy.tanh();
    return {hy, cy, at::cat({ig, fg, cg, og}, 1)};
  }

  // (grad_gates, grad_cx, grad_bias); all undefined when neither gradient is.
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(
      const OptionalTensor& grad_hy_opt, const OptionalTensor& grad_cy_opt, const at::Tensor& cx,
      const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
    at::Tensor grad_hy = value(grad_hy_opt), grad_cy = value(grad_cy_opt);
    if (!grad_hy.defined() && !grad_cy.defined()) return {};
    at::CheckedFrom c = "_thnn_fused_lstm_cell_backward_impl";
    at::TensorArg w{workspace, "workspace", 5}, x{cx, "cx", 3}, y{cy, "cy", 4};
    at::checkDim(c, w, 2);
    at::checkSameSize(c, x, y);
    at::checkNumel(c, w, cx.numel() * 4);
    c10::OptionalDeviceGuard guard(workspace.device());
    auto a = workspace.chunk(4, 1);
    const at::Tensor &ig = a[0], &fg = a[1], &cg = a[2], &og = a[3];
    at::Tensor tanh_cy = cy.tanh();
    at::Tensor gc = grad_cy.defined() ? grad_cy : at::zeros_like(cx);
    at::Tensor gog;
    if (grad_hy.defined()) {
      gog = grad_hy * tanh_cy * one_minus(og) * og;
      gc = gc + grad_hy * og * one_minus(tanh_cy * tanh_cy);
    } else {
      gog = at::zeros_like(og);
    }
    at::Tensor grad_gates = at::cat(
        {gc * cg * one_minus(ig) * ig, gc * cx * one_minus(fg) * fg, gc * ig * one_minus(cg * cg), gog}, 1);
    at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
    return {grad_gates, gc * fg, grad_bias};
  }

  // (hy, workspace)
  static std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates,
                                                     const at::Tensor& hidden_gates,
                                                     const at::Tensor& hx,
                                                     const OptionalTensor& input_bias_opt,
                                                     const OptionalTensor& hidden_bias_opt) {
    at::Tensor input_bias = value(input_bias_opt), hidden_bias = value(hidden_bias_opt);
    check("_thnn_fused_gru_cell", input_gates, hidden_gates, input_bias, hidden_bias, 3, hx, "hx");
    c10::OptionalDeviceGuard guard(input_gates.device());
    auto i = (input_bias.defined() ? input_gates + input_bias : input_gates).chunk(3, 1);
    auto h = (hidden_bias.defined() ? hidden_gates + hidden_bias : hidden_gates).chunk(3, 1);
    at::Tensor rg = (h[0] + i[0]).sigmoid(), ig = (h[1] + i[1]).sigmoid();
    at::Tensor ng = (i[2] + h[2] * rg).tanh();
    at::Tensor hy = (hx - ng) * ig + ng;
    return {hy, at::cat({rg, ig, ng, hx, h[2]}, 1)};
  }

  // (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(
      const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
    at::CheckedFrom c = "_thnn_fused_gru_cell_backward";
    at::TensorArg g{grad_hy, "grad_hy", 1}, w{workspace, "workspace", 2};
    at::checkDim(c, w, 2);
    at::checkNumel(c, w, grad_hy.numel() * 5);
    c10::OptionalDeviceGuard guard(workspace.device());
    auto a = workspace.chunk(5, 1);
    const at::Tensor &rg = a[0], &ig = a[1], &ng = a[2], &hx = a[3], &hn = a[4];
    at::Tensor gin = grad_hy * one_minus(ig) * one_minus(ng * ng);
    at::Tensor grg = gin * hn * one_minus(rg) * rg;
    at::Tensor gig = grad_hy * (hx - ng) * one_minus(ig) * ig;
    at::Tensor grad_input_gates = at::cat({grg, gig, gin}, 1);
    at::Tensor grad_hidden_gates = at::cat({grg, gig, gin * rg}, 1);
    at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
    at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
    return {grad_input_gates, grad_hidden_gates, grad_hy * ig, grad_input_bias, grad_hidden_bias};
  }
};

// Through the registration table (Note [Vendor kernel registration]).
inline void register_recurrent_cells(KernelTable& m) {
  using R = RecurrentCells;
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(R::lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(R::lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(R::gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(R::gru_cell_backward));
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
