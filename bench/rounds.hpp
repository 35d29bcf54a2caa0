// Repeated measurements for the C++ benchmarks: a figure is measured in
// several rounds, each side of a comparison taking its turn in every round
// (so that a burst of someone else's work on a shared machine lands on both),
// and reported as its median with the interquartile range.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace bench {

// Nanoseconds per call of f, over n calls after n/10 + 1 calls to warm up.
template <class F>
double ns_per_call(long n, F&& f) {
  for (long i = 0; i < n / 10 + 1; ++i) f();
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         static_cast<double>(n);
}

struct Spread {
  double median = 0, p25 = 0, p75 = 0;
};

// The q-quantile of v (0 <= q <= 1), by rank (no interpolation).
inline double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

inline Spread spread(const std::vector<double>& v) {
  return {percentile(v, 0.5), percentile(v, 0.25), percentile(v, 0.75)};
}

// "12.3 [12.1-12.6]" (with `digits` decimals)
inline std::string format(const Spread& s, int digits = 1) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.*f [%.*f-%.*f]", digits, s.median, digits, s.p25, digits,
                s.p75);
  return buf;
}

// Runs ours() and baseline() in `rounds` alternating rounds (the order
// swapped every other round); returns the spreads of both and of their
// ratio baseline/ours per round.
template <class A, class B>
void interleaved(int rounds, A&& ours, B&& baseline, Spread& a, Spread& b, Spread& ratio) {
  std::vector<double> va, vb, vr;
  for (int r = 0; r < rounds; ++r) {
    double x, y;
    if (r % 2 == 0) {
      x = ours();
      y = baseline();
    } else {
      y = baseline();
      x = ours();
    }
    va.push_back(x);
    vb.push_back(y);
    vr.push_back(y / x);
  }
  a = spread(va);
  b = spread(vb);
  ratio = spread(vr);
}

}  // namespace bench
