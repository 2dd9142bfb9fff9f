// Graph::inputs_owned (importer, printer, heap simulator), on small graphs whose peaks are worked out by
// hand in the comments (sizes in MiB, so every buffer is already 64-byte aligned).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Error.h"
#include "backend/ir/Printer.h"
#include "passes/MemoryPlan.h"

namespace hb {
namespace {

constexpr int64_t kMiB = 1 << 20;

// ---- graph documents: every tensor is f32[k, 262144], i.e. k MiB --------------------------------
std::string mib(int k) {
  return R"({"tensor": {"shape": [)" + std::to_string(k) + R"(, 262144], "stride": [262144, 1], "dtype": "float32", "device": "cpu"}})";
}
std::string ph(const std::string& name, int k) {
  return R"({"name": ")" + name + R"(", "op": "placeholder", "target": ")" + name + R"(", "val": )" + mib(k) + "},";
}
// `inputs`: node names; `effects`: "" or a JSON object such as {"mutates": true}.
std::string op(const std::string& name, const std::string& target, const std::vector<std::string>& inputs, int k,
               const std::string& effects = "") {
  std::string args;
  for (const std::string& i : inputs) args += (args.empty() ? "" : ", ") + std::string(R"({"ref": ")") + i + "\"}";
  std::string s = R"({"name": ")" + name + R"(", "op": "call_function", "target": ")" + target + R"(", "args": [)" +
                  args + R"(], "val": )" + mib(k);
  if (!effects.empty()) s += R"(, "effects": )" + effects;
  return s + "},";
}
std::string ret(const std::vector<std::string>& results) {
  std::string items;
  for (const std::string& r : results) items += (items.empty() ? "" : ", ") + std::string(R"({"ref": ")") + r + "\"}";
  return R"({"name": "output", "op": "output", "args": [{"tuple": [)" + items + "]}]}";
}
std::string doc(const std::string& nodes, const std::string& graph_fields = "") {
  return R"({"format": "hintbackend.graph", "version": 1, "graph": {"name": "g", )" + graph_fields + R"("nodes": [)" +
         nodes + "]}}";
}

// ---- inputs_owned ----------------------------------------------------------------------------------

TEST(inputs_owned, importer_reads_it_and_the_printer_shows_it) {
  const std::string nodes = ph("x", 1) + ret({"x"});
  EXPECT_FALSE(import_json(doc(nodes))->inputs_owned);
  EXPECT_FALSE(import_json(doc(nodes, R"("inputs_owned": false, )"))->inputs_owned);
  auto g = import_json(doc(nodes, R"("inputs_owned": true, )"));
  EXPECT_TRUE(g->inputs_owned);
  EXPECT_EQ(print_graph(*g).rfind("graph g (inputs owned) {\n", 0), 0u) << print_graph(*g);
  EXPECT_EQ(print_graph(*import_json(doc(nodes))).rfind("graph g {\n", 0), 0u);
  try {
    import_json(doc(nodes, R"("inputs_owned": 1, )"));
    ADD_FAILURE() << "a non-bool inputs_owned was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'inputs_owned' must be a bool, got number"), std::string::npos) << e.what();
  }
}

// x (4 MiB) -> a = exp(x) (4) -> b = neg(a) (4), b returned.
//   kept:   x lives all call: at b, x 4 + a 4 + b 4                    -> 12 MiB
//   owned:  x dies after a: at a, x 4 + a 4 = 8; at b, a 4 + b 4 = 8   ->  8 MiB
// A returned input lives to the end either way; count_inputs=false ignores inputs as before.
TEST(inputs_owned, the_simulator_frees_an_owned_input_after_its_last_use) {
  const std::string nodes =
      ph("x", 4) + op("a", "aten::exp.default", {"x"}, 4) + op("b", "aten::neg.default", {"a"}, 4) + ret({"b"});
  auto kept = import_json(doc(nodes));
  auto owned = import_json(doc(nodes, R"("inputs_owned": true, )"));
  EXPECT_EQ(simulate_peak(*kept), 12 * kMiB);
  EXPECT_EQ(simulate_peak(*owned), 8 * kMiB);
  EXPECT_EQ(simulate_peak(*kept, false), 8 * kMiB);
  EXPECT_EQ(simulate_peak(*owned, false), 8 * kMiB);
  const std::string returns_x =
      ph("x", 4) + op("a", "aten::exp.default", {"x"}, 4) + op("b", "aten::neg.default", {"a"}, 4) + ret({"b", "x"});
  EXPECT_EQ(simulate_peak(*import_json(doc(returns_x, R"("inputs_owned": true, )"))), 12 * kMiB);
}

}  // namespace
}  // namespace hb
