#include "passes/MemorySchedule.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include "backend/ir/Error.h"
#include "backend/ir/GraphEdit.h"
#include "backend/ir/Aliasing.h"
#include "passes/HeapSimulator.h"
#include "passes/Lifetimes.h"

namespace hb {
namespace {

// Ops whose order against each other must not change: mutation, random draws, and ops whose effects no
// schema describes (python:: targets; higher-order ops other than FlexAttention, which
// dead-code-elimination keeps for the same reason).
bool has_effects(const Node& n) {
  if (n.op != OpKind::CallFunction) return false;
  if (n.effects.mutates || n.effects.nondeterministic_seeded) return true;
  if (n.target.rfind("python::", 0) == 0) return true;
  return n.target.rfind("higher_order::", 0) == 0 && n.target != "higher_order::flex_attention" &&
         n.target != "higher_order::flex_attention_backward";
}

// The parts every order keeps in place: placeholders, then get_attr constants (each in original
// order); the output last. Everything else is the body the strategies order.
struct Frame {
  std::vector<int> prefix;
  std::vector<int> body;
  int output = -1;
};

Frame frame(const Graph& g) {
  Frame F;
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i)
    if (g.nodes[i].op == OpKind::Placeholder) F.prefix.push_back(i);
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const OpKind op = g.nodes[i].op;
    if (op == OpKind::GetAttr) F.prefix.push_back(i);
    else if (op == OpKind::Output) F.output = i;
    else if (op == OpKind::CallFunction) F.body.push_back(i);
  }
  HB_INTERNAL_CHECK(F.output == static_cast<int>(g.nodes.size()) - 1)
      << "memory-schedule: graph '" << g.name << "' has no output node at its end";
  return F;
}

int64_t aligned(int64_t bytes) { return bytes <= 0 ? 0 : (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

// The simulator's storage (alias roots of lifetimes()) as the list scheduler sees it: what running a
// node allocates, which storage it reads, and which storage dies after its last reader.
struct Storage {
  std::vector<int64_t> alloc;              // per node: bytes of the storage it defines
  std::vector<std::vector<int>> defines;   // per node: the roots it defines
  std::vector<std::vector<int>> reads;     // per node: the roots it reads, each once
  std::vector<int> readers;                // per root: how many nodes read it
  std::vector<int64_t> bytes;              // per root (0 for views and symbolic shapes)
  std::vector<bool> freeable;              // per root: freed after its last reader (not returned, not kept by the caller)
};

Storage storage(const Graph& g) {
  const Lifetimes L = lifetimes(g);
  const int n = static_cast<int>(g.nodes.size());
  const int nv = static_cast<int>(L.vals.size());
  Storage S;
  S.alloc.assign(n, 0);
  S.defines.assign(n, {});
  S.reads.assign(n, {});
  S.readers.assign(nv, 0);
  S.bytes.assign(nv, 0);
  S.freeable.assign(nv, false);
  for (int v = 0; v < nv; ++v) {
    if (L.root[v] != v) continue;
    const Node& def = g.nodes[L.vals[v].node];
    const bool kept = (def.op == OpKind::GetAttr || def.op == OpKind::Placeholder) && g.caller_keeps(def);
    S.bytes[v] = aligned(L.bytes[v]);
    S.freeable[v] = !kept && L.last[v] != Lifetimes::kForever;
    S.alloc[L.vals[v].node] += S.bytes[v];
    S.defines[L.vals[v].node].push_back(v);
  }
  for (int j = 0; j < n; ++j) {
    for (int v : L.reads[j])
      if (std::find(S.reads[j].begin(), S.reads[j].end(), L.root[v]) == S.reads[j].end()) S.reads[j].push_back(L.root[v]);
    for (int r : S.reads[j]) ++S.readers[r];
  }
  return S;
}

// Scheduling units: a node and the getitems that take its tuple apart, right after it. The runtime
// holds a tuple (every element) until its last getitem has run, so a getitem moved away from its
// producer would keep all the elements alive; getitems whose only dependency is their producer stay
// glued to it. Every other node is a unit of its own. Strategies order units (by their first node).
struct Units {
  std::vector<int> leader;                    // per node: the first node of its unit
  std::vector<std::vector<int>> members;      // per leader: its nodes in original order
  std::vector<std::vector<int>> preds;        // per leader: the leaders of the units it waits for
  std::vector<std::vector<int>> succs;        // per leader: the leaders of the units that wait for it
  std::vector<int64_t> alloc;                 // per leader: bytes its nodes allocate
  std::vector<std::vector<std::pair<int, int>>> reads;  // per leader: (root, how many of its nodes read it)
};

Units units(const Graph& g, const Frame& F, const std::vector<std::vector<int>>& deps, const Storage& S) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<bool> in_body(n, false);
  for (int j : F.body) in_body[j] = true;
  Units U;
  U.leader.resize(n);
  std::iota(U.leader.begin(), U.leader.end(), 0);
  for (int j : F.body) {
    const Node& node = g.nodes[j];
    const bool glued = node.target == "operator::getitem" && deps[j].size() == 1 && !node.args.empty() &&
                       node.args[0].kind == Arg::Kind::Ref && deps[j][0] == node.args[0].ref && in_body[deps[j][0]];
    if (glued) U.leader[j] = U.leader[deps[j][0]];
  }
  U.members.assign(n, {});
  U.preds.assign(n, {});
  U.succs.assign(n, {});
  U.alloc.assign(n, 0);
  U.reads.assign(n, {});
  for (int j : F.body) {
    const int u = U.leader[j];
    U.members[u].push_back(j);
    U.alloc[u] += S.alloc[j];
    for (int r : S.reads[j]) {
      auto it = std::find_if(U.reads[u].begin(), U.reads[u].end(), [&](const std::pair<int, int>& e) { return e.first == r; });
      if (it == U.reads[u].end()) U.reads[u].push_back({r, 1});
      else ++it->second;
    }
    for (int p : deps[j]) {
      if (!in_body[p] || U.leader[p] == u) continue;
      U.preds[u].push_back(U.leader[p]);
      U.succs[U.leader[p]].push_back(u);
    }
  }
  for (int u = 0; u < n; ++u) {
    for (std::vector<int>* v : {&U.preds[u], &U.succs[u]}) {
      std::sort(v->begin(), v->end());
      v->erase(std::unique(v->begin(), v->end()), v->end());
    }
  }
  return U;
}

// Bytes that die once unit u has run, given how many readers each root still waits for: the storage
// its nodes read last, and what it defines that nobody reads.
int64_t freed_by(const Storage& S, const Units& U, const std::vector<int>& readers_left, int u) {
  int64_t f = 0;
  for (const auto& [r, count] : U.reads[u])
    if (S.freeable[r] && readers_left[r] == count) f += S.bytes[r];
  for (int j : U.members[u])
    for (int r : S.defines[j])
      if (S.freeable[r] && S.readers[r] == 0) f += S.bytes[r];
  return f;
}

int64_t saturating_add(int64_t a, int64_t b) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  return a > kMax - b ? kMax : a + b;
}

int64_t peak_in_order(const Graph& g, const std::vector<int>& order, const MemoryPlanOptions& opt) {
  Graph copy = g;
  reorder_nodes(copy, order);
  return simulate_peak(copy, opt);
}

struct Candidate {
  const char* name;
  std::vector<int> order;
  int64_t peak;
};

// "memory-schedule graph g: list order, simulated peak 17 MiB -> 14 MiB (original, list, dfs: 17825792,
// 14680064, 17825792 bytes)": the figures rounded, then exact (two peaks can round alike).
std::string schedule_note(const Graph& g, const std::vector<Candidate>& candidates, size_t best) {
  std::ostringstream note;
  note << "memory-schedule graph " << g.name << ": ";
  if (best == 0) note << "original order kept, simulated peak " << format_bytes(candidates[0].peak);
  else
    note << candidates[best].name << " order, simulated peak " << format_bytes(candidates[0].peak) << " -> "
         << format_bytes(candidates[best].peak);
  note << " (";
  for (size_t k = 0; k < candidates.size(); ++k) note << (k ? ", " : "") << candidates[k].name;
  note << ":";
  for (size_t k = 0; k < candidates.size(); ++k) note << (k ? ", " : " ") << candidates[k].peak;
  note << " bytes)";
  return note.str();
}

}  // namespace

std::vector<std::vector<int>> schedule_dependencies(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<std::vector<int>> preds(n);
  auto order = [&](int before, int after) {
    if (before != after) preds[after].push_back(before);
  };
  // Data.
  for (int i = 0; i < n; ++i) g.nodes[i].for_each_input([&](const Arg& a) { order(a.ref, i); });
  // Effectful nodes form a chain in their original order.
  for (int i = 0, prev = -1; i < n; ++i) {
    if (!has_effects(g.nodes[i])) continue;
    if (prev >= 0) order(prev, i);
    prev = i;
  }
  // Whoever reads storage a node mutates stays on its side of the mutation.
  const std::vector<int> base = storage_nodes(g);
  std::vector<std::vector<int>> readers(n);  // storage node -> nodes reading it through any alias
  for (int j = 0; j < n; ++j) g.nodes[j].for_each_input([&](const Arg& a) { readers[base[a.ref]].push_back(j); });
  for (int m = 0; m < n; ++m) {
    if (!g.nodes[m].effects.mutates) continue;
    g.nodes[m].for_each_input([&](const Arg& a) {
      for (int r : readers[base[a.ref]]) r < m ? order(r, m) : order(m, r);
    });
  }
  for (std::vector<int>& p : preds) {
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
  }
  return preds;
}

std::vector<int> list_schedule(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const Frame F = frame(g);
  const Storage S = storage(g);
  const Units U = units(g, F, schedule_dependencies(g), S);
  // Per root, the units reading it and how many of them have not run.
  std::vector<std::vector<int>> reader_units(S.readers.size());
  std::vector<int> units_left(S.readers.size(), 0);
  for (int u : F.body)
    for (const auto& [r, count] : U.reads[u]) {
      reader_units[r].push_back(u);
      ++units_left[r];
    }
  // Ready units by priority: zero-byte ones first, then the most bytes freed net of bytes allocated,
  // then original position. A unit's gain changes only when it becomes the last unit to read a root:
  // then its entry is refreshed.
  using Key = std::tuple<bool, int64_t, int>;  // (allocates, -gain, leader)
  std::vector<int> readers_left = S.readers;
  std::vector<Key> key(n);
  std::set<Key> ready;
  auto enqueue = [&](int u) {
    key[u] = Key{U.alloc[u] != 0, U.alloc[u] - freed_by(S, U, readers_left, u), u};
    ready.insert(key[u]);
  };
  std::vector<int> waiting(n, 0);
  for (int u : F.body) {
    if (U.leader[u] != u) continue;
    waiting[u] = static_cast<int>(U.preds[u].size());
    if (waiting[u] == 0) enqueue(u);
  }
  std::vector<int> order = F.prefix;
  std::vector<bool> done(n, false);
  while (!ready.empty()) {
    const int u = std::get<2>(*ready.begin());
    ready.erase(ready.begin());
    done[u] = true;
    order.insert(order.end(), U.members[u].begin(), U.members[u].end());
    for (const auto& [r, count] : U.reads[u]) {
      readers_left[r] -= count;
      if (--units_left[r] != 1) continue;
      for (int w : reader_units[r])
        if (!done[w] && ready.erase(key[w])) enqueue(w);
    }
    for (int s : U.succs[u])
      if (--waiting[s] == 0) enqueue(s);
  }
  HB_INTERNAL_CHECK(order.size() == F.prefix.size() + F.body.size())
      << "memory-schedule: the list scheduler left nodes of graph '" << g.name << "' unscheduled (a dependency cycle)";
  order.push_back(F.output);
  return order;
}

std::vector<int> dfs_schedule(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const Frame F = frame(g);
  const Units U = units(g, F, schedule_dependencies(g), storage(g));
  // A unit's subtree weight: its bytes plus the units it waits for (a shared input counts once per
  // path, as in XLA). Those have smaller leaders, so one forward sweep does it.
  std::vector<int64_t> weight(n, 0);
  for (int u : F.body) {
    if (U.leader[u] != u) continue;
    weight[u] = U.alloc[u];
    for (int p : U.preds[u]) weight[u] = saturating_add(weight[u], weight[p]);
  }
  auto heaviest_first = [&](std::vector<int> c) {
    std::sort(c.begin(), c.end(), [&](int a, int b) { return weight[a] != weight[b] ? weight[a] > weight[b] : a < b; });
    return c;
  };
  // Start from every unit no other unit waits for: what only the output reads, and effects nobody reads.
  std::vector<int> starts;
  for (int u : F.body)
    if (U.leader[u] == u && U.succs[u].empty()) starts.push_back(u);
  // Post-order, iteratively (graphs can be deep): a unit's inputs, heaviest first, then the unit.
  std::vector<int> order = F.prefix;
  std::vector<bool> seen(n, false);
  struct Visit {
    int unit;
    std::vector<int> inputs;
    size_t next;
  };
  for (int s : heaviest_first(starts)) {
    if (seen[s]) continue;
    seen[s] = true;
    std::vector<Visit> stack = {{s, heaviest_first(U.preds[s]), 0}};
    while (!stack.empty()) {
      Visit& top = stack.back();
      if (top.next < top.inputs.size()) {
        const int c = top.inputs[top.next++];
        if (seen[c]) continue;
        seen[c] = true;
        stack.push_back({c, heaviest_first(U.preds[c]), 0});
        continue;
      }
      order.insert(order.end(), U.members[top.unit].begin(), U.members[top.unit].end());
      stack.pop_back();
    }
  }
  HB_INTERNAL_CHECK(order.size() == F.prefix.size() + F.body.size())
      << "memory-schedule: the DFS scheduler missed nodes of graph '" << g.name << "'";
  order.push_back(F.output);
  return order;
}

constexpr int64_t kMinGainDivisor = 64;  // a reorder must lower the simulated peak by >= 1/64 (1.6%)

bool memory_schedule(Graph& g, PassContext& ctx) {
  std::vector<int> original(g.nodes.size());
  std::iota(original.begin(), original.end(), 0);
  std::vector<Candidate> candidates = {
      {"original", original, simulate_peak(g, ctx.memory)}, {"list", list_schedule(g), 0}, {"dfs", dfs_schedule(g), 0}};
  for (size_t k = 1; k < candidates.size(); ++k) candidates[k].peak = peak_in_order(g, candidates[k].order, ctx.memory);
  // The lowest peak; the original (then the earlier strategy) wins ties, and a reorder must gain at
  // least 1/kMinGainDivisor of the peak: a new order also changes which kernels run back to back (and
  // when hidden workspaces are taken), which the simulator does not see, so noise does not pay for it.
  size_t best = 0;
  for (size_t k = 1; k < candidates.size(); ++k)
    if (candidates[k].peak < candidates[best].peak) best = k;
  if (best != 0 && candidates[0].peak - candidates[best].peak < candidates[0].peak / kMinGainDivisor) best = 0;
  ctx.notes.push_back(schedule_note(g, candidates, best));
  if (best == 0) return false;
  reorder_nodes(g, candidates[best].order);
  return true;
}

}  // namespace hb
