// The machine a benchmark ran on, printed before its figures: they mean
// little without it (the same code runs at very different speeds on
// different processors, and a virtual machine's cores are shared).
#pragma once

#include <sched.h>
#include <sys/utsname.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace bench {

// The CPU's model name from /proc/cpuinfo ("model name", as on x86; some
// other kernels say "Model" or "Hardware"), else the machine's architecture.
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  for (const char* key : {"model name", "Model", "Hardware"}) {
    in.clear();
    in.seekg(0);
    while (std::getline(in, line)) {
      if (line.compare(0, std::string(key).size(), key) != 0) continue;
      std::string::size_type colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      if (!value.empty()) return value;
    }
  }
  utsname u{};
  if (::uname(&u) == 0) return std::string(u.machine) + " (no model name in /proc/cpuinfo)";
  return "unknown";
}

// CPUs this process may run on.
inline int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return CPU_COUNT(&set);
}

// One line: "cpu: <model>, <n> usable CPUs".
inline void print_machine() {
  std::printf("cpu: %s, %d usable CPUs\n", cpu_model().c_str(), usable_cpus());
}

}  // namespace bench
