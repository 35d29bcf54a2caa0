// simdev's native kernels, through accelkit's vendor-kernel API
// (include/accelkit/torch/kernels.hpp): the float32 operators of small
// elementwise chains and of a multilayer perceptron's forward and backward
// steps run on the current stream's queue, asynchronously, as a device
// kernel would, and so a graph can capture them:
//   add.Tensor (alpha 1), add_.Tensor, mul.Tensor, mul_.Tensor  broadcasting;
//       the other operand may be a CPU scalar (`x * 2.0`)
//   relu, threshold_backward (relu's backward), gelu, gelu_backward
//   mm, addmm (beta and alpha 1, the bias broadcast to the result)
//   sum.dim_IntList (any dims, keepdim; also what `sum` calls)
// Elementwise operands take any strides (at most kMaxDims dims), matrices
// any 2-D strides (autograd passes transposed views). `div.Tensor` is opted
// out of its host kernel (it runs through the CPU fallback). Arguments a
// kernel does not take (other dtypes, alpha or beta other than 1, empty
// reductions or products...) go to the CPU fallback.
//
// A test knob: they are registered only when SIMDEV_NATIVE_KERNELS=1 at the
// library's load (tests/python/test_simdev_kernels.py), so that the rest of
// the suite keeps testing the host kernels.
#include <accelkit/torch/kernels.hpp>

#include "simdev_runtime.hpp"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/threshold_backward_ops.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

namespace {
using Sim = simdev::SimRuntime;
using K = accelkit::Kernels<Sim>;

constexpr int kMaxDims = 8;  // of an elementwise kernel's operands
constexpr std::size_t kMaxRanges = 3;  // the memory ranges one simdev launch names
using Dims = std::array<std::int64_t, kMaxDims>;
using Shape = std::vector<std::int64_t>;

// A float32 tensor of simdev's, strided (the kernels' one dtype and layout).
bool ours(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 &&
         t.layout() == at::kStrided && t.scalar_type() == at::kFloat && !t.is_conj() &&
         !t.is_neg() && t.dim() <= kMaxDims;
}

// `y` as a CPU scalar beside float32 `x`, where the result stays float32 (a
// Python number, or a 0-dim CPU tensor that does not promote).
std::optional<float> cpu_scalar(const at::Tensor& x, const at::Tensor& y) {
  if (!y.defined() || !y.device().is_cpu() || y.dim() != 0 || at::isComplexType(y.scalar_type()))
    return std::nullopt;
  bool wrapped = y.unsafeGetTensorImpl()->is_wrapped_number();
  bool keeps = y.scalar_type() == at::kFloat ||
               at::isIntegralType(y.scalar_type(), /*includeBool=*/true) ||
               (at::isFloatingType(y.scalar_type()) && (wrapped || x.dim() > 0));
  if (!keeps) return std::nullopt;
  return static_cast<float>(y.item<double>());
}

// The broadcast of two shapes (false where they do not broadcast).
bool broadcast(at::IntArrayRef a, at::IntArrayRef b, Shape& out) {
  std::size_t n = std::max(a.size(), b.size());
  out.assign(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t sa = i < a.size() ? a[a.size() - 1 - i] : 1;
    std::int64_t sb = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (sa != sb && sa != 1 && sb != 1) return false;
    out[n - 1 - i] = sa == 1 ? sb : sa;
  }
  return true;
}

// An operand as a kernel addresses it: where it starts, the bytes from there
// to its last element (the memory range launch() names; strides are never
// negative), and its strides over the kernel's shape (0 where it is
// broadcast). Not for empty tensors.
struct Operand {
  float* ptr;
  std::size_t bytes;
  Dims strides;
};
Operand operand(const at::Tensor& t, at::IntArrayRef shape, const float* ptr) {
  Operand o{const_cast<float*>(ptr), 0, {}};
  std::int64_t last = 0;
  for (std::int64_t i = 0; i < t.dim(); ++i) last += (t.size(i) - 1) * t.stride(i);
  o.bytes = static_cast<std::size_t>(last + 1) * sizeof(float);
  auto n = static_cast<std::int64_t>(shape.size());
  for (std::int64_t d = 0; d < n; ++d) {
    std::int64_t e = d - (n - t.dim());
    o.strides[static_cast<std::size_t>(d)] = e >= 0 && t.size(e) == shape[d] ? t.stride(e) : 0;
  }
  return o;
}

// The index space a kernel walks: the shape without its dims of size 1, and
// neighbouring dims that every operand steps through evenly merged into one
// (a contiguous operand's walk is one loop).
template <std::size_t N>
struct Space {
  int ndim = 0;
  Dims sizes{};
  std::array<Dims, N> strides{};
};
template <std::size_t N>
Space<N> space(at::IntArrayRef shape, const std::array<const Dims*, N>& strides) {
  Space<N> s;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = s.ndim > 0;
    for (std::size_t k = 0; k < N && merge; ++k)
      merge = s.strides[k][s.ndim - 1] == (*strides[k])[d] * shape[d];
    if (merge) {
      s.sizes[s.ndim - 1] *= shape[d];
      for (std::size_t k = 0; k < N; ++k) s.strides[k][s.ndim - 1] = (*strides[k])[d];
      continue;
    }
    s.sizes[s.ndim] = shape[d];
    for (std::size_t k = 0; k < N; ++k) s.strides[k][s.ndim] = (*strides[k])[d];
    ++s.ndim;
  }
  return s;
}

// Calls f(offsets) for every index of `s` in row-major order, offsets[k]
// being operand k's element offset.
template <std::size_t N, class F>
void for_each(const Space<N>& s, F&& f) {
  std::array<std::int64_t, N> base{};
  if (s.ndim == 0) {
    f(base);
    return;
  }
  const int last = s.ndim - 1;
  Dims index{};
  for (;;) {
    std::array<std::int64_t, N> o = base;
    for (std::int64_t i = 0; i < s.sizes[last]; ++i) {
      f(o);
      for (std::size_t k = 0; k < N; ++k) o[k] += s.strides[k][last];
    }
    int d = last - 1;
    for (; d >= 0; --d) {
      if (++index[d] < s.sizes[d]) {
        for (std::size_t k = 0; k < N; ++k) base[k] += s.strides[k][d];
        break;
      }
      for (std::size_t k = 0; k < N; ++k) base[k] -= s.strides[k][d] * (s.sizes[d] - 1);
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// Launches `fn` on `s` naming the memory ranges of `ops` (the runtime's
// errors as PyTorch's), and reports the work.
template <class F, class... Op>
void launch(const accelkit::KernelStream& s, const char* what, F&& fn, const Op&... ops) {
  static_assert(sizeof...(Op) <= kMaxRanges, "simdev's launch names at most 3 memory ranges");
  K::translated([&] {
    K::runtime().launch(s.device, s.handle, what, std::forward<F>(fn), {{ops.ptr, ops.bytes}...});
  });
}

// Where the kernel running on `s` reads and writes `p` (the device's view in
// mapped mode).
float* dev(const accelkit::KernelStream& s, float* p) {
  return K::runtime().device_address(s.device, p);
}

// out = f(x) elementwise, out new and laid out as x; false where x is not
// taken.
template <class F>
bool unary(const char* what, const at::Tensor& x, F f, at::Tensor& out) {
  if (!ours(x)) return false;
  out = at::empty_like(x);  // the caching pool, on the current stream
  if (out.numel() == 0) return true;
  accelkit::KernelStream s = K::current_stream(x);
  // x may come from another stream: the pool must not hand its memory out
  // again before this kernel has read it.
  K::record_stream(x, s);
  Operand o = operand(out, out.sizes(), out.mutable_data_ptr<float>());
  Operand a = operand(x, out.sizes(), x.const_data_ptr<float>());
  Space<2> sp = space<2>(out.sizes(), {&o.strides, &a.strides});
  launch(
      s, what,
      [sp, po = dev(s, o.ptr), pa = dev(s, a.ptr), f] {
        for_each(sp, [&](const std::array<std::int64_t, 2>& i) { po[i[0]] = f(pa[i[1]]); });
      },
      o, a);
  K::enqueued(s);
  return true;
}

// out = f(x, y) elementwise over the broadcast of x and y (with `scalars`,
// y may be a CPU scalar). `out` undefined: a new tensor (laid out as x where
// x has the result's shape); else x itself (in place). False where the
// arguments are not taken.
template <class F>
bool binary(const char* what, const at::Tensor& x, const at::Tensor& y, F f, at::Tensor& out,
            bool scalars) {
  if (!ours(x)) return false;
  std::optional<float> scalar = scalars ? cpu_scalar(x, y) : std::nullopt;
  if (!scalar && (!ours(y) || y.device() != x.device())) return false;
  Shape shape = x.sizes().vec();
  if (!scalar && !broadcast(x.sizes(), y.sizes(), shape)) return false;
  if (shape.size() > static_cast<std::size_t>(kMaxDims)) return false;
  if (out.defined()) {  // in place: x is written
    if (at::IntArrayRef(shape) != x.sizes() ||
        at::has_internal_overlap(x) != at::MemOverlap::No)
      return false;
    if (!scalar && y.storage().is_alias_of(x.storage())) {
      auto overlap = at::get_overlap_status(x, y);
      if (overlap != at::MemOverlapStatus::Full && overlap != at::MemOverlapStatus::No)
        return false;
    }
  } else {
    out = at::IntArrayRef(shape) == x.sizes() ? at::empty_like(x)
                                              : at::empty(shape, x.options());
  }
  if (out.numel() == 0) return true;
  accelkit::KernelStream s = K::current_stream(x);
  K::record_stream(x, s);
  if (!scalar) K::record_stream(y, s);
  Operand o = operand(out, shape, out.mutable_data_ptr<float>());
  Operand a = operand(x, shape, x.const_data_ptr<float>());
  if (scalar) {
    Space<2> sp = space<2>(shape, {&o.strides, &a.strides});
    launch(
        s, what,
        [sp, po = dev(s, o.ptr), pa = dev(s, a.ptr), c = *scalar, f] {
          for_each(sp, [&](const std::array<std::int64_t, 2>& i) { po[i[0]] = f(pa[i[1]], c); });
        },
        o, a);
  } else {
    Operand b = operand(y, shape, y.const_data_ptr<float>());
    Space<3> sp = space<3>(shape, {&o.strides, &a.strides, &b.strides});
    launch(
        s, what,
        [sp, po = dev(s, o.ptr), pa = dev(s, a.ptr), pb = dev(s, b.ptr), f] {
          for_each(sp, [&](const std::array<std::int64_t, 3>& i) {
            po[i[0]] = f(pa[i[1]], pb[i[2]]);
          });
        },
        o, a, b);
  }
  K::enqueued(s);
  return true;
}

const auto plus = [](float a, float b) { return a + b; };
const auto times = [](float a, float b) { return a * b; };

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  at::Tensor out;
  if (alpha.equal(1) && binary("add", self, other, plus, out, true)) return out;
  return K::fallback<at::_ops::add_Tensor>(self, other, alpha);
}

at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  at::Tensor out = self;
  if (alpha.equal(1) && binary("add_", self, other, plus, out, true)) return self;
  return K::fallback<at::_ops::add__Tensor>(self, other, alpha);
}

at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  at::Tensor out;
  if (binary("mul", self, other, times, out, true)) return out;
  return K::fallback<at::_ops::mul_Tensor>(self, other);
}

at::Tensor& mul_(at::Tensor& self, const at::Tensor& other) {
  at::Tensor out = self;
  if (binary("mul_", self, other, times, out, true)) return self;
  return K::fallback<at::_ops::mul__Tensor>(self, other);
}

at::Tensor relu(const at::Tensor& self) {
  at::Tensor out;
  // NaN stays NaN, as the CPU's relu (clamp_min(0)) keeps it.
  if (unary("relu", self, [](float a) { return a > 0.0f || a != a ? a : 0.0f; }, out))
    return out;
  return K::fallback<at::_ops::relu>(self);
}

at::Tensor threshold_backward(const at::Tensor& grad, const at::Tensor& self,
                              const at::Scalar& threshold) {
  at::Tensor out;
  if (!threshold.isComplex()) {
    float t = threshold.to<float>();
    // The CPU's rule: 0 where the input is at most the threshold (NaN passes).
    if (binary("threshold_backward", grad, self,
               [t](float g, float x) { return x <= t ? 0.0f : g; }, out, false))
      return out;
  }
  return K::fallback<at::_ops::threshold_backward>(grad, self, threshold);
}

// gelu's two forms (approximate "none": the normal CDF by erf; "tanh"), in
// double and rounded once.
constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kBeta = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kKappa = 0.044715;
float gelu_erf(float v) {
  double x = v;
  return static_cast<float>(0.5 * x * (1.0 + std::erf(x * kSqrtHalf)));
}
float gelu_tanh(float v) {
  double x = v;
  return static_cast<float>(0.5 * x * (1.0 + std::tanh(kBeta * (x + kKappa * x * x * x))));
}
float gelu_erf_backward(float g, float v) {
  double x = v;
  double cdf = 0.5 * (1.0 + std::erf(x * kSqrtHalf));
  double pdf = kInvSqrt2Pi * std::exp(-0.5 * x * x);
  return static_cast<float>(g * (cdf + x * pdf));
}
float gelu_tanh_backward(float g, float v) {
  double x = v;
  double inner = kBeta * (x + kKappa * x * x * x);
  double th = std::tanh(inner);
  double left = 0.5 * x, right = 1.0 + th;
  double d_right = left * (1.0 - th * th) * kBeta * (1.0 + 3.0 * kKappa * x * x);
  return static_cast<float>(g * (0.5 * right + d_right));
}

at::Tensor gelu(const at::Tensor& self, c10::string_view approximate) {
  at::Tensor out;
  if ((approximate == "none" && unary("gelu", self, gelu_erf, out)) ||
      (approximate == "tanh" && unary("gelu", self, gelu_tanh, out)))
    return out;
  return K::fallback<at::_ops::gelu>(self, approximate);
}

at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& self,
                         c10::string_view approximate) {
  at::Tensor out;
  if ((approximate == "none" &&
       binary("gelu_backward", grad, self, gelu_erf_backward, out, false)) ||
      (approximate == "tanh" &&
       binary("gelu_backward", grad, self, gelu_tanh_backward, out, false)))
    return out;
  return K::fallback<at::_ops::gelu_backward>(grad, self, approximate);
}

// A matrix operand: its range and its two strides.
struct Matrix {
  float* ptr;
  std::size_t bytes;
  std::int64_t s0, s1;
};
Matrix matrix(const at::Tensor& t) {
  Operand o = operand(t, t.sizes(), t.const_data_ptr<float>());
  return {o.ptr, o.bytes, t.stride(0), t.stride(1)};
}

// c (n x m, rows of m) = a (n x k) @ b (k x m), or c += it, any strides of
// a and b, summed in double. The loop order follows b's layout: rows of b
// (i, k, j) or its columns (i, j, k: a transposed weight, each element a dot
// product summed in four independent parts so that the additions overlap).
void matmul(const float* a, std::int64_t sa0, std::int64_t sa1, const float* b, std::int64_t sb0,
            std::int64_t sb1, float* c, std::int64_t n, std::int64_t k, std::int64_t m,
            bool accumulate) {
  if (sb0 == 1 && sb1 != 1) {
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < m; ++j) {
        const float* ai = a + i * sa0;
        const float* bj = b + j * sb1;
        double part[4] = {0.0, 0.0, 0.0, 0.0};
        std::int64_t l = 0;
        for (; l + 4 <= k; l += 4)
          for (int q = 0; q < 4; ++q) part[q] += double(ai[(l + q) * sa1]) * double(bj[l + q]);
        for (; l < k; ++l) part[0] += double(ai[l * sa1]) * double(bj[l]);
        double acc = (part[0] + part[1]) + (part[2] + part[3]);
        c[i * m + j] = static_cast<float>(accumulate ? c[i * m + j] + acc : acc);
      }
    return;
  }
  std::vector<double> row(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < n; ++i) {
    float* ci = c + i * m;
    for (std::int64_t j = 0; j < m; ++j) row[j] = accumulate ? ci[j] : 0.0;
    for (std::int64_t l = 0; l < k; ++l) {
      double x = a[i * sa0 + l * sa1];
      const float* bl = b + l * sb0;
      for (std::int64_t j = 0; j < m; ++j) row[j] += x * double(bl[j * sb1]);
    }
    for (std::int64_t j = 0; j < m; ++j) ci[j] = static_cast<float>(row[j]);
  }
}

// Two matrices this kernel multiplies (2-D float32 on one device, k > 0).
bool multipliable(const at::Tensor& a, const at::Tensor& b) {
  return ours(a) && ours(b) && a.device() == b.device() && a.dim() == 2 && b.dim() == 2 &&
         a.size(1) == b.size(0) && a.size(1) > 0;
}

// Queues out (n x m, contiguous) += or = a @ b on s.
void launch_matmul(const accelkit::KernelStream& s, const char* what, const at::Tensor& a,
                   const at::Tensor& b, const at::Tensor& out, bool accumulate) {
  Matrix ma = matrix(a), mb = matrix(b);
  Operand o = operand(out, out.sizes(), out.mutable_data_ptr<float>());
  launch(
      s, what,
      [pa = dev(s, ma.ptr), pb = dev(s, mb.ptr), pc = dev(s, o.ptr), ma, mb, n = a.size(0),
       k = a.size(1), m = b.size(1), accumulate] {
        matmul(pa, ma.s0, ma.s1, pb, mb.s0, mb.s1, pc, n, k, m, accumulate);
      },
      o, ma, mb);
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  if (!multipliable(self, mat2)) return K::fallback<at::_ops::mm>(self, mat2);
  at::Tensor out = at::empty({self.size(0), mat2.size(1)}, self.options());
  if (out.numel() == 0) return out;
  accelkit::KernelStream s = K::current_stream(self);
  K::record_stream(self, s);
  K::record_stream(mat2, s);
  launch_matmul(s, "mm", self, mat2, out, false);
  K::enqueued(s);
  return out;
}

// Two kernels: the bias broadcast into the result, then the product added
// to it. One kernel would name four memory ranges, and a launch names at
// most kMaxRanges.
at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                 const at::Scalar& beta, const at::Scalar& alpha) {
  Shape shape;
  if (!beta.equal(1) || !alpha.equal(1) || !multipliable(mat1, mat2) || !ours(self) ||
      self.device() != mat1.device() || self.dim() > 2 ||
      !broadcast(self.sizes(), {mat1.size(0), mat2.size(1)}, shape) ||
      shape != Shape{mat1.size(0), mat2.size(1)})
    return K::fallback<at::_ops::addmm>(self, mat1, mat2, beta, alpha);
  at::Tensor out = at::empty(shape, mat1.options());
  if (out.numel() == 0) return out;
  accelkit::KernelStream s = K::current_stream(mat1);
  K::record_stream(self, s);
  K::record_stream(mat1, s);
  K::record_stream(mat2, s);
  Operand o = operand(out, shape, out.mutable_data_ptr<float>());
  Operand c = operand(self, shape, self.const_data_ptr<float>());
  Space<2> sp = space<2>(shape, {&o.strides, &c.strides});
  launch(
      s, "addmm bias",
      [sp, po = dev(s, o.ptr), pc = dev(s, c.ptr)] {
        for_each(sp, [&](const std::array<std::int64_t, 2>& i) { po[i[0]] = pc[i[1]]; });
      },
      o, c);
  launch_matmul(s, "addmm", mat1, mat2, out, true);
  K::enqueued(s);
  return out;
}

// The sum over `dim` (all dims where none is given), summed in double.
at::Tensor sum(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
               std::optional<at::ScalarType> dtype) {
  auto fallback = [&] { return K::fallback<at::_ops::sum_dim_IntList>(self, dim, keepdim, dtype); };
  if (!ours(self) || (dtype && *dtype != at::kFloat) || self.numel() == 0) return fallback();
  const std::int64_t nd = self.dim();
  std::array<bool, kMaxDims> reduced{};
  if (!dim || dim->empty()) {
    reduced.fill(true);
  } else {
    std::int64_t range = std::max<std::int64_t>(nd, 1);  // a 0-dim tensor takes 0 and -1
    for (std::int64_t d : *dim) {
      std::int64_t w = d < 0 ? d + range : d;
      if (w < 0 || w >= range || reduced[w]) return fallback();  // its error
      reduced[w] = true;
    }
  }
  Shape out_shape, kept, gone;
  Dims in_kept{}, in_gone{}, out_kept{};
  for (std::int64_t d = 0; d < nd; ++d) {
    if (!reduced[d]) {
      in_kept[kept.size()] = self.stride(d);
      kept.push_back(self.size(d));
      out_shape.push_back(self.size(d));
    } else {
      in_gone[gone.size()] = self.stride(d);
      gone.push_back(self.size(d));
      if (keepdim) out_shape.push_back(1);
    }
  }
  for (std::int64_t i = static_cast<std::int64_t>(kept.size()) - 1, n = 1; i >= 0; --i) {
    out_kept[i] = n;  // the result is contiguous
    n *= kept[i];
  }
  at::Tensor out = at::empty(out_shape, self.options());
  accelkit::KernelStream s = K::current_stream(self);
  K::record_stream(self, s);
  Operand o = operand(out, out_shape, out.mutable_data_ptr<float>());
  Operand a = operand(self, self.sizes(), self.const_data_ptr<float>());
  Space<2> outer = space<2>(kept, {&out_kept, &in_kept});
  Space<1> inner = space<1>(gone, {&in_gone});
  launch(
      s, "sum",
      [outer, inner, po = dev(s, o.ptr), pa = dev(s, a.ptr)] {
        for_each(outer, [&](const std::array<std::int64_t, 2>& i) {
          const float* base = pa + i[1];
          double acc = 0.0;
          for_each(inner, [&](const std::array<std::int64_t, 1>& j) { acc += base[j[0]]; });
          po[i[0]] = static_cast<float>(acc);
        });
      },
      o, a);
  K::enqueued(s);
  return out;
}

bool enabled() {
  const char* v = std::getenv("SIMDEV_NATIVE_KERNELS");
  return v != nullptr && std::strcmp(v, "1") == 0;
}
}  // namespace

ACCELKIT_KERNELS(simdev::SimRuntime, lib) {
  if (!enabled()) return;
  lib.impl("add.Tensor", TORCH_FN(add));
  lib.impl("add_.Tensor", TORCH_FN(add_));
  lib.impl("mul.Tensor", TORCH_FN(mul));
  lib.impl("mul_.Tensor", TORCH_FN(mul_));
  lib.impl("relu", TORCH_FN(relu));
  lib.impl("threshold_backward", TORCH_FN(threshold_backward));
  lib.impl("gelu", TORCH_FN(gelu));
  lib.impl("gelu_backward", TORCH_FN(gelu_backward));
  lib.impl("mm", TORCH_FN(mm));
  lib.impl("addmm", TORCH_FN(addmm));
  lib.impl("sum.dim_IntList", TORCH_FN(sum));
  lib.fallback("div.Tensor");
}
