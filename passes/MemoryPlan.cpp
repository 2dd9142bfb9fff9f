#include "passes/MemoryPlan.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>

#include "backend/ir/Error.h"

namespace hb {

int64_t MemoryPlan::offset_of(int node, int elem) const {
  for (const PlannedBuffer& b : buffers)
    for (const ValueRef& v : b.values)
      if (v.node == node && v.elem == elem) return b.offset;
  return -1;
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

namespace {

constexpr int kForever = Lifetimes::kForever;

int64_t align_up(int64_t n) { return (n + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

}  // namespace

int Lifetimes::find(int node, int elem) const {
  auto it = id.find({node, elem});
  return it == id.end() ? -1 : it->second;
}

Lifetimes lifetimes(const Graph& g) {
  Lifetimes V;
  const int n = static_cast<int>(g.nodes.size());
  auto add = [&](int node, int elem, const TensorType& t) {
    const int k = static_cast<int>(V.vals.size());
    V.vals.push_back({node, elem});
    V.id[{node, elem}] = k;
    V.root.push_back(k);
    auto numel = t.numel();
    V.bytes.push_back(numel ? *numel * dtype_bytes(t.dtype) : -1);
    V.last.push_back(node);
    V.type.push_back(&t);
  };
  // Values and their roots, in order (a view's base is always defined before it).
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    const ValueType& t = node.type;
    const size_t first = V.vals.size();
    if (t.kind == ValueType::Kind::Tensor) add(i, -1, t.tensor);
    if (t.kind == ValueType::Kind::Tuple)
      for (size_t e = 0; e < t.elems.size(); ++e)
        if (t.elems[e].kind == ValueType::Kind::Tensor) add(i, static_cast<int>(e), t.elems[e].tensor);
    if (first == V.vals.size() || node.op != OpKind::CallFunction) continue;
    int base = -1;
    if (node.target == "operator::getitem" && !node.args.empty() && node.args[0].kind == Arg::Kind::Ref) {
      const int k = node.args.size() > 1 ? static_cast<int>(node.args[1].i) : 0;
      base = V.find(node.args[0].ref, k);
      if (base < 0) base = V.find(node.args[0].ref, -1);
    } else if ((node.effects.is_view || node.effects.mutates || aliases_without_annotation(node)) && !node.args.empty() &&
               node.args[0].kind == Arg::Kind::Ref) {
      base = V.find(node.args[0].ref, -1);
    }
    if (base >= 0)
      for (size_t v = first; v < V.vals.size(); ++v) V.root[v] = V.root[base];
  }
  // Reads: each use extends the root's life; the output node makes it live forever.
  const int out = g.output_node();
  V.reads.assign(n, {});
  auto read = [&](int v, int j) {
    int& l = V.last[V.root[v]];
    l = (j == out) ? kForever : std::max(l, j);
    if (std::find(V.reads[j].begin(), V.reads[j].end(), v) == V.reads[j].end()) V.reads[j].push_back(v);
  };
  for (int j = 0; j < n; ++j) {
    const Node& node = g.nodes[j];
    if (node.target == "operator::getitem" && j != out && node.args.size() > 1) {  // reads its element only
      const int v = V.find(node.args[0].ref, static_cast<int>(node.args[1].i));
      if (v >= 0) {
        read(v, j);
        continue;
      }
    }
    node.for_each_input([&](const Arg& a) {
      auto it = V.id.lower_bound({a.ref, std::numeric_limits<int>::min()});
      for (; it != V.id.end() && it->first.node == a.ref; ++it) read(it->second, j);
    });
  }
  return V;
}

namespace {

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

}  // namespace

// The runtime calls each of these through its out= overload with `out` being the dying input itself
// (same shape, strides, dtype): all are TensorIterator kernels, which allow an output that fully
// overlaps an input (as their in-place variants do), or generated out= wrappers that compute the
// functional result first and then copy it into `out`. The row softmax ops (backend/runtime/
// RowSoftmax.h) qualify too: their CUDA kernels read a whole row before a block reduction that every
// thread of the row passes before any writes, and their ATen fallback copies into `out` at the end.
bool may_write_over_input(const Node& n) {
  static const std::set<std::string> k = {
      "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor", "aten::add.Scalar",
      "aten::mul.Scalar", "aten::div.Scalar", "aten::sub.Scalar", "aten::neg.default", "aten::exp.default",
      "aten::exp2.default", "aten::log.default", "aten::tanh.default", "aten::sigmoid.default",
      "aten::relu.default", "aten::gelu.default", "aten::silu.default", "aten::rsqrt.default",
      "aten::sqrt.default", "aten::reciprocal.default", "aten::abs.default", "aten::pow.Tensor_Scalar",
      "aten::clamp.default", "aten::where.self", "aten::maximum.default", "aten::minimum.default",
      "aten::masked_fill.Scalar", "aten::threshold_backward.default", "aten::gelu_backward.default",
      "aten::sigmoid_backward.default", "aten::tanh_backward.default", "aten::silu_backward.default",
      "aten::erf.default", "aten::square.default", "hintbackend::row_softmax.default",
      "hintbackend::row_softmax_backward.default", "hintbackend::row_softmax_recompute_backward.default"};
  return k.count(n.target) > 0;
}

// An op that returns an alias of its first argument although its schema does not say so (so the
// serializer cannot set is_view): the runtime's result IS a view, so it must not get a buffer of its
// own, and its base must live as long as it does.
bool aliases_without_annotation(const Node& n) { return n.target == "aten::_unsafe_view.default"; }

std::vector<int> storage_nodes(const Graph& g) {
  std::vector<int> base(g.nodes.size());
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const Node& n = g.nodes[i];
    const bool aliases = n.target == "operator::getitem" || n.effects.is_view || n.effects.mutates ||
                         aliases_without_annotation(n);
    base[i] = n.op == OpKind::CallFunction && aliases && !n.args.empty() && n.args[0].kind == Arg::Kind::Ref
                  ? base[n.args[0].ref]
                  : i;
  }
  return base;
}

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

// ---- the plan -------------------------------------------------------------------------------------

MemoryPlan memory_plan(const Graph& g, const MemoryPlanOptions& opt) {
  MemoryPlan P;
  P.graph = g.name;
  const Lifetimes V = lifetimes(g);
  const int nv = static_cast<int>(V.vals.size());
  auto vname = [&](int v) {
    std::string s = "%" + g.nodes[V.vals[v].node].name;
    if (V.vals[v].elem >= 0) s += "." + std::to_string(V.vals[v].elem);
    return s;
  };
  // 1. Which roots get a buffer; everything else says why not.
  std::vector<int> phys(nv, -1);  // value -> buffer index
  std::vector<bool> plannable(nv, false);
  for (int v = 0; v < nv; ++v) {
    const Node& node = g.nodes[V.vals[v].node];
    std::string why;
    if (V.root[v] != v) why = "view of " + vname(V.root[v]);
    else if (node.op == OpKind::Placeholder) why = "input";
    else if (node.op == OpKind::GetAttr) why = "constant";
    else if (V.last[v] == kForever) why = "output";
    else if (V.bytes[v] < 0) why = "symbolic shape";
    else if (V.bytes[v] == 0) why = "empty";
    else if (opt.unplaceable) why = opt.unplaceable(g, V.vals[v].node);
    if (!why.empty()) P.unplanned.push_back({V.vals[v], why});
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
      for (int x : read_roots) {
        if (reuse >= 0) break;
        if (!plannable[x] || phys[x] < 0 || V.last[x] != j || !same_shape(*V.type[x], *V.type[v])) continue;
        // Every value the op reads from x's storage must be x itself (no second, differently laid out view).
        bool only_x = true;
        for (int y : read_roots) only_x = only_x && (y == x || V.root[y] != V.root[x]);
        if (only_x) reuse = phys[x];
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
  const char* env = std::getenv("HINTBACKEND_MEMORY_PLAN_STRATEGY");
  const std::string want = env && *env ? env : opt.strategy;
  GreedyBySizeAllocator greedy;
  BestFitAllocator best_fit;
  const ArenaAllocator* strategies[] = {&greedy, &best_fit};
  bool found = false;
  std::vector<int64_t> best_off(P.buffers.size(), 0), best_seg;
  for (const ArenaAllocator* a : strategies) {
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
  HB_USER_CHECK(found) << "memory plan strategy '" << want << "' is not one of greedy-by-size, best-fit";
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
  // 6. slice_loop bodies: one plan each, reused by every slice.
  for (const Node& node : g.nodes) {
    if (!opt.bodies) break;
    if (node.target != "hintbackend::slice_loop" || node.args.empty() || node.args[0].kind != Arg::Kind::Graph) continue;
    auto it = g.subgraphs.find(node.args[0].s);
    if (it != g.subgraphs.end() && !P.bodies.count(it->first))
      P.bodies[it->first] = std::make_shared<MemoryPlan>(memory_plan(*it->second, opt));
  }
  return P;
}

namespace {
std::function<std::string(const Graph&, int)>& placement_model() {
  static std::function<std::string(const Graph&, int)> f;
  return f;
}
}  // namespace

void set_runtime_placement(std::function<std::string(const Graph& g, int node)> unplaceable) {
  placement_model() = std::move(unplaceable);
}
const std::function<std::string(const Graph& g, int node)>& runtime_placement() { return placement_model(); }

namespace {
int64_t sweep_peak(const Graph& g, bool count_inputs, const std::set<ValueRef>* arena,
                   const std::vector<ArenaSegment>& windows);

// A slice_loop body's peak while the loop runs, its inputs (views of the loop's) aside: its values as
// they live, except that those its plan places sit in an arena of the plan's size for the whole loop
// (the runtime allocates the body's arena once and reuses it for every slice; the arena's bytes can
// exceed the live peak, which is all a plain sweep would count).
int64_t slice_body_peak(const Graph& body) {
  MemoryPlanOptions opt;
  opt.bodies = false;
  opt.unplaceable = runtime_placement();  // what the runtime will place: the rest lives as it lives
  const MemoryPlan plan = memory_plan(body, opt);
  std::set<ValueRef> placed;
  for (const PlannedBuffer& b : plan.buffers) placed.insert(b.values.begin(), b.values.end());
  const int n = static_cast<int>(body.nodes.size());
  if (placed.empty() || n == 0) return sweep_peak(body, false, nullptr, {});
  return sweep_peak(body, false, &placed, {ArenaSegment{0, n - 1, plan.arena_bytes}});
}

// The heap simulator's sweep. Values in `arena` (may be null) are not counted as they live: instead
// each window's bytes (the arenas' busy periods) are live over its nodes.
int64_t sweep_peak(const Graph& g, bool count_inputs, const std::set<ValueRef>* arena,
                   const std::vector<ArenaSegment>& windows) {
  const Lifetimes V = lifetimes(g);
  const int n = static_cast<int>(g.nodes.size());
  std::vector<int64_t> delta(n + 1, 0);
  for (int v = 0; v < static_cast<int>(V.vals.size()); ++v) {
    if (V.root[v] != v || V.bytes[v] <= 0) continue;
    if (arena && arena->count(V.vals[v])) continue;
    const Node& node = g.nodes[V.vals[v].node];
    const bool input = node.op == OpKind::Placeholder || node.op == OpKind::GetAttr;
    if (input && !count_inputs) continue;
    // An input the caller keeps lives for the whole call; one it hands over dies at its last use.
    const bool kept = input && g.caller_keeps(node);
    const int start = input ? 0 : V.vals[v].node;
    const int end = (kept || V.last[v] == kForever) ? n - 1 : V.last[v];
    // Rounded like the arena's buffers (allocators round too), so the two simulations compare alike.
    const int64_t bytes = (V.bytes[v] + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
    delta[start] += bytes;
    delta[end + 1] -= bytes;
  }
  for (const ArenaSegment& w : windows) {
    delta[w.start] += w.bytes;
    delta[w.end + 1] -= w.bytes;
  }
  int64_t live = 0, peak = 0;
  for (int i = 0; i < n; ++i) {
    live += delta[i];
    const Node& node = g.nodes[i];
    int64_t extra = hidden_workspace_bytes(g, node);
    if (node.target == "hintbackend::slice_loop" && !node.args.empty() && node.args[0].kind == Arg::Kind::Graph) {
      auto it = g.subgraphs.find(node.args[0].s);
      if (it != g.subgraphs.end()) extra += slice_body_peak(*it->second);
    }
    peak = std::max(peak, live + extra);
  }
  return peak;
}
}  // namespace

int64_t simulate_peak(const Graph& g, bool count_inputs) { return sweep_peak(g, count_inputs, nullptr, {}); }

int64_t hidden_workspace_bytes(const Graph& g, const Node& n) {
  const bool fw = n.target == "higher_order::flex_attention";
  if ((!fw && n.target != "higher_order::flex_attention_backward") || n.args.size() < 2) return 0;
  auto shape = [&](const Arg& a) -> const std::vector<Dim>* {
    if (a.kind != Arg::Kind::Ref || g.nodes[a.ref].type.kind != ValueType::Kind::Tensor) return nullptr;
    return &g.nodes[a.ref].type.tensor.shape;
  };
  const std::vector<Dim>*q = shape(n.args[0]), *k = shape(n.args[1]);
  if (!q || !k || q->size() != 4 || k->size() != 4) return 0;
  int64_t scores = 1;
  for (const Dim& d : {(*q)[0], (*q)[1], (*q)[2], (*k)[2]}) {
    if (!d.is_static()) return 0;  // symbolic: counted as 0, like symbolic values
    scores *= d.value;
  }
  return scores * (fw ? kFlexForwardWorkspace : kFlexBackwardWorkspace);
}

int64_t simulate_peak_with_arena(const Graph& g, const MemoryPlan& plan) {
  std::set<ValueRef> placed;
  for (const PlannedBuffer& b : plan.buffers) placed.insert(b.values.begin(), b.values.end());
  if (placed.empty()) return simulate_peak(g);
  return sweep_peak(g, true, &placed, plan.segments);
}

std::string to_string(const MemoryPlan& p, const Graph& g) {
  std::ostringstream os;
  auto vname = [&](const ValueRef& v) {
    std::string s = "%" + g.nodes[v.node].name;
    if (v.elem >= 0) s += "." + std::to_string(v.elem);
    return s;
  };
  os << "memory-plan graph " << p.graph << ": arena " << p.arena_bytes << " bytes (" << format_bytes(p.arena_bytes)
     << ") by " << p.strategy << ", no reuse " << p.no_reuse_bytes << ", live peak " << p.live_peak_bytes << ", "
     << p.buffers.size() << " buffers";
  if (p.segments.size() > 1) {
    os << " in " << p.segments.size() << " busy periods (one arena each):";
    for (const ArenaSegment& s : p.segments)
      os << " [" << s.start << ", " << s.end << "] " << format_bytes(s.bytes) << (&s == &p.segments.back() ? "" : ",");
  }
  for (const PlannedBuffer& b : p.buffers) {
    os << "\n  " << vname(b.values[0]) << ": offset " << b.offset << " size " << b.size << " live [" << b.start
       << ", " << b.end << "]";
    for (size_t k = 1; k < b.values.size(); ++k)
      os << (k == 1 ? " then " : ", ") << vname(b.values[k]) << (k + 1 == b.values.size() ? " in place" : "");
  }
  if (!p.unplanned.empty()) {
    os << "\n  unplanned:";
    for (size_t k = 0; k < p.unplanned.size(); ++k)
      os << (k ? ", " : " ") << vname(p.unplanned[k].value) << " (" << p.unplanned[k].why << ")";
  }
  for (const auto& kv : p.bodies) {
    auto it = g.subgraphs.find(kv.first);
    if (it != g.subgraphs.end()) os << "\n" << to_string(*kv.second, *it->second);
  }
  return os.str();
}

bool memory_plan_pass(Graph& g, PassContext& ctx) {
  MemoryPlanOptions opt;
  const char* ip = std::getenv("HINTBACKEND_MEMORY_PLAN_IN_PLACE");
  if (ip && std::string(ip) == "0") opt.in_place = false;
  ctx.notes.push_back(to_string(memory_plan(g, opt), g));
  return false;
}

}  // namespace hb
