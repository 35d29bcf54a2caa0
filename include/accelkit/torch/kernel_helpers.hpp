// accelkit: what a vendor kernel does around its launch whatever the
// driver: its output from the caching pool without a dispatcher call, an
// operand's strides as broadcast, dims merged where every operand allows, a
// Python number or a Scalar read as the kernel's type, and the overlap
// checks an in-place kernel needs. Plain functions of PyTorch's tensors;
// kernels.hpp includes this header.
#pragma once

#include <accelkit/torch/common.hpp>

#include <ATen/ExpandUtils.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE

// An uninitialized output of `on`'s device and dtype, from the backend's
// caching pool on the current stream of that device, made without at::empty's
// dispatcher call: contiguous with `shape`, or, where `like` is given (its
// sizes being `shape`), laid out as at::empty_like(*like) lays it out (its
// strides where dense and non-overlapping, else dense strides in the order
// of its own).
inline at::Tensor empty_output(const at::Tensor& on, c10::IntArrayRef shape,
                               const at::Tensor* like = nullptr) {
  c10::DeviceGuard guard(on.device());  // the allocator takes the current device
  constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  c10::Allocator* alloc = c10::GetAllocator(torch_adapter::kDeviceType);
  if (!like) return at::detail::empty_generic(shape, alloc, keys, on.scalar_type(), std::nullopt);
  if (like->is_non_overlapping_and_dense())
    return at::detail::empty_strided_generic(like->sizes(), like->strides(), alloc, keys,
                                             on.scalar_type());
  return at::detail::empty_strided_generic(
      like->sizes(), at::infer_dense_strides(like->sizes(), like->strides()), alloc, keys,
      on.scalar_type());
}

// The strides of `t` expanded to `shape` (0 where a dim is broadcast), as
// t.expand(shape).strides() gives them without making the view. Leading
// dims `t` lacks get 0. `out` holds shape.size() values.
inline void broadcast_strides(const at::Tensor& t, c10::IntArrayRef shape, std::int64_t* out) {
  c10::IntArrayRef ts = t.sizes(), st = t.strides();
  std::size_t lead = shape.size() - ts.size();
  for (std::size_t d = 0; d < shape.size(); ++d)
    out[d] = d < lead || ts[d - lead] != shape[d] ? 0 : st[d - lead];
}

// The layout of N operands of one shape for a kernel's parameters: drops
// the size-1 dims of `size` and merges each dim into the next where every
// operand's strides (strides[o], one per dim of `size`) allow, writing the
// dims left to out_size[0..ndim) and out_strides[o][0..ndim) (each holding
// M, as out_size does). False, with the outputs unspecified, when more than
// M dims remain or a size or stride does not fit T (an unsigned T takes no
// negative stride).
//   merge_dims<3>(shape, {so, sa, sb}, g.size, {g.so, g.sa, g.sb}, g.ndim)
template <std::size_t N, class T, std::size_t M>
bool merge_dims(c10::IntArrayRef size, const std::array<const std::int64_t*, N>& strides,
                T (&out_size)[M], const std::array<T*, N>& out_strides, T& ndim) {
  c10::SmallVector<std::int64_t, 8> sz;
  c10::SmallVector<std::array<std::int64_t, N>, 8> st;
  for (std::size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 1) continue;
    bool merge = !sz.empty();
    for (std::size_t o = 0; o < N && merge; ++o) merge = st.back()[o] == strides[o][d] * size[d];
    if (!merge) {
      if (sz.size() == M) return false;  // merging never lowers the count again
      sz.push_back(1);
      st.emplace_back();
    }
    sz.back() *= size[d];
    for (std::size_t o = 0; o < N; ++o) st.back()[o] = strides[o][d];
  }
  auto fits = [](std::int64_t v) {
    using L = std::numeric_limits<T>;
    return v >= static_cast<std::int64_t>(L::min()) &&
           (v < 0 || static_cast<std::uint64_t>(v) <= static_cast<std::uint64_t>(L::max()));
  };
  for (std::size_t d = 0; d < sz.size(); ++d) {
    if (!fits(sz[d])) return false;
    out_size[d] = static_cast<T>(sz[d]);
    for (std::size_t o = 0; o < N; ++o) {
      if (!fits(st[d][o])) return false;
      out_strides[o][d] = static_cast<T>(st[d][o]);
    }
  }
  ndim = static_cast<T>(sz.size());
  return true;
}

// A Python number operand (`x + 2.5`, a wrapped CPU tensor of double, int64
// or bool) as T, read without item()'s dispatcher calls; nullopt for any
// other tensor (a complex number included).
template <class T>
std::optional<T> wrapped_number(const at::Tensor& t) {
  if (!t.defined() || !t.unsafeGetTensorImpl()->is_wrapped_number() || !t.device().is_cpu())
    return std::nullopt;
  switch (t.scalar_type()) {
    case at::kDouble: return static_cast<T>(*t.const_data_ptr<double>());
    case at::kLong: return static_cast<T>(*t.const_data_ptr<std::int64_t>());
    case at::kBool: return *t.const_data_ptr<bool>() ? T(1) : T(0);
    default: return std::nullopt;
  }
}

// A real Scalar argument (alpha, beta, a threshold) as T; nullopt where it
// is complex.
template <class T>
std::optional<T> real_number(const at::Scalar& s) {
  if (s.isComplex()) return std::nullopt;
  return static_cast<T>(s.toDouble());
}

// The bytes from `t`'s first element to the end of its last (t not empty;
// strides not negative).
inline std::size_t span_bytes(const at::Tensor& t) {
  std::int64_t last = 0;
  for (std::int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return static_cast<std::size_t>(last + 1) * t.element_size();
}

// Whether no two elements of `t` share memory, as an in-place output must
// be (a sufficient test: its dims sorted by stride, each stepping past the
// extent of the smaller ones; an expanded or otherwise self-overlapping
// view is refused, and so are a few exotic layouts without overlap).
inline bool distinct_elements(const at::Tensor& t) {
  c10::SmallVector<std::pair<std::int64_t, std::int64_t>, 8> dims;  // (stride, size)
  for (std::int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  std::int64_t extent = 0;
  for (auto [stride, size] : dims) {
    if (stride <= extent) return false;
    extent += (size - 1) * stride;
  }
  return true;
}

// Whether an in-place output `out` and an input `in` are the same elements
// (each element read only by the work-item that writes it) or share no
// bytes: a kernel that writes `out` while reading `in` in any order is
// then right.
inline bool same_or_disjoint(const at::Tensor& out, const at::Tensor& in) {
  if (&out == &in || in.numel() == 0 || !out.storage().is_alias_of(in.storage())) return true;
  auto o = static_cast<const char*>(out.const_data_ptr());
  auto i = static_cast<const char*>(in.const_data_ptr());
  if (o == i && out.sizes() == in.sizes() && out.strides() == in.strides()) return true;
  return o + span_bytes(out) <= i || i + span_bytes(in) <= o;
}

ACCELKIT_END_NAMESPACE
