// The one textual form of the IR. Deterministic: FX node names, attributes in a fixed order. The parser
// (Parser.h) reads it back: print_graph(parse_graph(text)) == text.
//
//   graph forward {
//     %primals_1: f32[4, 8] = placeholder
//     %t: f32[8, 16][1, 8] = aten::t.default(%primals_3) !view
//     %addmm: f32[4, 16] = aten::addmm.default(%primals_2, %primals_1, %t)  {region=0 path=0 schedule=dfs}
//     return (%addmm, none)
//   }
//   graph slice_body_0 { ... }            a subgraph of the graph above
//   graph slice_body_0/fused_1 { ... }    a subgraph of slice_body_0
//
// A tensor type is dtype[shape], then [strides] when they are not the contiguous ones, then @device when
// not on the CPU; effects follow the call (!mutates, !view, !random), then the hints in braces.
#pragma once
#include <ostream>
#include <string>

#include "backend/ir/Graph.h"

namespace hb {

std::string to_string(const TensorType& t);  // f32[4, s0]
std::string to_string(const ValueType& t);
std::string to_string(const Arg& a);
std::string print_node(const Graph& g, int node);
// Prints the graph and then its subgraphs, each as its own `graph name { ... }` block.
std::string print_graph(const Graph& g);
std::ostream& operator<<(std::ostream& os, const Graph& g);

}  // namespace hb
