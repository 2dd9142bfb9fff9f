#include "backend/ir/SliceLoop.h"

#include "backend/ir/Error.h"

namespace hb {

namespace {
std::vector<int64_t> ints_of(const Arg* a) {
  std::vector<int64_t> v;
  HB_INTERNAL_CHECK(a && a->kind == Arg::Kind::List) << "slice_loop: malformed integer list";
  for (const Arg& x : a->items) v.push_back(x.i);
  return v;
}
}  // namespace

SliceLoopArgs slice_loop_args(const Node& loop) {
  HB_INTERNAL_CHECK(loop.target == kSliceLoopTarget && loop.args.size() == 2 &&
                    loop.args[0].kind == Arg::Kind::Graph && loop.args[1].kind == Arg::Kind::List)
      << "not a well-formed slice_loop node: %" << loop.name;
  SliceLoopArgs a;
  a.body = loop.args[0].s;
  for (const Arg& x : loop.args[1].items) a.inputs.push_back(x.ref);
  a.in_dims = ints_of(loop.kwarg("in_dims"));
  a.in_ndims = ints_of(loop.kwarg("in_ndims"));
  a.out_dims = ints_of(loop.kwarg("out_dims"));
  a.out_ndims = ints_of(loop.kwarg("out_ndims"));
  HB_INTERNAL_CHECK(a.in_dims.size() == a.inputs.size() && a.in_ndims.size() == a.inputs.size() &&
                    a.out_dims.size() == a.out_ndims.size())
      << "slice_loop %" << loop.name << ": one in_dims/in_ndims per input and one out_ndims per out_dims";
  for (int64_t d : a.out_dims)
    HB_INTERNAL_CHECK(d >= kOutSummed) << "slice_loop %" << loop.name << ": out_dims " << d << " is not a dim, "
                                       << kOutReplicated << " (replicated) or " << kOutSummed << " (summed)";
  const Arg* s = loop.kwarg("slices");
  const Arg* e = loop.kwarg("extent");
  HB_INTERNAL_CHECK(s && e) << "slice_loop %" << loop.name << " lacks slices/extent";
  a.slices = s->i;
  a.extent = e->i;
  return a;
}

const Graph* slice_loop_body(const Graph& g, const Node& n) {
  if (n.target != kSliceLoopTarget || n.args.empty() || n.args[0].kind != Arg::Kind::Graph) return nullptr;
  auto it = g.subgraphs.find(n.args[0].s);
  return it == g.subgraphs.end() ? nullptr : it->second.get();
}

std::optional<std::vector<SliceRange>> slice_box(const std::vector<int64_t>& group, int64_t slices, int64_t i) {
  int64_t E = 1;
  for (int64_t s : group) {
    if (s < 1) return std::nullopt;  // an empty group has no slices
    E *= s;
  }
  if (slices < 1 || E % slices != 0 || i < 0 || i >= slices) return std::nullopt;
  const int64_t c = E / slices;
  const int k = static_cast<int>(group.size());
  // Find the pivot: dims right of it are covered whole (their product P divides c), the pivot is
  // narrowed by m = c / P, which must divide its size so slices never straddle its end.
  int pivot = -1;
  int64_t P = 1;
  for (int j = k - 1; j >= 0; --j) {
    if (c % (P * group[j]) == 0) {
      P *= group[j];
      continue;
    }
    if (c % P != 0 || group[j] % (c / P) != 0) return std::nullopt;
    pivot = j;
    break;
  }
  std::vector<SliceRange> out(k);
  int64_t flat = i * c;
  for (int j = k - 1; j >= 0; --j) {
    const int64_t idx = flat % group[j];
    flat /= group[j];
    if (pivot < 0 || j > pivot) out[j] = {0, group[j]};
    else if (j == pivot) out[j] = {idx, c / P};
    else out[j] = {idx, 1};
  }
  return out;
}

}  // namespace hb
