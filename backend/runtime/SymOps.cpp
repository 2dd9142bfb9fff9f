#include "backend/runtime/SymOps.h"

namespace hb::rt {

SymCode sym_code(const std::string& t, const std::string& where) {
  const std::optional<SymCode> c = sym_op_code(t);
  HB_INTERNAL_CHECK(c.has_value()) << where << ": sym op '" << t << "' has no runtime opcode";
  return *c;
}

}  // namespace hb::rt
