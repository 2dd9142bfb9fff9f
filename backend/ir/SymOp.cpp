#include "backend/ir/SymOp.h"

#include <map>

namespace hb {

std::optional<SymCode> sym_op_code(const std::string& t) {
  static const std::map<std::string, SymCode> kCodes = {
      {"operator::add", SymCode::Add}, {"operator::sub", SymCode::Sub}, {"operator::mul", SymCode::Mul},
      {"operator::floordiv", SymCode::FloorDiv}, {"operator::mod", SymCode::Mod},
      {"operator::truediv", SymCode::TrueDiv}, {"operator::pow", SymCode::Pow}, {"operator::eq", SymCode::Eq},
      {"operator::ne", SymCode::Ne}, {"operator::lt", SymCode::Lt}, {"operator::le", SymCode::Le},
      {"operator::gt", SymCode::Gt}, {"operator::ge", SymCode::Ge}, {"operator::and_", SymCode::And},
      {"operator::or_", SymCode::Or}, {"torch::sym_max", SymCode::Max}, {"torch.sym_max", SymCode::Max},
      {"torch::sym_min", SymCode::Min}, {"torch.sym_min", SymCode::Min}, {"operator::neg", SymCode::Neg},
      {"operator::not_", SymCode::Not}, {"torch::sym_not", SymCode::Not}, {"torch::sym_float", SymCode::Float},
      {"torch::sym_int", SymCode::Int}, {"math::ceil", SymCode::Ceil}, {"math::floor", SymCode::Floor},
      {"torch::sym_sqrt", SymCode::Sqrt}, {"math::sqrt", SymCode::Sqrt}};
  const auto it = kCodes.find(t);
  if (it == kCodes.end()) return std::nullopt;
  return it->second;
}

}  // namespace hb
