#include "backend/ir/Aliasing.h"

#include <set>

namespace hb {

// The runtime calls each of these through its out= overload with `out` being the dying input itself
// (same shape, strides, dtype): all are TensorIterator kernels, which allow an output that fully
// overlaps an input (as their in-place variants do), or generated out= wrappers that compute the
// functional result first and then copy it into `out`. The row softmax ops (backend/runtime/
// RowSoftmax.h) qualify too: their CUDA kernels read a whole row before a block reduction that every
// thread of the row passes before any writes, and their ATen fallback copies into `out` at the end.
// So does cross_entropy_backward (backend/runtime/CrossEntropyBackward.h): element (i, j) of its result
// reads only element (i, j) of log_probs (of logits, in its .logits form), which its first op (exp, or
// the subtraction of the row's logsumexp) reads before anything writes.
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
      "hintbackend::row_softmax_backward.default", "hintbackend::row_softmax_recompute_backward.default",
      "hintbackend::cross_entropy_backward.default", "hintbackend::cross_entropy_backward.logits"};
  return k.count(n.target) > 0;
}

// An op that returns an alias of its first argument although its schema does not say so (so the
// serializer cannot set is_view): the runtime's result IS a view, so it must not get a buffer of its
// own, and its base must live as long as it does.
bool aliases_without_annotation(const Node& n) { return n.target == "aten::_unsafe_view.default"; }

int aliased_argument(const Node& n, int elem) {
  if (n.target == kBatchNormInPlaceTarget) return elem == 3 || elem == 4 ? elem : -1;
  return 0;
}

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

}  // namespace hb
