// accelkit: the queue of frees that wait for other streams (both memory pools).
#pragma once

#include <accelkit/config.hpp>

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

// Completes the entries of `pending` that are done and keeps the others in
// order. `done(entry)` says whether an entry's stream uses have completed
// (waiting for them first when `wait`); `complete(entry)` returns it to its
// cache. Without `wait`, the scan stops at the first entry not done: frees
// are queued oldest first and a stream reaches them in that order, so the
// rest are most likely not done either. If `done` or `complete` throws
// (having changed nothing), that entry and the ones after it stay queued
// and the ones completed before it leave the queue.
template <class Entry, class Done, class Complete>
void drain_pending(std::vector<Entry>& pending, bool wait, Done&& done, Complete&& complete) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    Entry& p = pending[i];
    bool finished = false;
    try {
      finished = done(p);
      if (finished) complete(p);
    } catch (...) {
      if (kept != i)
        std::move(pending.begin() + static_cast<std::ptrdiff_t>(i), pending.end(),
                  pending.begin() + static_cast<std::ptrdiff_t>(kept));
      pending.resize(kept + (pending.size() - i));
      throw;
    }
    if (finished) continue;
    if (!wait) {
      if (kept != i)
        std::move(pending.begin() + static_cast<std::ptrdiff_t>(i), pending.end(),
                  pending.begin() + static_cast<std::ptrdiff_t>(kept));
      kept += pending.size() - i;
      break;
    } else {
      if (kept != i) pending[kept] = std::move(p);  // never self-move: it empties vectors
      ++kept;
    }
  }
  pending.resize(kept);
}

}  // namespace detail
ACCELKIT_END_NAMESPACE
