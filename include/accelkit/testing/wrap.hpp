// accelkit: a runtime that forwards every member of the contract to another
// runtime, generated from the contract table. The conformance kit observes a
// vendor's runtime through it (testing/observed.hpp), and its own tests break
// one rule at a time by hiding one member.
//
// Note [Wrapped runtimes]
// Problem: the kit must see the calls the SDK makes to a vendor's runtime
// without changing it, and its own tests must break one rule at a time on a
// runtime that keeps every other.
// Decision: Wrap<Self, R> is a Runtime<Self> (CRTP, as the contract wants)
// that holds an R and forwards each required member to it, each optional
// member only if R has it (an empty base otherwise, so the SDK sees what R
// offers and applies the same defaults), and the optional constants as R
// declares them. A derived class hides any member with one of its own of
// the same signature. Every forwarded call first tells Self::note(Member)
// which member it is (a no-op unless Self hides note(): Observed counts the
// calls so).
// Limits: the name is R's, so the wrapped runtime reads the same
// environment variables (<NAME>_VISIBLE_DEVICES) as R; test hooks outside
// the contract are reached through inner().
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/contract.hpp>
#include <accelkit/runtime.hpp>

#include <cstddef>
#include <string_view>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

// Every member of the contract, for call counts.
enum class Member : std::size_t {
#define ACCELKIT_DETAIL_MEMBER_ENUM_(member, ...) member,
  ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_MEMBER_ENUM_)
  ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_MEMBER_ENUM_)
#undef ACCELKIT_DETAIL_MEMBER_ENUM_
  count_
};
inline constexpr std::size_t member_count = static_cast<std::size_t>(Member::count_);
inline constexpr std::string_view member_names[member_count] = {
#define ACCELKIT_DETAIL_MEMBER_NAME_(member, ...) #member,
    ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_MEMBER_NAME_)
    ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_MEMBER_NAME_)
#undef ACCELKIT_DETAIL_MEMBER_NAME_
};

namespace detail {

// One base per optional member: forwards it when R has it, else is empty.
#define ACCELKIT_DETAIL_WRAP_OPTIONAL_(member, Ret, params, kind, args)  \
  template <class Self, class R, bool = ::accelkit::detail::has_##member<R>> \
  struct wrap_##member {};                                               \
  template <class Self, class R>                                         \
  struct wrap_##member<Self, R, true> {                                  \
    Ret member params {                                                  \
      Self& self = static_cast<Self&>(*this);                            \
      self.note(Member::member);                                         \
      return self.inner().member args;                                   \
    }                                                                    \
  };
ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_WRAP_OPTIONAL_)
#undef ACCELKIT_DETAIL_WRAP_OPTIONAL_

}  // namespace detail

#define ACCELKIT_DETAIL_WRAP_BASE_(member, ...) , public detail::wrap_##member<Self, R>
template <class Self, class R>
class Wrap : public Runtime<Self> ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_WRAP_BASE_) {
#undef ACCELKIT_DETAIL_WRAP_BASE_
 public:
  static constexpr std::string_view name = R::name;
#define ACCELKIT_DETAIL_WRAP_CONSTANT_(member, Type, ...) \
  static constexpr Type member = ::accelkit::detail::constant_##member<R>;
  ACCELKIT_OPTIONAL_CONSTANTS(ACCELKIT_DETAIL_WRAP_CONSTANT_)
#undef ACCELKIT_DETAIL_WRAP_CONSTANT_

  template <class... A>
  explicit Wrap(A&&... a) : inner_(std::forward<A>(a)...) {}

  R& inner() noexcept { return inner_; }
  const R& inner() const noexcept { return inner_; }
  // Told of every forwarded call (see the Note); hidden by Self to act on it.
  void note(Member) noexcept {}

#define ACCELKIT_DETAIL_WRAP_REQUIRED_(member, Ret, params, kind, args) \
  Ret member params {                                                   \
    static_cast<Self&>(*this).note(Member::member);                     \
    return inner_.member args;                                          \
  }
  ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_WRAP_REQUIRED_)
#undef ACCELKIT_DETAIL_WRAP_REQUIRED_

 private:
  R inner_;
};

}  // namespace testing
ACCELKIT_END_NAMESPACE
