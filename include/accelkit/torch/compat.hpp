// accelkit: what differs between the PyTorch versions the torch adapters
// build against, in one place.
//
// Note [PyTorch versions]
// The adapters are written against the PyTorch of this repository's
// environment (2.13) and must also build against older ones that vendors'
// machines carry (2.11). Each difference found
// is bridged here, by detecting the API itself rather than comparing
// version numbers (the release that changed it need not be known), and
// nowhere else. Found so far:
//   - the structured kernels' output hooks (at::impl::MetaBase and
//     at::TensorIteratorBase: set_output_strided, set_output_raw_strided)
//     take the output's dimension names as a fifth parameter in 2.11
//     (`at::DimnameList names = {}`); 2.13 dropped it, and at::DimnameList
//     with it. MetaOutputs below overrides whichever this PyTorch declares.
//   - a copy-on-write storage materializes through a function the storage
//     holds (StorageImpl::set_materializer) in 2.13; 2.11 calls c10's
//     materialize_cow directly. set_materializer below installs one where
//     the storage takes it, and does nothing on 2.11.
//   - graphs (at::GraphImplInterface in ATen/core/GraphImplInterface.h,
//     behind torch.accelerator.Graph) and the guard's isStreamCapturing
//     are 2.13's: ACCELKIT_TORCH_GRAPH_IMPL says whether the header exists
//     (torch/graph.hpp registers nothing without it), and
//     StreamCapturingGuard overrides isStreamCapturing where the guard
//     interface declares it.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/torch/common.hpp>  // first (Note [CPU kernel stubs])

#include <ATen/TensorIterator.h>
#include <ATen/TensorMeta.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#if __has_include(<ATen/core/GraphImplInterface.h>)
#define ACCELKIT_TORCH_GRAPH_IMPL 1
#else
#define ACCELKIT_TORCH_GRAPH_IMPL 0
#endif

#include <cstdint>
#include <type_traits>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

namespace compat {

// Whether TensorIteratorBase's set_output_raw_strided takes the four
// arguments of 2.13 (2.11 has a fifth, the dimension names, without a
// default there). 2.13 has no at::DimnameList at all: the names' type is
// only ever named through a dependent member pointer (NamesOf), in the
// specialization that this PyTorch instantiates.
template <class T, class = void>
inline constexpr bool takes_four = false;
template <class T>
inline constexpr bool takes_four<
    T, std::void_t<decltype(std::declval<T&>().set_output_raw_strided(
           std::int64_t{}, at::IntArrayRef{}, at::IntArrayRef{}, at::TensorOptions{}))>> = true;
template <class T = at::TensorIteratorBase>
inline constexpr bool meta_takes_names = !takes_four<T>;

// The type of the fifth parameter of a member function (the names).
template <class F>
struct FifthParameter;
template <class C, class Ret, class A, class B, class D, class E, class N>
struct FifthParameter<Ret (C::*)(A, B, D, E, N)> {
  using type = N;
};
template <class T>
using NamesOf = typename FifthParameter<decltype(&T::set_output_raw_strided)>::type;

// TensorIteratorBase's own set_output_raw_strided, not the override: a
// qualified call through T, so that it is looked up only in the MetaOutputs
// that this PyTorch instantiates.
template <class T, class... Names>
void base_raw_strided(T& self, std::int64_t i, at::IntArrayRef sizes, at::IntArrayRef strides,
                      at::TensorOptions options, Names... names) {
  self.T::set_output_raw_strided(i, sizes, strides, options, names...);
}

// Impl (a TensorIterator-based structured kernel class) whose outputs are
// made by Derived::make(i, sizes, strides, options), with the hooks'
// signatures of this PyTorch. Derived calls raw_strided(...) at the end of
// make, for TensorIteratorBase's own bookkeeping.
template <class Impl, class Derived, bool names = meta_takes_names<>>
struct MetaOutputs : Impl {
  void set_output_strided(std::int64_t i, at::IntArrayRef sizes, at::IntArrayRef strides,
                          at::TensorOptions options) override {
    static_cast<Derived*>(this)->make(i, sizes, strides, options);
  }
  void set_output_raw_strided(std::int64_t i, at::IntArrayRef sizes, at::IntArrayRef strides,
                              at::TensorOptions options) override {
    static_cast<Derived*>(this)->make(i, sizes, strides, options);
  }

 protected:
  void raw_strided(std::int64_t i, at::IntArrayRef sizes, at::IntArrayRef strides,
                   at::TensorOptions options) {
    base_raw_strided<at::TensorIteratorBase>(*this, i, sizes, strides, options);
  }
};
template <class Impl, class Derived>
struct MetaOutputs<Impl, Derived, true> : Impl {
  using Names = NamesOf<Impl>;  // at::DimnameList
  void set_output_strided(std::int64_t i, at::IntArrayRef sizes, at::IntArrayRef strides,
                          at::TensorOptions options, Names) override {
    static_cast<Derived*>(this)->make(i, sizes, strides, options);
  }
  void set_output_raw_strided(std::int64_t i, at::IntArrayRef sizes, at::IntArrayRef strides,
                              at::TensorOptions options, Names) override {
    static_cast<Derived*>(this)->make(i, sizes, strides, options);
  }

 protected:
  void raw_strided(std::int64_t i, at::IntArrayRef sizes, at::IntArrayRef strides,
                   at::TensorOptions options) {
    base_raw_strided<at::TensorIteratorBase>(*this, i, sizes, strides, options, Names{});
  }
};

// Makes `fn` the storage's materializer where StorageImpl has them
// (Note [PyTorch versions]); S is c10::StorageImpl.
template <class S, class = void>
inline constexpr bool has_materializer = false;
template <class S>
inline constexpr bool has_materializer<
    S, std::void_t<decltype(std::declval<S&>().set_materializer(nullptr))>> = true;
template <class S>
void set_materializer(S* storage, void (*fn)(S*)) {
  if constexpr (has_materializer<S>) {
    storage->clear_materializer();
    storage->set_materializer(fn);
  } else {
    (void)storage;
    (void)fn;
  }
}

// Base, with isStreamCapturing overridden by Derived::stream_capturing
// where Base (c10::impl::DeviceGuardImplInterface) declares it.
template <class Base, class Derived, class = void>
struct StreamCapturingGuard : Base {};
template <class Base, class Derived>
struct StreamCapturingGuard<Base, Derived, std::void_t<decltype(&Base::isStreamCapturing)>>
    : Base {
  bool isStreamCapturing(const c10::Stream& s) const override {
    return static_cast<const Derived*>(this)->stream_capturing(s);
  }
};

}  // namespace compat
}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
