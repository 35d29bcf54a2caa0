// accelkit: sparse layouts refused (Note [Sparse layouts]): refuse_sparse,
// and sparse_fallback, the SparsePrivateUse1 and SparseCsrPrivateUse1
// fallbacks.
#pragma once

#include <accelkit/torch/adapter.hpp>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Sparse layouts]: sparse layouts (COO, CSR and the other compressed
// ones) have no kernels on a generated backend, and PyTorch's sparse kernels
// are per device. Every operator on them (the SparsePrivateUse1 and
// SparseCsrPrivateUse1 fallbacks), and every fallen-back operator whose
// result would be one on the device (x.to_sparse_csr()), raises
// NotImplementedError naming the backend and the operator, instead of
// PyTorch's generic "could not run ... Sparse<name>" or a sparse tensor on
// which composite operators fail obscurely.
inline void refuse_sparse(const c10::OperatorHandle& op) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, backend_name(), ": sparse tensors are not supported on ", backend_name(),
                              " (operator ", op.schema().operator_name(),
                              "); use a strided tensor, or a sparse tensor on the CPU");
}

inline void sparse_fallback(const c10::OperatorHandle& op, torch::jit::Stack*) {
  refuse_sparse(op);
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
