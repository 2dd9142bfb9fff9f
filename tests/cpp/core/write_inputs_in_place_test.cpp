// write-inputs-in-place (passes/WriteInputsInPlace.h): training BatchNorm's functional form and the batch
// count's add write the inputs the caller writes them back into; what it leaves, and the lifetimes of the
// in-place BatchNorm's elements.
#include <gtest/gtest.h>

#include "IrTestUtil.h"
#include "backend/ir/Parser.h"
#include "passes/Lifetimes.h"

namespace hb::test {
namespace {

// A forward as AOTAutograd gives it for Linear -> BatchNorm1d in training: the batch count and both
// statistics are its first outputs (written back into primals_4, 5 and 6), the statistics saved again.
const char* kBatchNormForward = R"(
graph forward_0 {
  %primals_1: f32[8, 6] = placeholder
  %primals_4: i64[] = placeholder
  %primals_5: f32[6] = placeholder
  %primals_6: f32[6] = placeholder
  %primals_7: f32[6] = placeholder
  %primals_8: f32[6] = placeholder
  %add: i64[] = aten::add.Tensor(%primals_4, 1)
  %bn: (f32[8, 6], f32[6], f32[6], f32[6], f32[6]) = aten::_native_batch_norm_legit_functional.default(%primals_1, %primals_7, %primals_8, %primals_5, %primals_6, true, 0.5, 0.25)
  %getitem: f32[8, 6] = operator::getitem(%bn, 0)
  %getitem_1: f32[6] = operator::getitem(%bn, 1)
  %getitem_2: f32[6] = operator::getitem(%bn, 2)
  %getitem_3: f32[6] = operator::getitem(%bn, 3)
  %getitem_4: f32[6] = operator::getitem(%bn, 4)
  %tanh: f32[8, 6] = aten::tanh.default(%getitem)
  return (%add, %getitem_3, %getitem_4, %tanh, %getitem_1, %getitem_2, %getitem_3, %getitem_4)
}
)";

PassContext writes(std::vector<std::string> names) {
  PassContext ctx;
  ctx.input_writes = std::move(names);
  return ctx;
}

TEST(write_inputs_in_place, batch_norm_and_its_batch_count) {
  file_check(std::string("// RUN: write-inputs-in-place\n") + kBatchNormForward + R"(
// CHECK: %add: i64[] = aten::add_.Tensor(%primals_4, 1) !mutates
// CHECK-NEXT: %bn: (f32[8, 6], f32[6], f32[6], f32[6], f32[6]) = hintbackend::batch_norm_in_place.default(%primals_1, %primals_7, %primals_8, %primals_5, %primals_6, 0.5, 0.25) !mutates
// CHECK-NEXT: %getitem: f32[8, 6] = operator::getitem(%bn, 0)
// CHECK: return (%add, %getitem_3, %getitem_4, %tanh, %getitem_1, %getitem_2, %getitem_3, %getitem_4)
// CHECK: // note: write-inputs-in-place graph forward_0: %primals_4 by %add (add_), %primals_5 and %primals_6 by %bn (batch_norm_in_place)
)",
             writes({"primals_4", "primals_5", "primals_6"}));
}

// A bf16 module's forward: the functional form's new statistics are float, converted (to `dtype`) before
// they are written back; `returned` is the output list.
std::string half_precision_forward(const std::string& dtype, const std::string& returned) {
  const std::string t = dtype == "float16" ? "f16" : "bf16";
  return R"(
// RUN: write-inputs-in-place
graph forward_0 {
  %x: bf16[8, 6] = placeholder
  %m: bf16[6] = placeholder
  %v: bf16[6] = placeholder
  %bn: (bf16[8, 6], f32[6], f32[6], f32[6], f32[6]) = aten::_native_batch_norm_legit_functional.default(%x, none, none, %m, %v, true, 0.5, 0.25)
  %y: bf16[8, 6] = operator::getitem(%bn, 0)
  %getitem_3: f32[6] = operator::getitem(%bn, 3)
  %getitem_4: f32[6] = operator::getitem(%bn, 4)
  %c3: )" + t + R"([6] = aten::_to_copy.default(%getitem_3, dtype=dtype.)" + dtype + R"(, layout=layout.strided)
  %c4: bf16[6] = aten::_to_copy.default(%getitem_4, dtype=dtype.bfloat16, layout=layout.strided)
  return )" + returned + R"(
}
)";
}

TEST(write_inputs_in_place, a_half_precision_module_converts_its_statistics_back) {
  // In place, the conversions read as the elements, which take the inputs' type.
  file_check(half_precision_forward("bfloat16", "(%c3, %c4, %y, %c3, %c4)") + R"(
// CHECK: %bn: (bf16[8, 6], f32[6], f32[6], bf16[6], bf16[6]) = hintbackend::batch_norm_in_place.default(%x, none, none, %m, %v, 0.5, 0.25) !mutates
// CHECK-NEXT: %y: bf16[8, 6] = operator::getitem(%bn, 0)
// CHECK-NEXT: %getitem_3: bf16[6] = operator::getitem(%bn, 3)
// CHECK-NEXT: %getitem_4: bf16[6] = operator::getitem(%bn, 4)
// CHECK-NOT: _to_copy
// CHECK: return (%getitem_3, %getitem_4, %y, %getitem_3, %getitem_4)
// CHECK: // note: write-inputs-in-place graph forward_0: %m and %v by %bn (batch_norm_in_place)
)",
             writes({"m", "v"}));
  // A conversion to another dtype than the input's, or of an element something else reads too, is a
  // value of its own: left.
  const std::string left = R"(
// CHECK: = aten::_native_batch_norm_legit_functional.default(
// CHECK-NOT: // note:
)";
  file_check(half_precision_forward("float16", "(%c3, %c4, %y)") + left, writes({"m", "v"}));
  file_check(half_precision_forward("bfloat16", "(%c3, %c4, %y, %getitem_3)") + left, writes({"m", "v"}));
}

TEST(write_inputs_in_place, nothing_without_writes_or_under_cuda_graphs) {
  // No input is written back (an inference graph, AOTAutograd's runtime): the functional forms stay, and
  // the pass says nothing. Under CUDA graphs (keep_across_calls false) neither.
  const std::string leaves = std::string("// RUN: write-inputs-in-place\n") + kBatchNormForward + R"(
// CHECK: %add: i64[] = aten::add.Tensor(%primals_4, 1)
// CHECK-NEXT: %bn: (f32[8, 6], f32[6], f32[6], f32[6], f32[6]) = aten::_native_batch_norm_legit_functional.default(
// CHECK-NOT: // note:
)";
  file_check(leaves);
  PassContext replay = writes({"primals_4", "primals_5", "primals_6"});
  replay.keep_across_calls = false;
  file_check(leaves, replay);
}

TEST(write_inputs_in_place, leaves_what_would_change_a_value_read) {
  // %primals_5 is also read by %shifted (the old value, before the BatchNorm): the BatchNorm keeps its
  // functional form (both statistics or neither). The add written back into %c2 broadcasts into another
  // type (its result is not the input's): it stays. The count's new value is a chain, (count + 1) * 2:
  // both links write the count.
  file_check(R"(
// RUN: write-inputs-in-place
graph g {
  %x: f32[8, 6] = placeholder
  %count: i64[] = placeholder
  %m: f32[6] = placeholder
  %v: f32[6] = placeholder
  %c2: f32[1] = placeholder
  %shifted: f32[8, 6] = aten::add.Tensor(%x, %m)
  %bn: (f32[8, 6], f32[6], f32[6], f32[6], f32[6]) = aten::_native_batch_norm_legit_functional.default(%shifted, none, none, %m, %v, true, 0.5, 0.25)
  %y: f32[8, 6] = operator::getitem(%bn, 0)
  %nm: f32[6] = operator::getitem(%bn, 3)
  %nv: f32[6] = operator::getitem(%bn, 4)
  %wide: f32[6] = aten::add.Tensor(%c2, %nm)
  %count1: i64[] = aten::add.Tensor(%count, 1)
  %other: i64[] = aten::mul.Tensor(%count1, 2)
  return (%nm, %nv, %wide, %other, %y)
}
// CHECK: = aten::_native_batch_norm_legit_functional.default(%shifted, none, none, %m, %v, true, 0.5, 0.25)
// CHECK: %wide: f32[6] = aten::add.Tensor(%c2, %nm)
// CHECK-NEXT: %count1: i64[] = aten::add_.Tensor(%count, 1) !mutates
// CHECK-NEXT: %other: i64[] = aten::mul_.Tensor(%count1, 2) !mutates
// CHECK: // note: write-inputs-in-place graph g: %count by %count1, %other (add_, mul_)
)",
             writes({"m", "v", "c2", "count"}));
  // Eval mode (training false) writes nothing; the statistics written back from the wrong elements
  // (swapped) are not this BatchNorm's update.
  auto batch_norm = [](const std::string& training, const std::string& returned) {
    return R"(
// RUN: write-inputs-in-place
graph g {
  %x: f32[8, 6] = placeholder
  %m: f32[6] = placeholder
  %v: f32[6] = placeholder
  %bn: (f32[8, 6], f32[6], f32[6], f32[6], f32[6]) = aten::_native_batch_norm_legit_functional.default(%x, none, none, %m, %v, )" +
           training + R"(, 0.5, 0.25)
  %nm: f32[6] = operator::getitem(%bn, 3)
  %nv: f32[6] = operator::getitem(%bn, 4)
  %y: f32[8, 6] = operator::getitem(%bn, 0)
  return )" + returned + R"(
}
// CHECK: = aten::_native_batch_norm_legit_functional.default(%x, none, none, %m, %v, )" +
           training + R"(, 0.5, 0.25)
// CHECK-NOT: // note:
)";
  };
  file_check(batch_norm("false", "(%nm, %nv, %y)"), writes({"m", "v"}));
  file_check(batch_norm("true", "(%nv, %nm, %y)"), writes({"m", "v"}));
}

TEST(write_inputs_in_place, a_buffer_written_through_a_view) {
  // `cache[:, pos:pos + 2] = kv` with pos symbolic: the functional copy into the view becomes copy_ into
  // the cache's own view, the scatter goes and its readers read the cache; `cache.index_copy_(1, idx, kv)`
  // and an average's lerp_ are their in-place overloads.
  file_check(R"(
// RUN: write-inputs-in-place
graph inference_0 {
  %cache: f32[2, 16, 8] = placeholder
  %pos: symint(s0) = placeholder
  %kv: f32[2, 2, 8] = placeholder
  %end: symint(s0 + 2) = operator::add(%pos, 2)
  %v: f32[2, 2, 8][128, 8, 1] = aten::slice.Tensor(%cache, 1, %pos, %end) !view
  %c: f32[2, 2, 8][128, 8, 1] = aten::copy.default(%v, %kv)
  %s: f32[2, 16, 8] = aten::slice_scatter.default(%cache, %c, 1, %pos, %end)
  %sq: f32[2, 16, 8] = aten::mul.Tensor(%s, %s)
  return (%s, %sq)
}
// CHECK: %c: f32[2, 2, 8][128, 8, 1] = aten::copy_.default(%v, %kv) !mutates
// CHECK-NEXT: %sq: f32[2, 16, 8] = aten::mul.Tensor(%cache, %cache)
// CHECK-NEXT: return (%cache, %sq)
// CHECK: // note: write-inputs-in-place graph inference_0: %cache by %c (copy_ into a view)
)",
             writes({"cache"}));
  file_check(R"(
// RUN: write-inputs-in-place
graph inference_0 {
  %cache: f32[2, 16, 8] = placeholder
  %ema: f32[8] = placeholder
  %idx: i64[2] = placeholder
  %kv: f32[2, 2, 8] = placeholder
  %m: f32[8] = placeholder
  %i: f32[2, 16, 8] = aten::index_copy.default(%cache, 1, %idx, %kv)
  %l: f32[8] = aten::lerp.Scalar(%ema, %m, 0.25)
  return (%i, %l, %m)
}
// CHECK: %i: f32[2, 16, 8] = aten::index_copy_.default(%cache, 1, %idx, %kv) !mutates
// CHECK-NEXT: %l: f32[8] = aten::lerp_.Scalar(%ema, %m, 0.25) !mutates
// CHECK: // note: write-inputs-in-place graph inference_0: %cache by %i (index_copy_), %ema by %l (lerp_)
)",
             writes({"cache", "ema"}));
}

TEST(write_inputs_in_place, leaves_views_of_other_places_and_values_returned_twice) {
  // The view written is not the scatter's (another position); a new value also returned elsewhere (saved
  // for a backward, or the user's) would become the input itself there: both left.
  file_check(R"(
// RUN: write-inputs-in-place
graph forward_0 {
  %cache: f32[2, 16, 8] = placeholder
  %count: i64[] = placeholder
  %kv: f32[2, 8] = placeholder
  %v: f32[2, 8][128, 1] = aten::select.int(%cache, 1, 3)
  %c: f32[2, 8][128, 1] = aten::copy.default(%v, %kv)
  %s: f32[2, 16, 8] = aten::select_scatter.default(%cache, %c, 1, 4)
  %n: i64[] = aten::add.Tensor(%count, 1)
  return (%s, %n, %n)
}
// CHECK: %s: f32[2, 16, 8] = aten::select_scatter.default(%cache, %c, 1, 4)
// CHECK-NEXT: %n: i64[] = aten::add.Tensor(%count, 1)
// CHECK-NOT: // note:
)",
             writes({"cache", "count"}));
}

TEST(write_inputs_in_place, a_chain_of_updates_writes_the_buffer_op_by_op) {
  // `ema.mul_(0.75).add_(x, alpha=0.25)` is traced as mul, then add reading the mul: both become their
  // in-place overloads, each writing the buffer. The chain of `acc` has a link that something else reads
  // (the mean): it stays functional whole; so does `buf`'s, whose first link reads the buffer twice over a
  // view, and `t`'s, whose first link changes the dtype.
  file_check(R"(
// RUN: write-inputs-in-place
graph forward_0 {
  %ema: f32[8] = placeholder
  %acc: f32[8] = placeholder
  %buf: f32[8] = placeholder
  %t: bf16[8] = placeholder
  %x: f32[8] = placeholder
  %m: f32[8] = aten::mul.Tensor(%ema, 0.75)
  %a: f32[8] = aten::add.Tensor(%m, %x, alpha=0.25)
  %m2: f32[8] = aten::mul.Tensor(%acc, 0.5)
  %a2: f32[8] = aten::add.Tensor(%m2, %x)
  %mean: f32[] = aten::mean.default(%m2)
  %v: f32[4][2] = aten::slice.Tensor(%buf, 0, 0, 8, 2) !view
  %m3: f32[8] = aten::mul.Tensor(%buf, 2)
  %s3: f32[8] = aten::sub.Tensor(%m3, %x)
  %m4: f32[8] = aten::mul.Tensor(%t, %x)
  %c4: bf16[8] = aten::_to_copy.default(%m4, dtype=dtype.bfloat16)
  return (%a, %a2, %s3, %c4, %mean, %v)
}
// CHECK: %m: f32[8] = aten::mul_.Tensor(%ema, 0.75) !mutates
// CHECK-NEXT: %a: f32[8] = aten::add_.Tensor(%m, %x, alpha=0.25) !mutates
// CHECK-NEXT: %m2: f32[8] = aten::mul.Tensor(%acc, 0.5)
// CHECK-NEXT: %a2: f32[8] = aten::add.Tensor(%m2, %x)
// CHECK: %m3: f32[8] = aten::mul.Tensor(%buf, 2)
// CHECK-NEXT: %s3: f32[8] = aten::sub.Tensor(%m3, %x)
// CHECK: // note: write-inputs-in-place graph forward_0: %ema by %m, %a (mul_, add_)
)",
             writes({"ema", "acc", "buf", "t"}));
}

TEST(write_inputs_in_place, lifetimes_root_the_statistics_in_the_inputs) {
  // After the rewrite the statistics (elements 3, 4) live in the placeholders' storage, the output and
  // the saved mean and invstd (elements 0 to 2) in fresh memory of their own; the add_ lives in its input.
  auto g = parse_graph(kBatchNormForward);
  PassContext ctx = writes({"primals_4", "primals_5", "primals_6"});
  run_passes(*g, {"write-inputs-in-place"}, ctx);
  const Lifetimes L = lifetimes(*g);
  const int bn = g->find("bn");
  auto root_node = [&](int node, int elem) { return L.vals[L.root[L.find(node, elem)]].node; };
  EXPECT_EQ(root_node(bn, 3), g->find("primals_5"));
  EXPECT_EQ(root_node(bn, 4), g->find("primals_6"));
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(root_node(bn, e), bn) << "element " << e;
    EXPECT_EQ(L.vals[L.root[L.find(bn, e)]].elem, e);
  }
  EXPECT_EQ(root_node(g->find("add"), -1), g->find("primals_4"));
  EXPECT_EQ(root_node(g->find("getitem_3"), -1), g->find("primals_5"));
}

}  // namespace
}  // namespace hb::test
