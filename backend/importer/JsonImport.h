// Parses a hintbackend graph document (docs/graph-schema.md) into the IR. Every malformed input
// raises hb::UserError naming the graph, the node and the field at fault; nothing aborts.
#pragma once
#include <memory>
#include <string>

#include "backend/ir/Graph.h"

namespace hb {

constexpr int kSchemaVersion = 1;
constexpr const char* kSchemaFormat = "hintbackend.graph";

std::shared_ptr<Graph> import_json(const std::string& text);

}  // namespace hb
