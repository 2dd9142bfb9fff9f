// libFuzzer harness over what a graph document reaches without libtorch: the JSON importer and
// verifier, the IR printer and its parser (print(parse(print(g))) == print(g)), and the whole pass
// pipeline with kernel selection and the memory plan, verifying the IR after every pass.
//
// Rejected input must be a UserError (a message naming the node or field); anything else thrown, a
// crash, a sanitizer report or a hang is a finding. Built by `bash .ci/fuzz` (clang,
// -fsanitize=fuzzer,address,undefined); the corpus it starts from is tests/fuzz/corpus plus the
// fixtures under tests/fixtures/ir.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Error.h"
#include "backend/ir/Parser.h"
#include "backend/ir/Printer.h"
#include "passes/Pipeline.h"

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "hb fuzz finding: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::shared_ptr<hb::Graph> g;
  try {
    g = hb::import_json(text);
  } catch (const hb::UserError&) {
    return 0;  // rejected, with a message: what we want
  } catch (const std::exception& e) {
    finding("import threw a non-user error", e.what());
  }
  // The textual IR round-trips.
  const std::string printed = hb::print_graph(*g);
  try {
    const std::string again = hb::print_graph(*hb::parse_graph(printed));
    if (again != printed) finding("print(parse(print(g))) != print(g)", printed + "\n----\n" + again);
  } catch (const std::exception& e) {
    finding("the parser rejects what the printer wrote", std::string(e.what()) + "\n" + printed);
  }
  // The pipeline: an accepted graph either compiles or is refused with a UserError (a hint it breaks).
  try {
    hb::PassContext ctx;
    ctx.verify_each = true;
    hb::compile_program(g, ctx);
  } catch (const hb::UserError&) {
  } catch (const std::exception& e) {
    finding("the pipeline threw a non-user error", std::string(e.what()) + "\n" + printed);
  }
  return 0;
}
