// accelkit: compile-time checks of the Runtime contract (see runtime.hpp).
//
// Note [Contract diagnostics]
// A vendor who forgets a member, or gets its return type or parameters
// wrong, should read one line that names the member and its expected
// signature, not a page of template backtrace from deep inside the SDK.
// Every member has one detection trait (a named concept under C++20, a
// constexpr test under C++17), and check_contract<R> holds one static_assert
// per member whose message is the exact expected signature. The entry point
// that instantiates a backend (Backend<R>) instantiates check_contract<R>;
// it cannot live at class scope of Runtime<R>, where R is still incomplete.
// The members are listed once, in the X-macro tables below, and everything
// (traits, concepts, static_asserts) is generated from them.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/properties.hpp>
#include <accelkit/types.hpp>

#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>
#if ACCELKIT_HAS_CONCEPTS
#include <concepts>
#endif

ACCELKIT_BEGIN_NAMESPACE

template <class Derived>
class Runtime;

namespace detail {

// X(member, return type, "exact expected signature", R, parameter types...)
#define ACCELKIT_REQUIRED_MEMBERS(X)                                                             \
  X(device_count, int, "int device_count()", R)                                                  \
  X(properties, DeviceProperties, "DeviceProperties properties(device_index device)", R,         \
    device_index)                                                                                \
  X(get_device, device_index, "device_index get_device()", R)                                    \
  X(set_device, void, "void set_device(device_index device)", R, device_index)                   \
  X(malloc, void*, "void* malloc(device_index device, std::size_t bytes)", R, device_index,      \
    std::size_t)                                                                                 \
  X(free, void, "void free(device_index device, void* ptr)", R, device_index, void*)             \
  X(host_malloc, void*, "void* host_malloc(std::size_t bytes)", R, std::size_t)                  \
  X(host_free, void, "void host_free(void* ptr)", R, void*)                                      \
  X(memcpy, void,                                                                                \
    "void memcpy(device_index device, void* dst, const void* src, std::size_t bytes, "           \
    "CopyKind kind)",                                                                            \
    R, device_index, void*, const void*, std::size_t, CopyKind)                                  \
  X(memcpy_async, void,                                                                          \
    "void memcpy_async(device_index device, void* dst, const void* src, std::size_t bytes, "     \
    "CopyKind kind, StreamHandle stream)",                                                       \
    R, device_index, void*, const void*, std::size_t, CopyKind, StreamHandle)                    \
  X(memset_async, void,                                                                          \
    "void memset_async(device_index device, void* ptr, int value, std::size_t bytes, "           \
    "StreamHandle stream)",                                                                      \
    R, device_index, void*, int, std::size_t, StreamHandle)                                      \
  X(stream_create, StreamHandle, "StreamHandle stream_create(device_index device, int priority)", \
    R, device_index, int)                                                                        \
  X(stream_destroy, void, "void stream_destroy(device_index device, StreamHandle stream)", R,    \
    device_index, StreamHandle)                                                                  \
  X(stream_query, bool, "bool stream_query(device_index device, StreamHandle stream)", R,        \
    device_index, StreamHandle)                                                                  \
  X(stream_synchronize, void,                                                                    \
    "void stream_synchronize(device_index device, StreamHandle stream)", R, device_index,        \
    StreamHandle)                                                                                \
  X(stream_wait_event, void,                                                                     \
    "void stream_wait_event(device_index device, StreamHandle stream, EventHandle event)", R,    \
    device_index, StreamHandle, EventHandle)                                                     \
  X(event_create, EventHandle, "EventHandle event_create(device_index device, EventFlags flags)", \
    R, device_index, EventFlags)                                                                 \
  X(event_destroy, void, "void event_destroy(device_index device, EventHandle event)", R,        \
    device_index, EventHandle)                                                                   \
  X(event_record, void,                                                                          \
    "void event_record(device_index device, EventHandle event, StreamHandle stream)", R,         \
    device_index, EventHandle, StreamHandle)                                                     \
  X(event_query, bool, "bool event_query(device_index device, EventHandle event)", R,            \
    device_index, EventHandle)                                                                   \
  X(event_synchronize, void, "void event_synchronize(device_index device, EventHandle event)",  \
    R, device_index, EventHandle)                                                                \
  X(device_synchronize, void, "void device_synchronize(device_index device)", R, device_index)

#define ACCELKIT_OPTIONAL_MEMBERS(X)                                                             \
  X(initialize, void, "void initialize()", R)                                                    \
  X(memory_info, MemoryInfo, "MemoryInfo memory_info(device_index device)", R, device_index)     \
  X(can_access_peer, bool, "bool can_access_peer(device_index device, device_index peer)", R,    \
    device_index, device_index)                                                                  \
  X(memcpy_peer_async, void,                                                                     \
    "void memcpy_peer_async(void* dst, device_index dst_device, const void* src, "               \
    "device_index src_device, std::size_t bytes, StreamHandle stream)",                          \
    R, void*, device_index, const void*, device_index, std::size_t, StreamHandle)                \
  X(event_elapsed_time, float,                                                                   \
    "float event_elapsed_time(device_index device, EventHandle start, EventHandle end)", R,      \
    device_index, EventHandle, EventHandle)

// One callable per member name: calling it calls that member on the runtime.
#define ACCELKIT_DETAIL_CALLER_(member, ...)                                  \
  struct call_##member {                                                      \
    template <class R, class... A>                                            \
    auto operator()(R& r, A&&... a) const                                     \
        -> decltype(r.member(std::forward<A>(a)...)) {                        \
      return r.member(std::forward<A>(a)...);                                 \
    }                                                                         \
  };
ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_CALLER_)
ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_CALLER_)
#undef ACCELKIT_DETAIL_CALLER_

#if ACCELKIT_HAS_CONCEPTS
template <class Caller, class Ret, class R, class... A>
concept member_with_signature = requires(Caller c, R& r, A&&... a) {
  { c(r, std::forward<A>(a)...) } -> std::same_as<Ret>;
};
#else
template <class Caller, class Ret, class R, class... A>
constexpr bool member_with_signature_impl() {
  if constexpr (std::is_invocable_v<Caller, R&, A...>)
    return std::is_same_v<std::invoke_result_t<Caller, R&, A...>, Ret>;
  else
    return false;
}
template <class Caller, class Ret, class R, class... A>
inline constexpr bool member_with_signature = member_with_signature_impl<Caller, Ret, R, A...>();
#endif

// has_<member><R>: R has the member with exactly the expected signature.
#if ACCELKIT_HAS_CONCEPTS
#define ACCELKIT_DETAIL_TRAIT_(member, Ret, sig, ...) \
  template <class R>                                  \
  concept has_##member = member_with_signature<call_##member, Ret, __VA_ARGS__>;
#else
#define ACCELKIT_DETAIL_TRAIT_(member, Ret, sig, ...) \
  template <class R>                                  \
  inline constexpr bool has_##member = member_with_signature<call_##member, Ret, __VA_ARGS__>;
#endif
ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_TRAIT_)
ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_TRAIT_)
#undef ACCELKIT_DETAIL_TRAIT_

// names_<member><R>: R declares something of that name (so an optional member
// that fails has_<member> is mistyped rather than absent). An overloaded or
// templated member is not detected here; it then counts as absent.
#define ACCELKIT_DETAIL_NAMES_(member, ...)                                            \
  template <class R, class = void>                                                     \
  inline constexpr bool names_##member = false;                                        \
  template <class R>                                                                   \
  inline constexpr bool names_##member<R, std::void_t<decltype(&R::member)>> = true;
ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_NAMES_)
#undef ACCELKIT_DETAIL_NAMES_

// `static constexpr std::string_view name`, a constant expression.
template <class R, class = void>
inline constexpr bool has_name = false;
template <class R>
inline constexpr bool has_name<
    R, std::void_t<std::enable_if_t<std::is_convertible_v<decltype(R::name), std::string_view>>,
                   std::integral_constant<std::size_t, std::string_view(R::name).size()>>> = true;

// A backend name becomes a device type string ("simdev:0"), an environment
// variable prefix and a Python module (torch.simdev): a lowercase identifier,
// not one of PyTorch's built-in device types.
constexpr bool is_valid_backend_name(std::string_view n) noexcept {
  if (n.empty() || n.size() > 32 || !(n[0] >= 'a' && n[0] <= 'z')) return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  constexpr std::string_view reserved[] = {"cpu", "cuda", "hip", "xpu", "mps", "meta", "mtia",
                                           "hpu", "xla", "lazy", "ipu", "ve", "vulkan", "fpga",
                                           "maia", "mkldnn", "opengl", "opencl", "ideep",
                                           "privateuseone"};
  for (std::string_view r : reserved)
    if (n == r) return false;
  return true;
}
template <class R>
constexpr bool has_valid_name() {
  if constexpr (has_name<R>)
    return is_valid_backend_name(R::name);
  else
    return true;  // reported by the "missing name" assertion instead
}

#define ACCELKIT_DETAIL_AND_HAS_(member, ...) &&has_##member<R>
template <class R>
inline constexpr bool satisfies_contract =
    std::is_base_of_v<Runtime<R>, R> && has_name<R> &&
    has_valid_name<R>() ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_AND_HAS_);
#undef ACCELKIT_DETAIL_AND_HAS_

// Instantiating check_contract<R> fires one static_assert per member that is
// missing or mistyped, each naming the member with its expected signature.
template <class R>
struct check_contract {
  static_assert(std::is_base_of_v<Runtime<R>, R>,
                "accelkit: a runtime must derive from accelkit::Runtime<Self> "
                "(struct MyRuntime : accelkit::Runtime<MyRuntime>)");
  static_assert(has_name<R>,
                "accelkit: Runtime is missing: static constexpr std::string_view name");
  static_assert(has_valid_name<R>(),
                "accelkit: Runtime::name must be a lowercase identifier ([a-z][a-z0-9_]*, at "
                "most 32 characters) and not a PyTorch device type such as \"cuda\"");
#define ACCELKIT_DETAIL_ASSERT_(member, Ret, sig, ...) \
  static_assert(has_##member<R>, "accelkit: Runtime is missing or mistypes: " sig);
  ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_ASSERT_)
#undef ACCELKIT_DETAIL_ASSERT_
#define ACCELKIT_DETAIL_ASSERT_OPT_(member, Ret, sig, ...)       \
  static_assert(!names_##member<R> || has_##member<R>,           \
                "accelkit: Runtime mistypes optional member: " sig);
  ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_ASSERT_OPT_)
#undef ACCELKIT_DETAIL_ASSERT_OPT_
  static constexpr bool value = satisfies_contract<R>;
};

}  // namespace detail

ACCELKIT_END_NAMESPACE
