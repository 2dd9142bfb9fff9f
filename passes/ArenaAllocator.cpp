#include "passes/ArenaAllocator.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>

namespace hb {

// ---- strategies ---------------------------------------------------------------------------------

std::vector<int64_t> GreedyBySizeAllocator::place(const std::vector<BufferRequest>& reqs) const {
  std::vector<int> order(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (reqs[a].size != reqs[b].size) return reqs[a].size > reqs[b].size;
    return reqs[a].start < reqs[b].start;
  });
  std::vector<int64_t> off(reqs.size(), 0);
  std::vector<int> placed;
  for (int r : order) {
    // Buffers placed so far that are live at the same time, by offset; take the smallest gap.
    std::vector<int> busy;
    for (int p : placed)
      if (reqs[p].start <= reqs[r].end && reqs[r].start <= reqs[p].end) busy.push_back(p);
    std::sort(busy.begin(), busy.end(), [&](int a, int b) { return off[a] != off[b] ? off[a] < off[b] : a < b; });
    int64_t best = -1, best_gap = std::numeric_limits<int64_t>::max(), prev_end = 0;
    for (int p : busy) {
      const int64_t gap = off[p] - prev_end;
      if (gap >= reqs[r].size && gap < best_gap) {
        best = prev_end;
        best_gap = gap;
      }
      prev_end = std::max(prev_end, off[p] + reqs[p].size);
    }
    off[r] = best >= 0 ? best : prev_end;
    placed.push_back(r);
  }
  return off;
}

std::vector<int64_t> BestFitAllocator::place(const std::vector<BufferRequest>& reqs) const {
  // Events: a buffer is allocated at its start and freed after its end (frees first at equal times).
  struct Event {
    int64_t time;
    int kind;  // 0 free, 1 alloc
    int req;
  };
  std::vector<Event> ev;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ev.push_back({reqs[i].start, 1, static_cast<int>(i)});
    ev.push_back({static_cast<int64_t>(reqs[i].end) + 1, 0, static_cast<int>(i)});
  }
  std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) {
    if (a.time != b.time) return a.time < b.time;
    if (a.kind != b.kind) return a.kind < b.kind;
    return a.req < b.req;
  });
  std::vector<int64_t> off(reqs.size(), 0);
  std::map<int64_t, int64_t> free_chunks;  // offset -> size
  int64_t top = 0;
  for (const Event& e : ev) {
    const int64_t size = reqs[e.req].size;
    if (e.kind == 0) {  // free and coalesce
      int64_t o = off[e.req], s = size;
      if (s == 0) continue;
      auto next = free_chunks.find(o + s);
      if (next != free_chunks.end()) {
        s += next->second;
        free_chunks.erase(next);
      }
      auto prev = free_chunks.lower_bound(o);
      if (prev != free_chunks.begin()) {
        --prev;
        if (prev->first + prev->second == o) {
          o = prev->first;
          s += prev->second;
          free_chunks.erase(prev);
        }
      }
      if (o + s == top) top = o;  // the top chunk shrinks the arena's high-water mark back
      else free_chunks[o] = s;
      continue;
    }
    if (size == 0) {
      off[e.req] = 0;
      continue;
    }
    auto best = free_chunks.end();
    for (auto it = free_chunks.begin(); it != free_chunks.end(); ++it)
      if (it->second >= size && (best == free_chunks.end() || it->second < best->second)) best = it;
    if (best != free_chunks.end()) {
      off[e.req] = best->first;
      const int64_t rest_o = best->first + size, rest_s = best->second - size;
      free_chunks.erase(best);
      if (rest_s > 0) free_chunks[rest_o] = rest_s;
    } else {
      off[e.req] = top;
      top += size;
    }
  }
  return off;
}

std::vector<const ArenaAllocator*> allocators() {
  static const GreedyBySizeAllocator greedy;
  static const BestFitAllocator best_fit;
  return {&greedy, &best_fit};
}

const ArenaAllocator* find_allocator(const std::string& name) {
  for (const ArenaAllocator* a : allocators())
    if (name == a->name()) return a;
  return nullptr;
}

}  // namespace hb
