#include "passes/CallInvariance.h"

#include <algorithm>
#include <sstream>
#include <unordered_set>

namespace hb {

namespace {

bool holds_one(const CallInvariants& c) {
  for (bool b : c.runs_once)
    if (b) return true;
  return !c.subgraphs.empty();
}

// "%a, %b, %c, ..." (the first few of the flagged nodes) and how many there are.
std::string names_of(const Graph& g, const std::vector<bool>& flags, int* count) {
  std::ostringstream os;
  int n = 0;
  for (size_t i = 0; i < flags.size(); ++i) {
    if (!flags[i]) continue;
    if (n < 6) os << (n ? ", %" : "%") << g.nodes[i].name;
    ++n;
  }
  if (n > 6) os << ", ...";
  *count = n;
  return os.str();
}

void note(const Graph& g, const std::string& where, const CallInvariants& c, std::vector<std::string>* notes) {
  int runs = 0, kept = 0;
  const std::string r = names_of(g, c.runs_once, &runs), k = names_of(g, c.kept, &kept);
  std::ostringstream os;
  os << "call-invariance graph " << where << ": " << runs << (runs == 1 ? " node runs" : " nodes run") << " once";
  if (runs) os << " (" << r << ")";
  os << ", " << kept << (kept == 1 ? " value" : " values") << " kept";
  if (kept) os << " (" << k << ")";
  os << ", returned copies: ";
  if (c.copy_all_outputs) {
    os << "all";
  } else {
    std::string pos;
    for (size_t i = 0; i < c.copied_outputs.size(); ++i)
      if (c.copied_outputs[i]) pos += (pos.empty() ? "" : ", ") + std::to_string(i);
    os << (pos.empty() ? "none" : pos);
  }
  notes->push_back(os.str());
}

std::shared_ptr<const CallInvariants> analyze(const Graph& g, const MemoryPlan* plan, const std::string& where,
                                              std::vector<std::string>* notes) {
  auto c = std::make_shared<CallInvariants>();
  for (const auto& [name, sub] : g.subgraphs) {
    const MemoryPlan* body = nullptr;
    if (plan) {
      auto it = plan->bodies.find(name);
      if (it != plan->bodies.end()) body = it->second.get();
    }
    if (auto s = analyze(*sub, body, where + " / " + name, notes)) c->subgraphs[name] = s;
  }
  std::unordered_set<int> written;  // written straight into the caller's output: runs every call
  if (plan)
    for (const OutputWrite& w : plan->output_writes) written.insert(w.node);
  const size_t n = g.nodes.size();
  std::vector<bool> inv(n, false);
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    const bool aten_op = node.op == OpKind::CallFunction && node.target.rfind("aten::", 0) == 0;
    const bool getitem = node.op == OpKind::CallFunction && node.target == "operator::getitem";
    bool ok = (aten_op || getitem || node.op == OpKind::GetAttr) && !node.effects.mutates &&
              !node.effects.nondeterministic_seeded && !written.count(static_cast<int>(i));
    node.for_each_input([&](const Arg& a) { ok = ok && inv[a.ref]; });
    inv[i] = ok;
  }
  bool written_into = false;  // a mutating node writes into an invariant value: nothing is invariant
  for (const Node& node : g.nodes)
    if (node.effects.mutates) node.for_each_input([&](const Arg& a) { written_into = written_into || inv[a.ref]; });
  if (written_into) inv.assign(n, false);
  c->runs_once.assign(n, false);
  c->kept.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    c->runs_once[i] = inv[i] && node.op != OpKind::GetAttr;
    if (inv[i] || node.op == OpKind::Placeholder) continue;
    node.for_each_input([&](const Arg& a) {
      if (inv[a.ref]) c->kept[a.ref] = true;
    });
  }
  const int out = g.output_node();
  if (out >= 0 && !g.nodes[out].args.empty()) {
    const Arg& r = g.nodes[out].args[0];
    if (r.kind == Arg::Kind::Ref) {
      c->copy_all_outputs = inv[r.ref];
    } else {
      for (size_t k = 0; k < r.items.size(); ++k)
        if (r.items[k].kind == Arg::Kind::Ref && inv[r.items[k].ref]) {
          c->copied_outputs.resize(r.items.size(), false);
          c->copied_outputs[k] = true;
        }
    }
  }
  if (!holds_one(*c)) return nullptr;
  if (notes && std::find(c->runs_once.begin(), c->runs_once.end(), true) != c->runs_once.end()) note(g, where, *c, notes);
  return c;
}

}  // namespace

std::shared_ptr<const CallInvariants> find_call_invariants(const Graph& g, const MemoryPlan* plan) {
  return analyze(g, plan, g.name, nullptr);
}

bool call_invariance(Graph& g, PassContext& ctx) {
  ctx.call_invariants = nullptr;
  if (!ctx.keep_across_calls) {
    ctx.notes.push_back("call-invariance graph " + g.name + ": off (values are not kept across calls: CUDA graphs)");
    return false;
  }
  ctx.call_invariants = analyze(g, ctx.memory_plan.get(), g.name, &ctx.notes);
  return false;
}

}  // namespace hb
