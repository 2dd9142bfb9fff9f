// hb-opt: a hintbackend graph document (JSON) or IR text (as the dumps print it) in, passes by name,
// IR text out. Makes every pass testable without Python.
//
//   hb-opt graph.json                          the whole pipeline; IR after each pass, then its notes
//   hb-opt --passes=memory-plan dump/forward_0/ir-final.txt    IR text in (the first character tells)
//   hb-opt --passes=slice-legality,slice-schedule graph.json
//   hb-opt --list-passes                       the pipeline, one line per pass with its reason
//   cat graph.json | hb-opt -                  reads stdin (also when no file is given)
//   hb-opt --placement=dumps/forward_0/placement.txt graph.json
//                                              plans memory as that run's runtime did (its placement table)
//
// What the target can place is a value handed to the pipeline (backend/ir/Target.h), never a global:
// --placement=structural (default) places every value the IR allows (the runtime's rule, assuming
// every ATen op has an out= kernel); --placement=none places nothing; --placement=FILE reads the
// placement table a real run wrote to its dump folder, so hb-opt plans (and slices) exactly as it did.
// --strategy, --no-in-place and --no-arena are the memory planner's settings (options.py's
// memory_plan_strategy, memory_plan_in_place and arena); --zero-inputs=a,b names placeholders the caller
// passes as zeros (fold-zero-inputs; the lean runtime's undefined gradients); --input-writes=a,b names
// the placeholders the graph's first outputs are written back into, in order (write-inputs-in-place;
// the forward's functionalized buffer updates).
//
// Output per pass: `// ----- IR after <pass> (changed|unchanged)`, the IR (print_graph) when it
// changed or it is the first pass, then `// note: ...` lines for the notes it added.
// Exit codes: 0 ok; 1 hb::UserError (message on stderr); 2 internal error; 64 bad usage.
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/importer/JsonImport.h"
#include "backend/ir/Error.h"
#include "backend/ir/Parser.h"
#include "backend/ir/Printer.h"
#include "codegen/TargetModel.h"
#include "passes/Pipeline.h"

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

void usage(std::ostream& os) {
  os << "usage: hb-opt [--passes=a,b,...] [--print-all] [--list-passes] [--placement=structural|none|FILE]\n"
        "              [--zero-inputs=a,b] [--input-writes=a,b]\n"
        "              [--strategy=greedy-by-size|best-fit] [--no-in-place] [--no-arena] [FILE|-]\n"
        "  reads a hintbackend graph document (JSON) or IR text from FILE or stdin, runs the named passes (default: the\n"
        "  whole pipeline) and prints the IR after each pass and the notes it left.\n"
        "  --print-all   print the IR after every pass, changed or not\n"
        "  --placement   what the runtime can place in its arena: every value the IR allows (structural,\n"
        "                the default), nothing (none), or a run's placement table (the dump's placement.txt)\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> passes;
  bool use_pipeline = true, print_all = false;
  std::string file = "-";
  hb::MemoryPlanOptions memory;
  memory.target = hb::structural_target();
  std::set<std::string> zero_inputs;
  std::vector<std::string> input_writes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--passes=", 0) == 0) {
      passes = split(a.substr(9), ',');
      use_pipeline = false;
    } else if (a.rfind("--placement=", 0) == 0) {
      const std::string v = a.substr(12);
      if (v == "structural") {
        memory.target = hb::structural_target();
      } else if (v == "none") {
        memory.arena = false;
      } else {
        std::ifstream in(v);
        if (!in) {
          std::cerr << "hb-opt: cannot read the placement table '" << v << "'\n";
          return 64;
        }
        memory.target = hb::table_target(std::string(std::istreambuf_iterator<char>(in), {}));
      }
    } else if (a.rfind("--strategy=", 0) == 0) {
      memory.strategy = a.substr(11);
    } else if (a.rfind("--zero-inputs=", 0) == 0) {
      for (const std::string& z : split(a.substr(14), ',')) zero_inputs.insert(z);
    } else if (a.rfind("--input-writes=", 0) == 0) {
      input_writes = split(a.substr(15), ',');
    } else if (a == "--no-in-place") {
      memory.in_place = false;
    } else if (a == "--no-arena") {
      memory.arena = false;
    } else if (a == "--print-all") {
      print_all = true;
    } else if (a == "--list-passes") {
      for (const hb::PassInfo& p : hb::pipeline()) std::cout << p.name << "\t" << p.why << "\n";
      return 0;
    } else if (a == "-h" || a == "--help") {
      usage(std::cout);
      return 0;
    } else if (!a.empty() && a[0] == '-' && a != "-") {
      std::cerr << "hb-opt: unknown option '" << a << "'\n";
      usage(std::cerr);
      return 64;
    } else {
      file = a;
    }
  }
  std::string text;
  if (file == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    std::ifstream in(file);
    if (!in) {
      std::cerr << "hb-opt: cannot read '" << file << "'\n";
      return 1;
    }
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  try {
    const size_t first = text.find_first_not_of(" \t\r\n");
    auto g = first != std::string::npos && text[first] == '{' ? hb::import_json(text) : hb::parse_graph(text);
    std::cout << "// ----- IR after import\n" << hb::print_graph(*g);
    hb::PassContext ctx;
    ctx.verify_each = true;
    ctx.memory = memory;
    ctx.zero_inputs = zero_inputs;
    ctx.input_writes = input_writes;
    size_t seen_notes = 0;
    ctx.after_pass = [&](const std::string& pass, const hb::Graph& graph, bool changed) {
      std::cout << "// ----- IR after " << pass << " (" << (changed ? "changed" : "unchanged") << ")\n";
      if (changed || print_all) std::cout << hb::print_graph(graph);
      for (; seen_notes < ctx.notes.size(); ++seen_notes) {
        std::istringstream lines(ctx.notes[seen_notes]);
        std::string line;
        while (std::getline(lines, line)) std::cout << "// note: " << line << "\n";
      }
    };
    if (use_pipeline) hb::run_pipeline(*g, ctx);
    else hb::run_passes(*g, passes, ctx);
    for (; seen_notes < ctx.notes.size(); ++seen_notes) std::cout << "// note: " << ctx.notes[seen_notes] << "\n";
  } catch (const hb::UserError& e) {
    std::cout.flush();
    std::cerr << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << e.what() << "\n";
    return 2;
  }
  return 0;
}
