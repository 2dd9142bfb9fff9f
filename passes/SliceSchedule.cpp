#include "passes/SliceSchedule.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

#include "backend/ir/Error.h"
#include "backend/ir/GraphEdit.h"
#include "backend/ir/Printer.h"
#include "passes/HeapSimulator.h"

namespace hb {

namespace {

Arg list_of(const std::vector<int64_t>& v) {
  Arg a;
  a.kind = Arg::Kind::List;
  for (int64_t x : v) a.items.push_back(Arg::of_int(x));
  return a;
}
// Contiguous strides that keep the original dim order (by decreasing original stride).
std::vector<Dim> restride(const TensorType& t) {
  const int r = static_cast<int>(t.shape.size());
  std::vector<int> order(r);
  std::iota(order.begin(), order.end(), 0);
  if (static_cast<int>(t.stride.size()) == r)
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return t.stride[a].value > t.stride[b].value; });
  std::vector<Dim> s(r);
  int64_t acc = 1;
  for (int k = r - 1; k >= 0; --k) {
    s[order[k]].value = acc;
    acc *= std::max<int64_t>(1, t.shape[order[k]].value);
  }
  return s;
}

// The type of one slice: the group dims hold the box sizes.
// `who`: the node, for the error when the document's types disagree with the region's slicing.
ValueType slice_type(const ValueType& v, SliceMap m, int64_t slices, bool keep_strides, const std::string& who) {
  if (v.kind != ValueType::Kind::Tensor || !m.sliced()) return v;
  ValueType out = v;
  std::vector<int64_t> grp;
  for (int d = m.dim; d < m.dim + m.ndims; ++d) grp.push_back(v.tensor.shape[d].value);
  auto box = slice_box(grp, slices, 0);
  // The slice count divides the group dims of the region's inputs; a value whose declared type has other
  // group sizes contradicts its inputs (a document whose 'val' types are not the ones FX computed).
  HB_USER_CHECK(box.has_value()) << who << ": its type " << to_string(v) << " disagrees with the " << slices
                                 << " slices of its region's inputs along " << to_string(m)
                                 << "; the document's 'val' types are inconsistent";
  for (int k = 0; k < m.ndims; ++k) out.tensor.shape[m.dim + k].value = (*box)[k].length;
  if (!keep_strides) out.tensor.stride = restride(out.tensor);
  return out;
}

bool has_size_arg(const std::string& target) {
  static const std::set<std::string> k = {"aten::view.default", "aten::_unsafe_view.default", "aten::reshape.default",
                                          "aten::view_copy.default", "aten::expand.default"};
  return k.count(target) > 0;
}

void collect_subgraphs(const Arg& a, const Graph& from, Graph& to) {
  if (a.kind == Arg::Kind::Graph) {
    auto it = from.subgraphs.find(a.s);
    if (it != from.subgraphs.end()) to.subgraphs[a.s] = it->second;
  }
  for (const Arg& x : a.items) collect_subgraphs(x, from, to);
}

std::string region_name(const Graph& g, const SliceRegion& R) {
  return "region " + std::to_string(R.region) + " (" + describe(g, R.nodes.front()) + ")";
}

std::string counts_str(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// ---- global batch/head indices for FlexAttention subgraphs (SliceRegion::global_index) ----------

bool is_flex(const Node& n) {
  return n.target == "higher_order::flex_attention" || n.target == "higher_order::flex_attention_backward";
}

// The index tables a region's flex nodes read: for q dim d (0 batch, 1 heads) in the group, a tensor of
// the group's sizes whose element at (local indices) is the global index along d. Sliced like q, each
// slice's view holds its own indices.
struct IndexTables {
  SliceMap group;                  // q's group dims (the same for every flex node of the region)
  std::vector<int64_t> sizes;      // q's sizes along them
  std::map<int, ValueType> index_type;  // d -> the subgraphs' type for index d (i32[] or i64[])
};

// Appends table d's nodes (arange, and for a 2-dim group view + expand) to `nodes`, the main graph being
// rebuilt (names unique in g and in `nodes`); returns the table's index there. Outside the region: no hints.
int build_index_table(std::vector<Node>& nodes, const Graph& g, const IndexTables& T, int d, const std::string& device) {
  const int p = d - T.group.dim;  // position of d in the group
  const int n = T.group.ndims;
  const DType dt = T.index_type.at(d).tensor.dtype;
  auto tensor = [&](std::vector<int64_t> shape, std::vector<int64_t> stride) {
    ValueType v;
    v.kind = ValueType::Kind::Tensor;
    v.tensor.dtype = dt;
    v.tensor.device = device;
    for (int64_t x : shape) v.tensor.shape.push_back(Dim{x, {}});
    for (int64_t x : stride) v.tensor.stride.push_back(Dim{x, {}});
    return v;
  };
  const std::string base = std::string("slice_") + (d == 0 ? "batch" : "head") + "_index";
  std::set<std::string> taken;
  for (const Node& x : nodes) taken.insert(x.name);
  auto fresh = [&](const std::string& b) {
    std::string name = unique_name(g, b);
    for (int k = 1; taken.count(name); ++k) name = unique_name(g, b + "_" + std::to_string(k));
    taken.insert(name);
    return name;
  };
  Node a;
  a.name = fresh(base);
  a.target = "aten::arange.default";
  a.args = {Arg::of_int(T.sizes[p])};
  Arg dev;
  dev.kind = Arg::Kind::Device;
  dev.s = device;
  a.kwargs = {{"dtype", Arg::of_dtype(dt)}, {"device", dev}};
  a.type = tensor({T.sizes[p]}, {1});
  nodes.push_back(a);
  int at = static_cast<int>(nodes.size()) - 1;
  if (n == 1) return at;
  // [B] as [B, 1] expanded to [B, H]; [H] as [1, H] expanded to [B, H].
  std::vector<int64_t> unit = p == 0 ? std::vector<int64_t>{T.sizes[0], 1} : std::vector<int64_t>{1, T.sizes[1]};
  Arg shape;
  shape.kind = Arg::Kind::List;
  for (int64_t x : unit) shape.items.push_back(Arg::of_int(x));
  Node v;
  v.name = fresh(base + "_view");
  v.target = "aten::view.default";
  v.args = {Arg::of_ref(at, a.name), shape};
  v.effects.is_view = true;
  v.type = tensor(unit, p == 0 ? std::vector<int64_t>{1, 1} : std::vector<int64_t>{T.sizes[1], 1});
  nodes.push_back(v);
  at = static_cast<int>(nodes.size()) - 1;
  Arg full;
  full.kind = Arg::Kind::List;
  for (int64_t x : T.sizes) full.items.push_back(Arg::of_int(x));
  Node e;
  e.name = fresh(base + "_table");
  e.target = "aten::expand.default";
  e.args = {Arg::of_ref(at, v.name), full};
  e.effects.is_view = true;
  e.type = tensor(T.sizes, p == 0 ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{0, 1});
  nodes.push_back(e);
  return static_cast<int>(nodes.size()) - 1;
}

// A copy of subgraph `sub` (named `name`) taking the index tables `dims` as extra placeholders after
// its own, and reading every index of `dims` it uses through them: `%h` becomes
// `aten::index.Tensor(%slice_head_index, [%b, %h])` (the local indices of the group's dims).
// first_index: the position of b among its placeholders (1 for score_mod/joint, 0 for mask_mod).
// A joint graph also returns one more (empty) gradient per table.
std::shared_ptr<Graph> with_global_indices(const Graph& sub, const std::string& name, int first_index,
                                           const IndexTables& T, const std::vector<int>& dims, bool joint,
                                           const std::map<int, ValueType>& slice_types) {
  auto c = std::make_shared<Graph>(sub);
  c->name = name;
  std::vector<int> ph = c->placeholders();
  HB_INTERNAL_CHECK(static_cast<int>(ph.size()) >= first_index + 2) << "@" << sub.name << ": no b/h placeholders";
  const std::string local_b = c->nodes[ph[first_index]].name, local_h = c->nodes[ph[first_index + 1]].name;
  int pos = ph.back() + 1;
  std::map<int, std::string> table_name;
  for (int d : dims) {
    Node p;
    p.op = OpKind::Placeholder;
    p.name = unique_name(*c, std::string("slice_") + (d == 0 ? "batch" : "head") + "_index");
    p.type = slice_types.at(d);  // the slice's view of the table, as the body passes it
    table_name[d] = p.name;
    insert_node(*c, pos++, p);
  }
  std::map<std::string, std::string> replace;  // local index -> global one
  const std::vector<std::vector<int>> users = c->users();
  for (int d : dims) {
    const std::string local = d == 0 ? local_b : local_h;
    if (users[c->find(local)].empty()) continue;  // this graph of the side does not read it
    Node ix;
    ix.name = unique_name(*c, (d == 0 ? std::string("global_b") : std::string("global_h")));
    ix.target = "aten::index.Tensor";
    Arg idx;
    idx.kind = Arg::Kind::List;
    for (int k = 0; k < T.group.ndims; ++k) {
      const std::string& l = T.group.dim + k == 0 ? local_b : local_h;
      idx.items.push_back(Arg::of_ref(c->find(l), l));
    }
    ix.args = {Arg::of_ref(c->find(table_name[d]), table_name[d]), idx};
    ix.type = T.index_type.at(d);
    replace[local] = ix.name;
    insert_node(*c, pos++, ix);
  }
  // Every later read of a local index reads the global one.
  std::map<int, int> to;
  for (const auto& [l, gl] : replace) to[c->find(l)] = c->find(gl);
  for (int i = pos; i < static_cast<int>(c->nodes.size()); ++i) {
    auto fix = [&](Arg& a) {
      auto it = to.find(a.ref);
      if (it == to.end()) return;
      a.ref = it->second;
      a.s = c->nodes[it->second].name;
    };
    for (Arg& a : c->nodes[i].args) a.for_each_ref_mut(fix);
    for (auto& kv : c->nodes[i].kwargs) kv.second.for_each_ref_mut(fix);
  }
  if (joint) {
    const int out = c->output_node();
    HB_INTERNAL_CHECK(out >= 0 && !c->nodes[out].args.empty()) << "@" << sub.name << ": a joint graph without output";
    for (size_t k = 0; k < dims.size(); ++k) c->nodes[out].args[0].items.push_back(Arg::none());
  }
  return c;
}

}  // namespace

int make_slice_loop(Graph& g, const SliceRegion& R, int64_t slices) {
  HB_INTERNAL_CHECK(!R.sliceable.empty() && !R.outputs.empty()) << "make_slice_loop: nothing to slice";
  const std::set<int> inside(R.sliceable.begin(), R.sliceable.end());
  // 1. The body: one placeholder per input (slice-shaped when sliced), the sliceable nodes with their
  //    types and size arguments per slice, and a tuple of the outputs.
  auto body = std::make_shared<Graph>();
  body->name = unique_name(g, "slice_body_" + std::to_string(R.region));
  std::map<int, int> body_index;
  for (const SliceInput& in : R.inputs) {
    Node p;
    p.op = OpKind::Placeholder;
    p.name = g.nodes[in.node].name;
    p.type = slice_type(g.nodes[in.node].type, in.map, slices, /*keep_strides=*/true, describe(g, in.node));
    body_index[in.node] = static_cast<int>(body->nodes.size());
    body->nodes.push_back(p);
  }
  // Flex nodes that read the batch/head index along a sliced dim read the global one from an index
  // table, one more loop input per dim (built before the loop, below); which side of each node reads which.
  IndexTables T;
  std::set<int> table_dims;
  struct Sides { std::vector<int> score, mask; };
  std::map<int, Sides> sides;
  std::string device = "cpu";
  for (const auto& [s, dims] : R.global_index) {
    const Node& n = g.nodes[s];
    HB_INTERNAL_CHECK(is_flex(n)) << "slice-schedule: " << describe(g, s) << " reads global indices but is not flex";
    const bool bw = n.target == "higher_order::flex_attention_backward";
    const TensorType* q = g.tensor_type(n.args[0]);
    HB_INTERNAL_CHECK(q && q->shape.size() == 4) << describe(g, s) << ": its query is not 4-d";
    const SliceMap M = R.maps.at(s)[0];
    std::vector<int64_t> sizes;
    for (int d = M.dim; d < M.dim + M.ndims; ++d) sizes.push_back(q->shape[d].value);
    HB_INTERNAL_CHECK(T.sizes.empty() || (T.group == M && T.sizes == sizes))
        << describe(g, s) << ": its index tables differ from the region's (slice-legality keeps them alike)";
    T.group = M;
    T.sizes = sizes;
    device = q->device;
    const std::vector<int> score_graphs = bw ? std::vector<int>{7, 8} : std::vector<int>{3};
    const int mask_pos = bw ? 9 : 4;
    Sides& side = sides[s];
    for (int d : dims) {
      bool in_score = false, in_mask = false;
      for (int k : score_graphs) {
        const Arg& a = n.args[k];
        if (a.kind != Arg::Kind::Graph) continue;
        if (!subgraph_reads_placeholder(g, a.s, 1 + d)) continue;  // true only for a subgraph that has it
        in_score = true;
        const Graph& sub = *g.subgraphs.at(a.s);
        if (!T.index_type.count(d)) T.index_type[d] = sub.nodes[sub.placeholders().at(1 + d)].type;
      }
      for (const Arg& e : n.args[mask_pos].items)
        if (e.kind == Arg::Kind::Graph && subgraph_reads_placeholder(g, e.s, d)) {
          in_mask = true;
          const Graph& sub = *g.subgraphs.at(e.s);
          if (!T.index_type.count(d)) T.index_type[d] = sub.nodes[sub.placeholders().at(d)].type;
        }
      if (in_score) side.score.push_back(d);
      if (in_mask) side.mask.push_back(d);
      table_dims.insert(d);
    }
  }
  std::map<int, int> table_body;  // d -> the table's placeholder in the body
  auto table_type = [&](int d) {
    ValueType v;
    v.kind = ValueType::Kind::Tensor;
    v.tensor.dtype = T.index_type.at(d).tensor.dtype;
    v.tensor.device = device;
    for (int64_t x : T.sizes) v.tensor.shape.push_back(Dim{x, {}});
    const int p = d - T.group.dim;
    if (T.sizes.size() == 1) v.tensor.stride = {Dim{1, {}}};
    else v.tensor.stride = p == 0 ? std::vector<Dim>{Dim{1, {}}, Dim{0, {}}} : std::vector<Dim>{Dim{0, {}}, Dim{1, {}}};
    return v;
  };
  for (int d : table_dims) {
    Node p;
    p.op = OpKind::Placeholder;
    p.name = unique_name(g, std::string("slice_") + (d == 0 ? "batch" : "head") + "_index_table");
    p.type = slice_type(table_type(d), SliceMap{0, T.group.ndims}, slices, /*keep_strides=*/true, p.name);
    table_body[d] = static_cast<int>(body->nodes.size());
    body->nodes.push_back(p);
  }
  for (int s : R.sliceable) {
    Node b = g.nodes[s];
    const std::vector<SliceMap>& maps = R.maps.at(s);
    if (b.type.kind == ValueType::Kind::Tuple) {
      for (size_t e = 0; e < b.type.elems.size() && e < maps.size(); ++e)
        b.type.elems[e] = slice_type(b.type.elems[e], maps[e], slices, false, describe(g, s));
    } else {
      b.type = slice_type(b.type, maps[0], slices, b.effects.is_view, describe(g, s));
    }
    if (has_size_arg(b.target) && b.args.size() >= 2 && b.type.kind == ValueType::Kind::Tensor) {
      std::vector<int64_t> shape;
      for (const Dim& d : b.type.tensor.shape) shape.push_back(d.value);
      b.args[1] = list_of(shape);
    }
    auto remap = [&](Arg& a) {
      auto it = body_index.find(a.ref);
      HB_INTERNAL_CHECK(it != body_index.end()) << "slice body: %" << b.name << " reads %" << a.s << ", not an input";
      a.ref = it->second;
    };
    for (Arg& a : b.args) {
      a.for_each_ref_mut(remap);
      collect_subgraphs(a, g, *body);
    }
    for (auto& kv : b.kwargs) {
      kv.second.for_each_ref_mut(remap);
      collect_subgraphs(kv.second, g, *body);
    }
    if (auto it = sides.find(s); it != sides.end()) {  // global indices: rewritten subgraphs, more buffers
      const bool bw = b.target == "higher_order::flex_attention_backward";
      auto rewrite = [&](Arg& a, int first_index, const std::vector<int>& dims, bool joint) {
        if (a.kind != Arg::Kind::Graph || dims.empty()) return;
        HB_INTERNAL_CHECK(g.subgraphs.count(a.s)) << describe(g, s) << ": subgraph @" << a.s << " is missing";
        const std::string name = unique_name(*body, a.s + "_global");
        std::map<int, ValueType> slice_types;
        for (const auto& [d, at] : table_body) slice_types[d] = body->nodes[at].type;
        body->subgraphs[name] =
            with_global_indices(*g.subgraphs.at(a.s), name, first_index, T, dims, joint, slice_types);
        a.s = name;
      };
      auto add_buffers = [&](Arg& list, const std::vector<int>& dims) {
        for (int d : dims) list.items.push_back(Arg::of_ref(table_body.at(d), body->nodes[table_body.at(d)].name));
      };
      const Sides& side = it->second;
      if (bw) {
        rewrite(b.args[7], 1, side.score, false);
        rewrite(b.args[8], 1, side.score, true);
        add_buffers(b.args[12], side.score);
        for (size_t k = 0; k < side.score.size(); ++k) {  // one (empty) gradient per table
          ValueType none;
          none.kind = ValueType::Kind::None;
          b.type.elems.at(3).elems.push_back(none);
        }
      } else {
        rewrite(b.args[3], 1, side.score, false);
        add_buffers(b.args[7], side.score);
      }
      for (Arg& e : b.args[bw ? 9 : 4].items) rewrite(e, 0, side.mask, false);
      add_buffers(b.args[bw ? 13 : 8], side.mask);
    }
    // A getitem of a flex backward's buffer gradients (result 3) follows its new type.
    if (b.target == "operator::getitem" && b.args.size() >= 2 && b.args[1].kind == Arg::Kind::Int &&
        b.args[1].i == 3 && sides.count(g.nodes[s].args[0].ref))
      b.type = body->nodes[b.args[0].ref].type.elems.at(3);
    body_index[s] = static_cast<int>(body->nodes.size());
    body->nodes.push_back(std::move(b));
  }
  Arg tuple;
  tuple.kind = Arg::Kind::Tuple;
  for (int o : R.outputs) tuple.items.push_back(Arg::of_ref(body_index.at(o), g.nodes[o].name));
  add_output(*body, tuple);
  g.subgraphs[body->name] = body;

  // 2. The loop node.
  Node loop;
  loop.name = unique_name(g, "slice_loop_" + std::to_string(R.region));
  loop.op = OpKind::CallFunction;
  loop.target = kSliceLoopTarget;
  loop.hints = g.nodes[R.sliceable.front()].hints;
  Arg graph_arg;
  graph_arg.kind = Arg::Kind::Graph;
  graph_arg.s = body->name;
  Arg inputs;
  inputs.kind = Arg::Kind::List;
  std::vector<int64_t> in_dims, in_ndims, out_dims, out_ndims;
  for (const SliceInput& in : R.inputs) {
    inputs.items.push_back(Arg::of_ref(in.node, g.nodes[in.node].name));
    in_dims.push_back(in.map.dim);
    in_ndims.push_back(in.map.ndims);
  }
  for (size_t k = 0; k < table_dims.size(); ++k) {  // the index tables (their refs are added when built)
    in_dims.push_back(0);
    in_ndims.push_back(T.group.ndims);
  }
  loop.type.kind = ValueType::Kind::Tuple;
  for (int o : R.outputs) {
    const SliceMap m = R.maps.at(o)[0];
    out_dims.push_back(R.summed.count(o) ? kOutSummed : m.sliced() ? m.dim : kOutReplicated);
    out_ndims.push_back(m.ndims);
    loop.type.elems.push_back(g.nodes[o].type);
  }
  loop.args = {graph_arg, inputs};
  loop.kwargs = {{"in_dims", list_of(in_dims)}, {"in_ndims", list_of(in_ndims)},
                 {"slices", Arg::of_int(slices)}, {"extent", Arg::of_int(R.extent)},
                 {"out_dims", list_of(out_dims)}, {"out_ndims", list_of(out_ndims)}};

  // 3. Rebuild the node list: the loop and its getitems take the place of the last sliced node.
  const int last = R.sliceable.back();
  std::vector<int> new_index(g.nodes.size(), -1);
  std::vector<Node> nodes;
  int loop_index = -1;
  auto renumber = [&](Node& n) {
    auto fix = [&](Arg& a) {
      HB_INTERNAL_CHECK(new_index[a.ref] >= 0) << "slice-schedule: %" << n.name << " reads %" << a.s
                                               << ", which the loop consumed";
      a.ref = new_index[a.ref];
    };
    for (Arg& a : n.args) a.for_each_ref_mut(fix);
    for (auto& kv : n.kwargs) kv.second.for_each_ref_mut(fix);
  };
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    if (!inside.count(i)) {
      Node n = std::move(g.nodes[i]);
      renumber(n);
      new_index[i] = static_cast<int>(nodes.size());
      nodes.push_back(std::move(n));
      continue;
    }
    if (i != last) continue;
    renumber(loop);
    for (int d : table_dims) {
      const int t = build_index_table(nodes, g, T, d, device);
      loop.args[1].items.push_back(Arg::of_ref(t, nodes[t].name));
    }
    loop_index = static_cast<int>(nodes.size());
    nodes.push_back(loop);
    for (size_t k = 0; k < R.outputs.size(); ++k) {
      const Node& orig = g.nodes[R.outputs[k]];
      Node gi;
      gi.name = orig.name;
      gi.op = OpKind::CallFunction;
      gi.target = "operator::getitem";
      gi.args = {Arg::of_ref(loop_index, loop.name), Arg::of_int(static_cast<int64_t>(k))};
      gi.type = orig.type;
      gi.hints = orig.hints;
      gi.source = orig.source;
      new_index[R.outputs[k]] = static_cast<int>(nodes.size());
      nodes.push_back(std::move(gi));
    }
  }
  g.nodes = std::move(nodes);
  return loop_index;
}

std::vector<SliceCandidate> simulate_slice_counts(const Graph& g, const SliceRegion& R, const MemoryPlanOptions& opt) {
  std::vector<SliceCandidate> out;
  for (int64_t n : R.slice_counts()) {
    Graph copy = g;  // subgraphs are shared, the map is not: the original stays untouched
    if (n > 1) make_slice_loop(copy, R, n);
    out.push_back({n, simulate_peak(copy, opt)});
  }
  return out;
}

SliceCandidate choose_slice_count(const std::vector<SliceCandidate>& candidates, int64_t budget,
                                  const std::string& region) {
  HB_INTERNAL_CHECK(!candidates.empty()) << "choose_slice_count: no candidates for " << region;
  for (const SliceCandidate& c : candidates)  // ascending slice counts: the first fit is the fastest
    if (c.peak_bytes <= budget) return c;
  SliceCandidate lowest = candidates.front();
  for (const SliceCandidate& c : candidates)
    if (c.peak_bytes < lowest.peak_bytes) lowest = c;
  std::ostringstream tried;
  for (size_t i = 0; i < candidates.size(); ++i)
    tried << (i ? ", " : "") << candidates[i].slices << ": " << format_bytes(candidates[i].peak_bytes);
  HB_USER_FAIL() << region << ": memory_budget=" << budget << " bytes (" << format_bytes(budget)
                 << ") cannot be met. The smallest simulated peak is " << lowest.peak_bytes << " bytes ("
                 << format_bytes(lowest.peak_bytes) << ") with slices=" << lowest.slices
                 << "; a memory_budget of at least " << lowest.peak_bytes
                 << " bytes would fit. Simulated peak per slice count: " << tried.str()
                 << ". Raise memory_budget, or move nodes that cannot be sliced out of the region "
                    "(see the slice-legality note in the dump).";
  return lowest;  // not reached: HB_USER_FAIL throws
}

bool slice_schedule(Graph& g, PassContext& ctx) {
  bool changed = false;
  std::set<int> done;
  for (;;) {
    // Legality is recomputed after each rewrite: node indices moved.
    SliceLegality L = slice_legality(g);
    const SliceRegion* R = nullptr;
    for (const SliceRegion& r : L.regions)
      if (!done.count(r.region)) { R = &r; break; }
    if (!R) break;
    done.insert(R->region);
    const std::string where = region_name(g, *R);
    const std::string head = "slice-schedule region " + std::to_string(R->region) + ": ";
    const Schedule sched = R->hints.schedule.value_or(Schedule::BFS);
    ctx.slice_counts[R->region] = 1;
    if (sched == Schedule::BFS) {
      ctx.notes.push_back(head + "bfs, left as is");
      continue;
    }
    if (R->sliceable.empty() || R->extent <= 1 || R->outputs.empty()) {
      const std::string why =
          R->end_node >= 0 ? "%" + g.nodes[R->end_node].name + " " + R->end_reason
          : R->extent <= 1 ? "its tensors have no slice dims of size > 1 (slice_dims " +
                                 (R->slice_dims.empty() ? std::string("batch,heads") : "[" + counts_str(R->slice_dims) + "]") + ")"
                           : "no value leaves the sliceable part";
      ctx.notes.push_back(head + schedule_name(sched) + " but nothing to slice" +
                          (R->end_node >= 0 ? " (ends at %" + g.nodes[R->end_node].name + ": " + R->end_reason + ")" : ""));
      // The user asked for slicing (dfs, or a budget to plan against) and gets none: say so.
      if (sched == Schedule::DFS || R->hints.memory_budget)
        ctx.warnings.push_back(where + ": schedule='" + schedule_name(sched) + "' but nothing can be sliced: " + why +
                               ". The region runs whole (bfs); see docs/hints.md for what can be sliced.");
      continue;
    }
    const std::vector<int64_t> counts = R->slice_counts();
    const Hints& h = R->hints;
    int64_t n = 0;
    std::string how;
    if (h.slices) {
      HB_USER_CHECK(std::find(counts.begin(), counts.end(), *h.slices) != counts.end())
          << where << ": slices=" << *h.slices << " does not split the sliced dims (extent " << R->extent
          << ") into equal slices that are views; valid counts: " << counts_str(counts);
      n = *h.slices;
      how = "slices hint";
    } else if (h.slice_size) {
      const bool ok = R->extent % *h.slice_size == 0 &&
                      std::find(counts.begin(), counts.end(), R->extent / *h.slice_size) != counts.end();
      std::vector<int64_t> sizes;
      for (int64_t c : counts) sizes.push_back(R->extent / c);
      std::sort(sizes.begin(), sizes.end());
      HB_USER_CHECK(ok) << where << ": slice_size=" << *h.slice_size << " does not divide the sliced dims (extent "
                        << R->extent << ") into equal slices that are views; valid sizes: " << counts_str(sizes);
      n = R->extent / *h.slice_size;
      how = "slice_size hint";
    } else if (sched == Schedule::Auto || h.memory_budget) {
      const std::vector<SliceCandidate> cands = simulate_slice_counts(g, *R, ctx.memory);
      std::ostringstream sim;
      for (size_t i = 0; i < cands.size(); ++i)
        sim << (i ? ", " : "") << cands[i].slices << ": " << cands[i].peak_bytes;
      if (!h.memory_budget) {
        n = 1;
        how = "auto without memory_budget keeps 1 slice (bfs); simulated peaks " + sim.str();
      } else {
        const SliceCandidate c = choose_slice_count(cands, *h.memory_budget, where);
        n = c.slices;
        how = std::string(schedule_name(sched)) + " chose slices=" + std::to_string(c.slices) + ": simulated peak " +
              std::to_string(c.peak_bytes) + " bytes (" + format_bytes(c.peak_bytes) + ") fits memory_budget=" +
              std::to_string(*h.memory_budget) + " (" + format_bytes(*h.memory_budget) +
              "); simulated peak per slice count: " + sim.str();
      }
    } else {
      n = R->extent;
      const std::string per = R->narrowed.empty()                 ? "batch x head"
                              : R->narrowed.rfind("heads", 0) == 0 ? "head (" + R->narrowed + ")"
                                                                   : "batch (" + R->narrowed + ")";
      how = "dfs default: one slice per " + per;
    }
    if (n <= 1) {
      ctx.notes.push_back(head + how + "; 1 slice, left as is");
      continue;
    }
    const std::string rest = R->end_node < 0 ? "" : "; the region's rest stays outside from %" +
                                                      g.nodes[R->end_node].name + ": " + R->end_reason;
    ctx.slice_counts[R->region] = n;
    const int loop = make_slice_loop(g, *R, n);
    changed = true;
    std::ostringstream note;
    note << head << schedule_name(sched) << " with slices=" << n << " of extent " << R->extent << " (" << how << "): "
         << R->sliceable.size() << " nodes into %" << g.nodes[loop].name << " over @" << g.nodes[loop].args[0].s;
    note << rest;
    ctx.notes.push_back(note.str());
  }
  return changed;
}

bool for_each_slice_body(Graph& g, const std::function<bool(Graph& body)>& pass) {
  bool changed = false;
  for (const Node& n : g.nodes)
    if (n.target == kSliceLoopTarget) {
      auto it = g.subgraphs.find(slice_loop_args(n).body);
      if (it != g.subgraphs.end()) changed |= pass(*it->second);
    }
  return changed;
}

}  // namespace hb
