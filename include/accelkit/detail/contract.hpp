// accelkit: the Runtime contract listed once (see runtime.hpp for what each
// member means).
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
//
// Note [The contract table]
// The members are written once, in the tables below; everything else is
// generated from them:
//   - the detection traits (has_<member>, names_<member>), the concepts and
//     is_runtime_v;
//   - the diagnostics, whose signature text is the table's own tokens
//     (#Ret " " #member #params);
//   - Backend<R>'s pass-through functions, for the members marked `forward`
//     (logical device in, physical ordinal to the runtime) or
//     `forward_nonempty` (the same, nothing called for 0 bytes); the members
//     marked `sdk` are wrapped by hand in Backend<R>, which applies the
//     default of an optional member that is absent;
//   - the values of the optional constants, their defaults included
//     (constant_<member><R>);
//   - contract_members, the list with signatures that the compile-fail tests
//     (one case per member and way to get it wrong) and the check of the
//     README's and runtime.hpp's tables (tests/check_contract_docs.py) are
//     made from.
// Adding a member here adds its trait, diagnostic, forwarding function and
// test cases; the two documentation tables fail their check until they list
// it too.
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

// Member functions: X(member, return type, (parameters), how Backend<R> calls
// it, (arguments)). The parameters are the exact signature a runtime
// declares; the arguments are the parameter names.
#define ACCELKIT_REQUIRED_MEMBERS(X)                                                          \
  X(device_count, int, (), sdk, ())                                                           \
  X(properties, DeviceProperties, (device_index device), sdk, (device))                       \
  X(get_device, device_index, (), sdk, ())                                                    \
  X(set_device, void, (device_index device), sdk, (device))                                   \
  X(malloc, void*, (device_index device, std::size_t bytes), sdk, (device, bytes))            \
  X(free, void, (device_index device, void* ptr), sdk, (device, ptr))                         \
  X(host_malloc, void*, (device_index device, std::size_t bytes), sdk, (device, bytes))      \
  X(host_free, void, (device_index device, void* ptr), sdk, (device, ptr))                   \
  X(memcpy, void,                                                                             \
    (device_index device, void* dst, const void* src, std::size_t bytes, CopyKind kind),      \
    forward_nonempty, (device, dst, src, bytes, kind))                                        \
  X(memcpy_async, void,                                                                       \
    (device_index device, void* dst, const void* src, std::size_t bytes, CopyKind kind,       \
     StreamHandle stream, bool host_pinned),                                                  \
    forward_nonempty, (device, dst, src, bytes, kind, stream, host_pinned))                   \
  X(memset_async, void,                                                                       \
    (device_index device, void* ptr, int value, std::size_t bytes, StreamHandle stream),      \
    forward_nonempty, (device, ptr, value, bytes, stream))                                    \
  X(stream_create, StreamHandle, (device_index device, int priority), forward,               \
    (device, priority))                                                                       \
  X(stream_destroy, void, (device_index device, StreamHandle stream), forward,               \
    (device, stream))                                                                         \
  X(stream_query, bool, (device_index device, StreamHandle stream), forward, (device, stream)) \
  X(stream_synchronize, void, (device_index device, StreamHandle stream), forward,           \
    (device, stream))                                                                         \
  X(stream_wait_event, void, (device_index device, StreamHandle stream, EventHandle event),  \
    forward, (device, stream, event))                                                         \
  X(event_create, EventHandle, (device_index device, EventFlags flags), forward,             \
    (device, flags))                                                                          \
  X(event_destroy, void, (device_index device, EventHandle event), forward, (device, event)) \
  X(event_record, void, (device_index device, EventHandle event, StreamHandle stream),       \
    forward, (device, event, stream))                                                         \
  X(event_query, bool, (device_index device, EventHandle event), forward, (device, event))   \
  X(event_synchronize, void, (device_index device, EventHandle event), forward,              \
    (device, event))                                                                          \
  X(device_synchronize, void, (device_index device), forward, (device))

#define ACCELKIT_OPTIONAL_MEMBERS(X)                                                          \
  X(initialize, void, (), sdk, ())                                                            \
  X(memory_info, MemoryInfo, (device_index device), sdk, (device))                            \
  X(can_access_peer, bool, (device_index device, device_index peer), sdk, (device, peer))     \
  X(memcpy_peer_async, void,                                                                  \
    (void* dst, device_index dst_device, const void* src, device_index src_device,            \
     std::size_t bytes, StreamHandle stream),                                                 \
    sdk, (dst, dst_device, src, src_device, bytes, stream))                                   \
  X(event_elapsed_time, float, (device_index device, EventHandle start, EventHandle end), sdk, \
    (device, start, end))                                                                     \
  X(stream_wait_peer_event, void,                                                             \
    (device_index device, StreamHandle stream, device_index event_device, EventHandle event), \
    sdk, (device, stream, event_device, event))                                               \
  X(host_map, void, (device_index device, void* ptr, std::size_t bytes), sdk,                 \
    (device, ptr, bytes))                                                                     \
  X(host_unmap, void, (device_index device, void* ptr, std::size_t bytes), sdk,               \
    (device, ptr, bytes))                                                                     \
  X(signal_create, SignalHandle, (device_index device), sdk, (device))                        \
  X(stream_wait_signal, void,                                                                 \
    (device_index device, StreamHandle stream, SignalHandle signal), sdk,                     \
    (device, stream, signal))                                                                 \
  X(signal_complete, void, (device_index device, SignalHandle signal, int error), sdk,        \
    (device, signal, error))                                                                  \
  X(signal_destroy, void, (device_index device, SignalHandle signal), sdk, (device, signal))

// Constants: C(member, type, default). `static constexpr type member`; a
// required one has no default.
#define ACCELKIT_REQUIRED_CONSTANTS(C) C(name, std::string_view, )
#define ACCELKIT_OPTIONAL_CONSTANTS(C) \
  C(host_kernels, bool, true)          \
  C(fork_safe_discovery, bool, true)

#define ACCELKIT_DETAIL_UNPAREN_(...) __VA_ARGS__
#define ACCELKIT_DETAIL_FUNCTION_SIGNATURE_(member, Ret, params) #Ret " " #member #params
#define ACCELKIT_DETAIL_CONSTANT_SIGNATURE_(member, Type) "static constexpr " #Type " " #member

// One callable per member name: calling it calls that member on the runtime;
// `name` is the member's.
#define ACCELKIT_DETAIL_CALLER_(member, ...)                                  \
  struct call_##member {                                                      \
    static constexpr const char* name = #member;                              \
    template <class R, class... A>                                            \
    auto operator()(R& r, A&&... a) const                                     \
        -> decltype(r.member(std::forward<A>(a)...)) {                        \
      return r.member(std::forward<A>(a)...);                                 \
    }                                                                         \
  };
ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_CALLER_)
ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_CALLER_)
#undef ACCELKIT_DETAIL_CALLER_

// The exact signature test: Caller(R&, parameters...) is valid and returns
// exactly Ret. Signature is the table's function type, Ret(parameters).
template <class Caller, class R, class Signature>
struct signature_test;
template <class Caller, class R, class Ret, class... P>
struct signature_test<Caller, R, Ret(P...)> {
#if ACCELKIT_HAS_CONCEPTS
  static constexpr bool value = requires(Caller c, R& r, P&&... p) {
    { c(r, std::forward<P>(p)...) } -> std::same_as<Ret>;
  };
#else
  static constexpr bool value = [] {
    if constexpr (std::is_invocable_v<Caller, R&, P...>)
      return std::is_same_v<std::invoke_result_t<Caller, R&, P...>, Ret>;
    else
      return false;
  }();
#endif
};

// has_<member><R>: R has the member with exactly the expected signature.
#if ACCELKIT_HAS_CONCEPTS
#define ACCELKIT_DETAIL_TRAIT_(member, Ret, params, ...) \
  template <class R>                                     \
  concept has_##member = signature_test<call_##member, R, Ret params>::value;
#else
#define ACCELKIT_DETAIL_TRAIT_(member, Ret, params, ...) \
  template <class R>                                     \
  inline constexpr bool has_##member = signature_test<call_##member, R, Ret params>::value;
#endif
ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_TRAIT_)
ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_TRAIT_)
#undef ACCELKIT_DETAIL_TRAIT_

// has_<constant><R>: R declares `static constexpr Type constant`, a constant
// expression of exactly that type; names_<constant><R>: R declares something
// of that name.
#define ACCELKIT_DETAIL_CONSTANT_TRAIT_(member, Type, ...)                                   \
  template <class R, class = void>                                                          \
  inline constexpr bool names_##member = false;                                             \
  template <class R>                                                                        \
  inline constexpr bool names_##member<R, std::void_t<decltype(R::member)>> = true;         \
  template <class R, class = void>                                                          \
  inline constexpr bool has_##member = false;                                               \
  template <class R>                                                                        \
  inline constexpr bool has_##member<                                                       \
      R, std::enable_if_t<std::is_same_v<std::remove_cv_t<decltype(R::member)>, Type> &&    \
                          (static_cast<void>(static_cast<Type>(R::member)), true)>> = true;
ACCELKIT_REQUIRED_CONSTANTS(ACCELKIT_DETAIL_CONSTANT_TRAIT_)
ACCELKIT_OPTIONAL_CONSTANTS(ACCELKIT_DETAIL_CONSTANT_TRAIT_)
#undef ACCELKIT_DETAIL_CONSTANT_TRAIT_

// constant_<constant><R>: the value of an optional constant, its default when
// R does not declare it.
#define ACCELKIT_DETAIL_CONSTANT_VALUE_(member, Type, default_value)          \
  template <class R>                                                          \
  constexpr Type constant_value_##member() {                                  \
    if constexpr (has_##member<R>)                                            \
      return R::member;                                                       \
    else                                                                      \
      return default_value;                                                   \
  }                                                                           \
  template <class R>                                                          \
  inline constexpr Type constant_##member = constant_value_##member<R>();
ACCELKIT_OPTIONAL_CONSTANTS(ACCELKIT_DETAIL_CONSTANT_VALUE_)
#undef ACCELKIT_DETAIL_CONSTANT_VALUE_

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

// The table as data: each member's name, its signature as the diagnostics
// print it, and whether it is required.
struct ContractMember {
  std::string_view name;
  std::string_view signature;
  bool required;
};
#define ACCELKIT_DETAIL_ENTRY_REQUIRED_(member, Ret, params, ...) \
  ContractMember{#member, ACCELKIT_DETAIL_FUNCTION_SIGNATURE_(member, Ret, params), true},
#define ACCELKIT_DETAIL_ENTRY_OPTIONAL_(member, Ret, params, ...) \
  ContractMember{#member, ACCELKIT_DETAIL_FUNCTION_SIGNATURE_(member, Ret, params), false},
#define ACCELKIT_DETAIL_CONSTANT_REQUIRED_(member, Type, ...) \
  ContractMember{#member, ACCELKIT_DETAIL_CONSTANT_SIGNATURE_(member, Type), true},
#define ACCELKIT_DETAIL_CONSTANT_OPTIONAL_(member, Type, ...) \
  ContractMember{#member, ACCELKIT_DETAIL_CONSTANT_SIGNATURE_(member, Type), false},
inline constexpr ContractMember contract_members[] = {
    ACCELKIT_REQUIRED_CONSTANTS(ACCELKIT_DETAIL_CONSTANT_REQUIRED_)
    ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_ENTRY_REQUIRED_)
    ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_ENTRY_OPTIONAL_)
    ACCELKIT_OPTIONAL_CONSTANTS(ACCELKIT_DETAIL_CONSTANT_OPTIONAL_)};
#undef ACCELKIT_DETAIL_ENTRY_REQUIRED_
#undef ACCELKIT_DETAIL_ENTRY_OPTIONAL_
#undef ACCELKIT_DETAIL_CONSTANT_REQUIRED_
#undef ACCELKIT_DETAIL_CONSTANT_OPTIONAL_

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

// The host signal members go together (Note [Host signals] in
// device/backend.hpp): how many of them R declares, and whether it has all.
template <class R>
inline constexpr int signal_members_named = int{names_signal_create<R>} +
                                            int{names_stream_wait_signal<R>} +
                                            int{names_signal_complete<R>} +
                                            int{names_signal_destroy<R>};
template <class R>
inline constexpr bool has_stream_signals = has_signal_create<R> && has_stream_wait_signal<R> &&
                                           has_signal_complete<R> && has_signal_destroy<R>;

#define ACCELKIT_DETAIL_AND_HAS_(member, ...) &&has_##member<R>
template <class R>
inline constexpr bool satisfies_contract =
    std::is_base_of_v<Runtime<R>, R> && has_valid_name<R>()
        ACCELKIT_REQUIRED_CONSTANTS(ACCELKIT_DETAIL_AND_HAS_)
            ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_AND_HAS_);
#undef ACCELKIT_DETAIL_AND_HAS_

// Instantiating check_contract<R> fires one static_assert per member that is
// missing or mistyped, each naming the member with its expected signature.
#define ACCELKIT_DETAIL_MISSING_ "accelkit: Runtime is missing or mistypes: "
#define ACCELKIT_DETAIL_MISTYPED_ "accelkit: Runtime mistypes optional member: "
template <class R>
struct check_contract {
  static_assert(std::is_base_of_v<Runtime<R>, R>,
                "accelkit: a runtime must derive from accelkit::Runtime<Self> "
                "(struct MyRuntime : accelkit::Runtime<MyRuntime>)");
  static_assert(has_valid_name<R>(),
                "accelkit: Runtime::name must be a lowercase identifier ([a-z][a-z0-9_]*, at "
                "most 32 characters) and not a PyTorch device type such as \"cuda\"");
#define ACCELKIT_DETAIL_ASSERT_(member, Ret, params, ...) \
  static_assert(has_##member<R>,                          \
                ACCELKIT_DETAIL_MISSING_ ACCELKIT_DETAIL_FUNCTION_SIGNATURE_(member, Ret, params));
#define ACCELKIT_DETAIL_ASSERT_OPTIONAL_(member, Ret, params, ...) \
  static_assert(!names_##member<R> || has_##member<R>,             \
                ACCELKIT_DETAIL_MISTYPED_ ACCELKIT_DETAIL_FUNCTION_SIGNATURE_(member, Ret, params));
#define ACCELKIT_DETAIL_ASSERT_CONSTANT_(member, Type, ...) \
  static_assert(has_##member<R>,                            \
                ACCELKIT_DETAIL_MISSING_ ACCELKIT_DETAIL_CONSTANT_SIGNATURE_(member, Type));
#define ACCELKIT_DETAIL_ASSERT_OPTIONAL_CONSTANT_(member, Type, ...) \
  static_assert(!names_##member<R> || has_##member<R>,               \
                ACCELKIT_DETAIL_MISTYPED_ ACCELKIT_DETAIL_CONSTANT_SIGNATURE_(member, Type));
  ACCELKIT_REQUIRED_CONSTANTS(ACCELKIT_DETAIL_ASSERT_CONSTANT_)
  ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_ASSERT_)
  ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_ASSERT_OPTIONAL_)
  ACCELKIT_OPTIONAL_CONSTANTS(ACCELKIT_DETAIL_ASSERT_OPTIONAL_CONSTANT_)
  static_assert(signal_members_named<R> == 0 || signal_members_named<R> == 4,
                "accelkit: Runtime has some of the host signal members but not all: "
                "signal_create, stream_wait_signal, signal_complete and signal_destroy go "
                "together (Note [Host signals])");
#undef ACCELKIT_DETAIL_ASSERT_
#undef ACCELKIT_DETAIL_ASSERT_OPTIONAL_
#undef ACCELKIT_DETAIL_ASSERT_CONSTANT_
#undef ACCELKIT_DETAIL_ASSERT_OPTIONAL_CONSTANT_
  static constexpr bool value = satisfies_contract<R>;
};
#undef ACCELKIT_DETAIL_MISSING_
#undef ACCELKIT_DETAIL_MISTYPED_

}  // namespace detail

ACCELKIT_END_NAMESPACE
