// The parser of the textual IR (Printer.h): what the dumps print can be read back, so pass tests are
// written as IR text in, CHECK lines out (tests/cpp/core/IrTestUtil.h), and hb-opt reads a dump as well
// as a graph document. print_graph(parse_graph(text)) == text for every graph the printer prints.
//
// The text holds what passes need (types with non-default strides and devices, effects, hints,
// subgraphs with their nesting, constants by index); it does not hold FX source locations, the verbatim
// custom metadata or requires_grad, which parse to their defaults. A reference names a node on an
// earlier line of its graph (FX order is topological). Errors are hb::UserError naming the line and
// column and what was expected, with the line and a caret under the column. The result is verified
// (Verifier.h), as the importer's is.
#pragma once
#include <memory>
#include <string>

#include "backend/ir/Graph.h"

namespace hb {

std::shared_ptr<Graph> parse_graph(const std::string& text);

}  // namespace hb
