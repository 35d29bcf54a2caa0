// A runtime made from the contract table (detail/contract.hpp): every member
// present with its exact signature, except the one named by -DOMIT="member"
// (left out) or -DMISTYPE="member" (declared with a wrong type); optional
// members are absent unless named by -DPRESENT="member". NOT_DERIVED and
// INVALID_NAME break the two rules that are not members; VOID_HOST_MAP
// declares host_map returning void. Compiled with
// -fsyntax-only by run_compile_fail.cmake, one case per member and way to get
// it wrong (tests/CMakeLists.txt), to prove that exactly the diagnostic
// naming that member fires.
#include <accelkit/device/backend.hpp>

#include <string_view>
#include <tuple>
#include <type_traits>

using namespace accelkit;

namespace fake {
enum class Mode { present, omitted, mistyped };

// The host signal members go together (Note [Host signals]): naming one of
// them present or mistyped makes the others present, so that only the
// diagnostic of that member fires; PARTIAL_SIGNALS declares one alone. The
// graph members too (Note [Capture rules]); PARTIAL_GRAPHS declares one alone;
// and the virtual memory members (Note [Virtual memory]), PARTIAL_VIRTUAL_MEMORY.
constexpr bool is_signal_member(std::string_view member) {
  return member == "signal_create" || member == "stream_wait_signal" ||
         member == "signal_complete" || member == "signal_destroy";
}
constexpr bool is_graph_member(std::string_view member) {
  return member == "stream_begin_capture" || member == "stream_end_capture" ||
         member == "stream_is_capturing" || member == "graph_instantiate" ||
         member == "graph_launch" || member == "graph_exec_destroy" ||
         member == "graph_destroy";
}
constexpr bool is_vm_member(std::string_view member) {
  return member == "vm_granularity" || member == "vm_reserve" || member == "vm_release" ||
         member == "vm_create" || member == "vm_destroy" || member == "vm_map" ||
         member == "vm_unmap";
}

// The inter-process members (Note [Inter-process memory]): two groups, the
// events needing the memory members, so that naming an event member present
// or mistyped makes the memory members present too; PARTIAL_IPC_MEMORY,
// PARTIAL_IPC_EVENTS (with the memory members) and IPC_EVENTS_ALONE break
// the three rules.
constexpr bool is_ipc_memory_member(std::string_view member) {
  return member == "ipc_mem_export" || member == "ipc_mem_open" || member == "ipc_mem_close";
}
constexpr bool is_ipc_event_member(std::string_view member) {
  return member == "ipc_event_export" || member == "ipc_event_open";
}
constexpr bool ipc_present_with(std::string_view member, std::string_view named) {
  return (is_ipc_memory_member(member) && is_ipc_memory_member(named)) ||
         (is_ipc_event_member(member) && is_ipc_event_member(named)) ||
         (is_ipc_memory_member(member) && is_ipc_event_member(named));
}

constexpr Mode mode_of(std::string_view member, bool required) {
#ifdef OMIT
  if (member == OMIT) return Mode::omitted;
#endif
#ifdef MISTYPE
  if (member == MISTYPE) return Mode::mistyped;
  if (is_signal_member(member) && is_signal_member(MISTYPE)) return Mode::present;
  if (is_graph_member(member) && is_graph_member(MISTYPE)) return Mode::present;
  if (is_vm_member(member) && is_vm_member(MISTYPE)) return Mode::present;
  if (ipc_present_with(member, MISTYPE)) return Mode::present;
#endif
#ifdef PRESENT
  if (member == PRESENT) return Mode::present;
  if (is_signal_member(member) && is_signal_member(PRESENT)) return Mode::present;
  if (is_graph_member(member) && is_graph_member(PRESENT)) return Mode::present;
  if (is_vm_member(member) && is_vm_member(PRESENT)) return Mode::present;
  if (ipc_present_with(member, PRESENT)) return Mode::present;
#endif
#ifdef PARTIAL_SIGNALS
  if (member == "signal_create") return Mode::present;
#endif
#ifdef PARTIAL_GRAPHS
  if (member == "stream_begin_capture") return Mode::present;
#endif
#ifdef PARTIAL_VIRTUAL_MEMORY
  if (member == "vm_map" || member == "vm_unmap") return Mode::present;
#endif
#ifdef PARTIAL_IPC_MEMORY
  if (member == "ipc_mem_export" || member == "ipc_mem_open") return Mode::present;
#endif
#ifdef PARTIAL_IPC_EVENTS
  if (is_ipc_memory_member(member) || member == "ipc_event_open") return Mode::present;
#endif
#ifdef IPC_EVENTS_ALONE
  if (is_ipc_event_member(member)) return Mode::present;
#endif
  return required ? Mode::present : Mode::omitted;
}

// The wrong type a mistyped member is declared with.
struct Mistyped {};

template <class T>
T value() {
  if constexpr (!std::is_void_v<T>) return T{};
}

struct NotARuntime {};
}  // namespace fake

// One base per member, providing it as the mode says.
#define FAKE_MEMBER_(member, Ret, params, ...)                       \
  template <fake::Mode>                                              \
  struct provide_##member {};                                        \
  template <>                                                        \
  struct provide_##member<fake::Mode::present> {                     \
    Ret member params { return fake::value<Ret>(); }                 \
  };                                                                 \
  template <>                                                        \
  struct provide_##member<fake::Mode::mistyped> {                    \
    fake::Mistyped member params { return {}; }                      \
  };
#define FAKE_CONSTANT_(member, Type, ...)                            \
  template <fake::Mode>                                              \
  struct provide_##member {};                                        \
  template <>                                                        \
  struct provide_##member<fake::Mode::present> {                     \
    static constexpr Type member = fake::value_of_##member;          \
  };                                                                 \
  template <>                                                        \
  struct provide_##member<fake::Mode::mistyped> {                    \
    static constexpr fake::Mistyped member{};                        \
  };
namespace fake {
#ifdef INVALID_NAME
constexpr std::string_view value_of_name = "cuda";
#else
constexpr std::string_view value_of_name = "fake";
#endif
constexpr bool value_of_host_kernels = false;
constexpr bool value_of_fork_safe_discovery = true;
}  // namespace fake
ACCELKIT_REQUIRED_MEMBERS(FAKE_MEMBER_)
ACCELKIT_OPTIONAL_MEMBERS(FAKE_MEMBER_)
ACCELKIT_REQUIRED_CONSTANTS(FAKE_CONSTANT_)
ACCELKIT_OPTIONAL_CONSTANTS(FAKE_CONSTANT_)

#define FAKE_REQUIRED_BASE_(member, ...) , provide_##member<fake::mode_of(#member, true)>
#define FAKE_OPTIONAL_BASE_(member, ...) , provide_##member<fake::mode_of(#member, false)>

struct Fake
#ifdef NOT_DERIVED
    : fake::NotARuntime
#else
    : Runtime<Fake>
#endif
      ACCELKIT_REQUIRED_CONSTANTS(FAKE_REQUIRED_BASE_)
      ACCELKIT_REQUIRED_MEMBERS(FAKE_REQUIRED_BASE_)
      ACCELKIT_OPTIONAL_MEMBERS(FAKE_OPTIONAL_BASE_)
      ACCELKIT_OPTIONAL_CONSTANTS(FAKE_OPTIONAL_BASE_) {
#ifdef VOID_HOST_MAP
  // host_map returning nothing, as the contract once had it: mistyped, since
  // the SDK needs the host address the driver chose.
  void host_map(device_index, void*, std::size_t) {}
  void host_unmap(device_index, void*, std::size_t) {}
#endif
};

int main() {
  Backend<Fake> backend(Environment::fixed({}));
  if constexpr (Backend<Fake>::has_virtual_memory()) {
    // The wrappers compile for a runtime with the members.
    [[maybe_unused]] auto wrappers =
        std::make_tuple(&Backend<Fake>::vm_granularity, &Backend<Fake>::vm_reserve,
                        &Backend<Fake>::vm_release, &Backend<Fake>::vm_create,
                        &Backend<Fake>::vm_destroy, &Backend<Fake>::vm_map,
                        &Backend<Fake>::vm_unmap);
  }
  if constexpr (Backend<Fake>::has_ipc_events) {
    [[maybe_unused]] auto wrappers =
        std::make_tuple(&Backend<Fake>::ipc_mem_export, &Backend<Fake>::ipc_mem_open,
                        &Backend<Fake>::ipc_mem_close, &Backend<Fake>::ipc_event_export,
                        &Backend<Fake>::ipc_event_open);
  } else if constexpr (Backend<Fake>::has_ipc_memory) {
    [[maybe_unused]] auto wrappers =
        std::make_tuple(&Backend<Fake>::ipc_mem_export, &Backend<Fake>::ipc_mem_open,
                        &Backend<Fake>::ipc_mem_close);
  }
  if constexpr (detail::has_host_map<Fake>) {
    // The wrapper returns the runtime's host address.
    [[maybe_unused]] void* (Backend<Fake>::*map)(device_index, void*, std::size_t) =
        &Backend<Fake>::host_map;
  }
  return backend.device_count();
}
