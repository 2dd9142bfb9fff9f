#include "backend/ir/MemoryPlan.h"

#include <sstream>

namespace hb {

const PlannedBuffer* MemoryPlan::buffer_of(int node, int elem) const {
  for (const PlannedBuffer& b : buffers)
    for (const ValueRef& v : b.values)
      if (v.node == node && v.elem == elem) return &b;
  return nullptr;
}

int64_t MemoryPlan::offset_of(int node, int elem) const {
  const PlannedBuffer* b = buffer_of(node, elem);
  return b ? b->offset : -1;
}

std::string format_bytes(int64_t bytes) {
  static const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  std::ostringstream os;
  if (u == 0) os << bytes << " bytes";
  else {
    os.precision(3);
    os << v << " " << kUnits[u];
  }
  return os.str();
}

std::string to_string(const MemoryPlan& p, const Graph& g) {
  std::ostringstream os;
  auto vname = [&](const ValueRef& v) {
    std::string s = "%" + g.nodes[v.node].name;
    if (v.elem >= 0) s += "." + std::to_string(v.elem);
    return s;
  };
  os << "memory-plan graph " << p.graph << ": arena " << p.arena_bytes << " bytes (" << format_bytes(p.arena_bytes)
     << ") by " << p.strategy << (p.device.empty() ? "" : " on " + p.device) << " for target " << p.target
     << ", no reuse " << p.no_reuse_bytes << ", live peak " << p.live_peak_bytes << ", "
     << p.buffers.size() << " buffers";
  if (p.segments.size() > 1) {
    os << " in " << p.segments.size() << " busy periods (one arena each):";
    for (const ArenaSegment& s : p.segments)
      os << "\n  period [" << s.start << ", " << s.end << "] " << format_bytes(s.bytes);
  }
  for (const PlannedBuffer& b : p.buffers) {
    os << "\n  " << vname(b.values[0]) << ": offset " << b.offset << " size " << b.size << " live [" << b.start
       << ", " << b.end << "]";
    for (size_t k = 1; k < b.values.size(); ++k)
      os << (k == 1 ? " then " : ", ") << vname(b.values[k]) << (k + 1 == b.values.size() ? " in place" : "");
  }
  if (!p.unplanned.empty()) {
    os << "\n  unplanned:";
    for (const UnplannedValue& u : p.unplanned) os << "\n    " << vname(u.value) << " (" << u.why << ")";
  }
  if (!p.note.empty()) os << "\n  " << (p.arena_for_calls ? "" : "arena off for calls: ") << p.note;
  if (!p.output_writes.empty()) {
    os << "\n  written straight into the caller's result when it passes one (a slice loop's slice i):";
    for (const OutputWrite& w : p.output_writes) os << "\n    " << vname({w.node, -1});
  }
  for (const auto& kv : p.bodies) {
    auto it = g.subgraphs.find(kv.first);
    if (it != g.subgraphs.end()) os << "\n" << to_string(*kv.second, *it->second);
  }
  return os.str();
}

}  // namespace hb
