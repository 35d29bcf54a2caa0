// accelkit: automatic mixed precision (torch.autocast("<name>")) for the
// backend's autocast key (Note [Autocast policy]).
#pragma once

#include <accelkit/torch/adapter.hpp>

#include <ATen/autocast_mode.h>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Autocast policy]: libtorch registers autocast kernels for CUDA, the
// CPU, XPU, MPS, MTIA and MAIA, but none for AutocastPrivateUse1: without
// the registrations below every operator under torch.autocast("<name>")
// fails to dispatch. The policy is CUDA's, from the operator lists that
// ATen/autocast_mode.h shares between backends: matrix products,
// convolutions and recurrent cells in the lower precision (the autocast
// dtype, float16 unless set); pointwise functions that lose range, norms,
// reductions, softmax and losses in float32; operators of mixed inputs at
// the widest input type; binary_cross_entropy refused, as on CUDA. Every
// other operator falls through to the backend's kernel in its input dtypes.
// Which lower-precision dtypes are allowed is the Python module's business
// (get_amp_supported_dtype, from the capability schema).

inline at::Tensor binary_cross_entropy_under_autocast(const at::Tensor&, const at::Tensor&,
                                                      const std::optional<at::Tensor>&,
                                                      int64_t) {
  TORCH_CHECK(false,
              "binary_cross_entropy (torch.nn.functional.binary_cross_entropy, torch.nn.BCELoss) "
              "is refused under autocast, as on CUDA: in a lower precision it is unsafe. Use "
              "binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss on the logits "
              "(without the sigmoid before it), which autocast runs in float32.");
}

// The kernels of AutocastPrivateUse1 for the aten namespace; the macros of
// ATen/autocast_mode.h register through a torch::Library named `m`.
inline void register_autocast(torch::Library& m) {
  using namespace at;  // the lists name Tensor, Scalar, ScalarType unqualified
#define ACCELKIT_AUTOCAST_LOWER_(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define ACCELKIT_AUTOCAST_FP32_(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define ACCELKIT_AUTOCAST_FP32_OPT_DTYPE_(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define ACCELKIT_AUTOCAST_PROMOTE_(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(ACCELKIT_AUTOCAST_LOWER_)
  AT_FORALL_FP32(ACCELKIT_AUTOCAST_FP32_)
  AT_FORALL_FP32_SET_OPT_DTYPE(ACCELKIT_AUTOCAST_FP32_OPT_DTYPE_)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(ACCELKIT_AUTOCAST_PROMOTE_)
#undef ACCELKIT_AUTOCAST_PROMOTE_
#undef ACCELKIT_AUTOCAST_FP32_OPT_DTYPE_
#undef ACCELKIT_AUTOCAST_FP32_
#undef ACCELKIT_AUTOCAST_LOWER_
  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_under_autocast));
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
