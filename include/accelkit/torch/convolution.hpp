// accelkit: convolutions (convolution_overrideable and its backward), run
// through the CPU as the fallback runs other operators, and counted in its
// report.
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/fallback.hpp>
#include <accelkit/torch/host_access.hpp>
#include <accelkit/torch/host_results.hpp>

#include <c10/core/DeviceGuard.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Convolutions reach a backend as convolution_overrideable, whose default
// kernel raises instead of falling back; these run them through the CPU like
// the fallback does (and count in its report).
struct Convolution {
  // The CPU tensors a CPU convolution reads (its tensors all on one device,
  // see one_device): views of the device memory when it is host-visible
  // (after its stream is waited for), copies otherwise.
  struct Inputs {
    bool view = false;
    // Views of memory the host addresses directly: the convolution's results
    // may be made in device memory and adopted (Note [CPU results in device
    // memory]).
    bool in_place = false;
    at::Tensor operator()(const at::Tensor& t) const {
      if (!t.defined()) return t;
      return view ? HostAccess::host_view(t) : t.cpu();
    }
  };
  // Every tensor of a convolution on the first one's device, as a CUDA
  // convolution requires.
  template <class... T>
  static void one_device(const std::string& op, const at::Tensor& first, const T&... rest) {
    ((rest.defined() ? check_same_device(first.device(), rest.device(), op) : void()), ...);
  }
  static Inputs inputs(const at::Tensor& any) {
    device_index d = any.device().index();
    return translated([&] {
      bool view = HostAccess::host_ready(d);
      return Inputs{view, view && HostAccess::host_access(d) == HostAccessLevel::direct};
    });
  }
  // The CPU convolution's result `out` on `like`'s device: adopted where it
  // was made in that device's memory; otherwise, where the device's memory is
  // directly host-visible and its stream was waited for (the inputs were
  // views), written through a CPU view of a new device tensor of its layout,
  // which costs the copy alone (aten::to's way adds a dispatch, an allocation
  // through the dispatcher, a copy queued on the stream and its wait:
  // bench/compile_torch_bench.py).
  static at::Tensor on_device(at::Tensor& out, const at::Tensor& like, const Inputs& cpu) {
    if (!out.defined()) return out;
    if (!cpu.in_place) return out.to(like.device());
    if (at::Tensor adopted = HostResults::adopt(out, like.device()); adopted.defined())
      return adopted;
    c10::DeviceGuard guard(like.device());
    at::Tensor result = at::detail::empty_strided_generic(
        out.sizes(), out.strides(), &device_allocator(),
        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), out.scalar_type());
    HostAccess::host_view(result).copy_(out);
    return result;
  }
  // Runs the CPU convolution f, in device memory where in place.
  template <class F>
  static auto run(const Inputs& cpu, const at::Tensor& like, F&& f) {
    std::optional<HostResults::Scope> scope;
    if (cpu.in_place) scope.emplace(like.device());
    return f();
  }
  // The convolutions run on the host (Note [Refusals during capture]).
  static void refuse_during_capture(const std::string& op, const at::Tensor& input) {
    if (input.device().type() != kDeviceType) return;
    refuse_if_capturing(input.device().index(), [&] {
      return fmt::format("{} (a convolution run by the host through the CPU)", op);
    });
  }
  static at::Tensor forward(const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, c10::SymIntArrayRef stride,
                            c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
                            bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups) {
    static const std::string op = "aten::convolution_overrideable";
    at::Tensor no_bias;
    const at::Tensor& bias_t = bias && bias->defined() ? *bias : no_bias;
    one_device(op, input, weight, bias_t);
    refuse_during_capture(op, input);
    auto timer = Fallback::get().run_named(op);
    Inputs cpu = inputs(input);
    std::optional<at::Tensor> b =
        bias_t.defined() ? std::optional<at::Tensor>(cpu(bias_t)) : std::nullopt;
    at::Tensor out = run(cpu, input, [&] {
      return at::convolution_symint(cpu(input), cpu(weight), b, stride, padding, dilation,
                                    transposed, output_padding, groups);
    });
    return on_device(out, input, cpu);
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
      const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
      c10::SymIntArrayRef stride, c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
      bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups,
      std::array<bool, 3> output_mask) {
    static const std::string op = "aten::convolution_backward_overrideable";
    one_device(op, input, grad_output, weight);
    refuse_during_capture(op, input);
    auto timer = Fallback::get().run_named(op);
    std::vector<c10::SymInt> bias_sizes{weight.sym_size(transposed ? 1 : 0) * groups};
    Inputs cpu = inputs(input);
    auto [gi, gw, gb] = run(cpu, input, [&] {
      return at::convolution_backward_symint(
          cpu(grad_output), cpu(input), cpu(weight), c10::SymIntArrayRef(bias_sizes), stride,
          padding, dilation, transposed, output_padding, groups, output_mask);
    });
    return {on_device(gi, input, cpu), on_device(gw, input, cpu), on_device(gb, input, cpu)};
  }
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
