// fold-softmax-upcast: IR-text tests on small graphs (half-precision scores upcast, then softmax).
#include <gtest/gtest.h>

#include <string>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Printer.h"
#include "passes/Pipeline.h"
#include "passes/SoftmaxUpcast.h"
#include "tests/cpp/core/IrTestUtil.h"

namespace hb {
namespace {

std::string val(const std::string& dtype, const std::string& device) {
  return R"({"tensor": {"shape": [2, 8], "stride": [8, 1], "dtype": ")" + dtype + R"(", "device": ")" + device + R"("}})";
}

// s (dtype, device) -> up = <upcast>(s) -> sm = <softmax>(up, -1, half_to_float); returns sm (and up
// when `up_returned`).
std::string doc(const std::string& dtype, const std::string& device, const std::string& upcast_kwargs,
                const std::string& softmax = "aten::_softmax.default", bool half_to_float = false,
                bool up_returned = false) {
  const std::string up_target = upcast_kwargs.empty() ? "prims::convert_element_type.default" : "aten::_to_copy.default";
  const std::string up_args = upcast_kwargs.empty() ? R"([{"ref": "s"}, {"dtype": "float32"}])" : R"([{"ref": "s"}])";
  return R"({"format": "hintbackend.graph", "version": 1, "graph": {"name": "g", "nodes": [)"
         R"({"name": "s", "op": "placeholder", "target": "s", "val": )" + val(dtype, device) + "}," +
         R"({"name": "up", "op": "call_function", "target": ")" + up_target + R"(", "args": )" + up_args +
         R"(, "kwargs": {)" + upcast_kwargs + R"(}, "val": )" + val("float32", device) + "}," +
         R"({"name": "sm", "op": "call_function", "target": ")" + softmax +
         R"(", "args": [{"ref": "up"}, {"int": -1}, {"bool": )" + (half_to_float ? "true" : "false") +
         R"(}], "val": )" + val("float32", device) + "}," +
         R"({"name": "output", "op": "output", "args": [{"tuple": [{"ref": "sm"})" + (up_returned ? R"(, {"ref": "up"})" : "") +
         "]}]}]}}";
}

std::string run(const std::string& text, PassContext& ctx) {
  auto g = import_json(text);
  ctx.verify_each = true;
  run_passes(*g, {"fold-softmax-upcast"}, ctx);
  return print_graph(*g);
}

const char* kToFloat = R"("dtype": {"dtype": "float32"})";

TEST(fold_softmax_upcast, fp16_upcast_on_cuda_folds_into_half_to_float) {
  PassContext ctx;
  const std::string ir = run(doc("float16", "cuda:0", kToFloat), ctx);
  test::check_lines(ir, {"%s: f16[2, 8]@cuda:0 = placeholder", "%sm: f32[2, 8]@cuda:0 = aten::_softmax.default(%s, -1, true)",
                         "return (%sm,)"});
  EXPECT_EQ(ir.find("%up"), std::string::npos) << ir;
  ASSERT_EQ(ctx.notes.size(), 1u);
  EXPECT_EQ(ctx.notes[0], "fold-softmax-upcast graph g: %sm reads %s (float16) directly, %up removed");
}

TEST(fold_softmax_upcast, prims_convert_and_log_softmax_fold_too) {
  PassContext ctx;
  const std::string ir = run(doc("float16", "cuda", "", "aten::_log_softmax.default"), ctx);
  test::check_lines(ir, {"aten::_log_softmax.default(%s, -1, true)"});
  EXPECT_EQ(ir.find("%up"), std::string::npos) << ir;
}

TEST(fold_softmax_upcast, upcast_read_elsewhere_stays) {
  PassContext ctx;
  const std::string ir = run(doc("float16", "cuda:0", kToFloat, "aten::_softmax.default", false, true), ctx);
  test::check_lines(ir, {"%up: f32[2, 8]@cuda:0 = aten::_to_copy.default(%s, dtype=dtype.float32)",
                         "aten::_softmax.default(%s, -1, true)", "return (%sm, %up)"});
  EXPECT_EQ(ctx.notes.at(0), "fold-softmax-upcast graph g: %sm reads %s (float16) directly");
}

// CPU has no half_to_float softmax and CUDA's refuses bfloat16; float64 or float32 sources, a softmax
// already upcasting, and an upcast that also changes the memory format are not plain fp16 upcasts.
TEST(fold_softmax_upcast, leaves_everything_else_alone) {
  const std::string cases[] = {
      doc("float16", "cpu", kToFloat),
      doc("bfloat16", "cuda:0", kToFloat),
      doc("float64", "cuda:0", kToFloat),
      doc("float32", "cuda:0", kToFloat),
      doc("float16", "cuda:0", kToFloat, "aten::_softmax.default", true),
      doc("float16", "cuda:0", std::string(kToFloat) + R"(, "memory_format": {"memory_format": "channels_last"})"),
  };
  for (const std::string& c : cases) {
    SCOPED_TRACE(c);
    PassContext ctx;
    auto g = import_json(c);
    const std::string before = print_graph(*g);
    EXPECT_FALSE(fold_softmax_upcast(*g, ctx));
    EXPECT_EQ(print_graph(*g), before);
    EXPECT_TRUE(ctx.notes.empty());
  }
}

}  // namespace
}  // namespace hb
