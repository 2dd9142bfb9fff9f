#include "passes/MemoryPlan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "backend/ir/Aliasing.h"
#include "backend/ir/Error.h"
#include "backend/ir/SliceLoop.h"
#include "codegen/TargetModel.h"
#include "passes/ArenaAllocator.h"
#include "passes/HeapSimulator.h"
#include "passes/Lifetimes.h"

namespace hb {

namespace {

constexpr int kForever = Lifetimes::kForever;

int64_t align_up(int64_t n) { return (n + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

bool same_shape(const TensorType& a, const TensorType& b) {
  if (a.dtype != b.dtype || a.shape.size() != b.shape.size()) return false;
  for (size_t i = 0; i < a.shape.size(); ++i)
    if (!a.shape[i].is_static() || !b.shape[i].is_static() || a.shape[i].value != b.shape[i].value) return false;
  for (size_t i = 0; i < a.stride.size() && i < b.stride.size(); ++i)
    if (a.stride[i].value != b.stride[i].value || a.stride[i].symbol != b.stride[i].symbol) return false;
  return true;
}

int64_t arena_of(const std::vector<BufferRequest>& reqs, const std::vector<int64_t>& off) {
  int64_t a = 0;
  for (size_t i = 0; i < reqs.size(); ++i) a = std::max(a, off[i] + reqs[i].size);
  return a;
}


// `calls`: g is run as a graph of its own (step 6 decides whether its calls use the arena); false for a
// slice_loop body, which uses its arena for every slice regardless.
MemoryPlan plan_graph(const Graph& g, const MemoryPlanOptions& opt, bool calls) {
  MemoryPlan P;
  P.graph = g.name;
  P.target = opt.target.name;
  const Lifetimes V = lifetimes(g);
  const int nv = static_cast<int>(V.vals.size());
  auto vname = [&](int v) {
    std::string s = "%" + g.nodes[V.vals[v].node].name;
    if (V.vals[v].elem >= 0) s += "." + std::to_string(V.vals[v].elem);
    return s;
  };
  // 1. Which roots get a buffer; everything else says why not. The target says what it can place;
  //    the arena lives on one device, the one with the most placeable bytes.
  std::vector<int> phys(nv, -1);  // value -> buffer index
  std::vector<bool> plannable(nv, false);
  std::vector<std::string> why(nv);
  std::map<std::string, int64_t> bytes_on;  // device -> placeable bytes there
  for (int v = 0; v < nv; ++v) {
    const Node& node = g.nodes[V.vals[v].node];
    if (V.root[v] != v) why[v] = "view of " + vname(V.root[v]);
    else if (node.op == OpKind::Placeholder) why[v] = "input";
    else if (node.op == OpKind::GetAttr) why[v] = "constant";
    else if (V.last[v] == kForever) why[v] = "output";
    else if (V.bytes[v] < 0) why[v] = "symbolic shape";
    else if (V.bytes[v] == 0) why[v] = "empty";
    else if (!opt.arena) why[v] = "arena off";
    else why[v] = opt.target.why_unplaceable(g, V.vals[v].node);
    if (why[v].empty()) bytes_on[normalize_device(V.type[v]->device)] += V.bytes[v];
  }
  int64_t most = -1;
  for (const auto& kv : bytes_on)
    if (kv.second > most) {
      most = kv.second;
      P.device = kv.first;
    }
  for (int v = 0; v < nv; ++v) {
    if (why[v].empty() && normalize_device(V.type[v]->device) != P.device)
      why[v] = "on " + V.type[v]->device + ", the arena is on " + P.device;
    if (!why[v].empty()) P.unplanned.push_back({V.vals[v], why[v]});
    else plannable[v] = true;
  }
  // 2. Buffers in definition order; an elementwise op's result may take over a dying input's buffer.
  for (int v = 0; v < nv; ++v) {
    if (!plannable[v]) continue;
    const Node& node = g.nodes[V.vals[v].node];
    const int j = V.vals[v].node;
    int reuse = -1;
    if (opt.in_place && V.vals[v].elem < 0 && may_write_over_input(node)) {
      std::vector<int> read_roots;
      node.for_each_input([&](const Arg& a) {
        for (auto it = V.id.lower_bound({a.ref, std::numeric_limits<int>::min()});
             it != V.id.end() && it->first.node == a.ref; ++it)
          read_roots.push_back(it->second);
      });
      for (int y : read_roots) {
        // The op reads y: a buffer of its own (y == x), or a view of x whose elements are x's in x's
        // order, in the layout of the result (an elementwise result written over it meets each element
        // where it was read).
        const int x = V.root[y];
        if (reuse >= 0) break;
        if (!plannable[x] || phys[x] < 0 || V.last[x] != j) continue;
        const bool same = y == x ? same_shape(*V.type[x], *V.type[v])
                                 : V.type[y]->same_dense_elements(*V.type[x]) &&
                                       V.type[y]->same_dense_elements(*V.type[v]);
        if (!same) continue;
        // Every value the op reads from x's storage must be y itself (no second, differently laid out view).
        bool only_y = true;
        for (int z : read_roots) only_y = only_y && (z == y || V.root[z] != x);
        if (only_y) reuse = phys[x];
      }
    }
    if (reuse >= 0) {
      PlannedBuffer& b = P.buffers[reuse];
      b.values.push_back(V.vals[v]);
      b.end = std::max(b.end, V.last[v]);
      phys[v] = reuse;
      continue;
    }
    PlannedBuffer b;
    b.values.push_back(V.vals[v]);
    b.size = align_up(V.bytes[v]);
    b.start = j;
    b.end = V.last[v];
    phys[v] = static_cast<int>(P.buffers.size());
    P.buffers.push_back(b);
  }
  // 3. Busy periods: maximal spans of the order during which some buffer is live. Each is placed on
  //    its own from offset 0 (they never overlap in time), so the runtime may hold one arena per
  //    period, freed between them, or one arena of the largest period's size for all of them.
  std::vector<int> by_start(P.buffers.size());
  for (size_t i = 0; i < by_start.size(); ++i) by_start[i] = static_cast<int>(i);
  std::stable_sort(by_start.begin(), by_start.end(),
                   [&](int a, int b) { return P.buffers[a].start < P.buffers[b].start; });
  for (int b : by_start) {
    PlannedBuffer& buf = P.buffers[b];
    if (P.segments.empty() || buf.start > P.segments.back().end) P.segments.push_back({buf.start, buf.end, 0});
    P.segments.back().end = std::max(P.segments.back().end, buf.end);
    buf.segment = static_cast<int>(P.segments.size()) - 1;
  }
  // 4. Place each period with each strategy; keep the strategy whose largest period is smallest.
  for (const PlannedBuffer& b : P.buffers) P.no_reuse_bytes += b.size;
  const std::string& want = opt.strategy;
  HB_USER_CHECK(want.empty() || find_allocator(want))
      << "memory plan strategy '" << want << "' is not one of greedy-by-size, best-fit";
  bool found = false;
  std::vector<int64_t> best_off(P.buffers.size(), 0), best_seg;
  for (const ArenaAllocator* a : allocators()) {
    if (!want.empty() && want != a->name()) continue;
    std::vector<int64_t> off(P.buffers.size(), 0), seg_bytes(P.segments.size(), 0);
    for (size_t k = 0; k < P.segments.size(); ++k) {
      std::vector<int> members;
      std::vector<BufferRequest> reqs;
      for (size_t i = 0; i < P.buffers.size(); ++i) {
        if (P.buffers[i].segment != static_cast<int>(k)) continue;
        members.push_back(static_cast<int>(i));
        reqs.push_back({P.buffers[i].size, P.buffers[i].start, P.buffers[i].end});
      }
      const std::vector<int64_t> o = a->place(reqs);
      for (size_t m = 0; m < members.size(); ++m) off[members[m]] = o[m];
      seg_bytes[k] = arena_of(reqs, o);
    }
    const int64_t arena = seg_bytes.empty() ? 0 : *std::max_element(seg_bytes.begin(), seg_bytes.end());
    if (!found || arena < P.arena_bytes) {
      found = true;
      P.arena_bytes = arena;
      P.strategy = a->name();
      best_off = off;
      best_seg = seg_bytes;
    }
  }
  for (size_t i = 0; i < P.buffers.size(); ++i) P.buffers[i].offset = best_off[i];
  for (size_t k = 0; k < P.segments.size(); ++k) P.segments[k].bytes = best_seg[k];
  // 5. The lower bound: the most planned bytes live at one node.
  std::vector<int64_t> delta(g.nodes.size() + 1, 0);
  for (const PlannedBuffer& b : P.buffers) {
    delta[b.start] += b.size;
    delta[b.end + 1] -= b.size;
  }
  int64_t live = 0;
  for (int64_t d : delta) P.live_peak_bytes = std::max(P.live_peak_bytes, live += d);
  // 6. Calls: the arena is held from its first placed value to its last while unplaced values (multi-
  //    output ops, views' bases ...) come and go around it: keep it only if the simulated peak does not grow.
  if (calls && P.arena_bytes > 0) {
    const int64_t with = simulate_peak_with_arena(g, P, opt), without = simulate_peak(g, opt);
    P.arena_for_calls = with <= without;
    P.note = "simulated call peak " + std::to_string(with) + " bytes (" + format_bytes(with) + ") with the arena, " +
             std::to_string(without) + " bytes (" + format_bytes(without) + ") allocating per op";
    if (!P.arena_for_calls)
      P.note += " (the results it cannot place live around the arena); a slice loop running it as its body still "
                "uses the arena, once for all slices";
  }
  // 7. Outputs a caller's destination can take: back through reshaping views nothing else reads (the
  //    destination, contiguous, reshapes alike) to a node the target could place.
  const int out = g.output_node();
  if (opt.arena && out >= 0 && !g.nodes[out].args.empty()) {
    std::vector<int> refs;
    const Arg& a = g.nodes[out].args[0];
    if (a.kind == Arg::Kind::Ref) refs.push_back(a.ref);
    for (const Arg& x : a.items) refs.push_back(x.kind == Arg::Kind::Ref ? x.ref : -1);
    const auto users = g.users();
    std::set<int> taken;
    for (int k = 0; k < static_cast<int>(refs.size()); ++k) {
      int r = refs[k];
      while (r >= 0 && (g.nodes[r].target == "aten::view.default" || g.nodes[r].target == "aten::_unsafe_view.default") &&
             !g.nodes[r].args.empty() && g.nodes[r].args[0].kind == Arg::Kind::Ref &&
             users[g.nodes[r].args[0].ref].size() == 1)
        r = g.nodes[r].args[0].ref;
      if (r < 0 || !taken.insert(r).second) continue;
      const Node& w = g.nodes[r];
      const bool fresh_tensor = w.op == OpKind::CallFunction && w.type.kind == ValueType::Kind::Tensor &&
                                !w.effects.is_view && !w.effects.mutates && !aliases_without_annotation(w);
      if (fresh_tensor && opt.target.why_unplaceable(g, r).empty()) P.output_writes.push_back({k, r});
    }
  }
  // 8. slice_loop bodies: one plan each, reused by every slice.
  for (const Node& node : g.nodes)
    if (const Graph* body = slice_loop_body(g, node); body && !P.bodies.count(node.args[0].s))
      P.bodies[node.args[0].s] = std::make_shared<const MemoryPlan>(plan_graph(*body, opt, false));
  return P;
}

}  // namespace

MemoryPlan memory_plan(const Graph& g, const MemoryPlanOptions& opt) { return plan_graph(g, opt, true); }

bool memory_plan_pass(Graph& g, PassContext& ctx) {
  ctx.memory_plan = std::make_shared<const MemoryPlan>(memory_plan(g, ctx.memory));
  ctx.notes.push_back(to_string(*ctx.memory_plan, g));
  return false;
}


}  // namespace hb
