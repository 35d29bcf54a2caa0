// Prints the Runtime contract as listed in detail/contract.hpp, one member
// per line: "required|<member>|<signature>" or "optional|...". CMake reads it
// at configure time to make the compile-fail cases (tests/CMakeLists.txt),
// and tests/check_contract_docs.py compares it with the list as
// scripts/contract_docs.py reads it and with the tables that script writes.
#include <accelkit/detail/contract.hpp>

#include <cstdio>

int main() {
  for (const auto& m : accelkit::detail::contract_members)
    std::printf("%s|%.*s|%.*s\n", m.required ? "required" : "optional",
                static_cast<int>(m.name.size()), m.name.data(),
                static_cast<int>(m.signature.size()), m.signature.data());
  return 0;
}
