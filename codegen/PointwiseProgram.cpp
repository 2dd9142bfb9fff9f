#include "codegen/PointwiseProgram.h"

#include <map>
#include <sstream>

#include "backend/ir/Error.h"

namespace hb {

const char* pw_op_name(PwOp op) {
  switch (op) {
    case PwOp::Load: return "load";
    case PwOp::Const: return "const";
    case PwOp::Add: return "add";
    case PwOp::Sub: return "sub";
    case PwOp::Mul: return "mul";
    case PwOp::Div: return "div";
    case PwOp::Maximum: return "maximum";
    case PwOp::Minimum: return "minimum";
    case PwOp::Neg: return "neg";
    case PwOp::Relu: return "relu";
    case PwOp::Sigmoid: return "sigmoid";
    case PwOp::Tanh: return "tanh";
    case PwOp::Exp: return "exp";
    case PwOp::Log: return "log";
    case PwOp::Sqrt: return "sqrt";
    case PwOp::Rsqrt: return "rsqrt";
    case PwOp::Abs: return "abs";
    case PwOp::Reciprocal: return "reciprocal";
    case PwOp::Sin: return "sin";
    case PwOp::Cos: return "cos";
    case PwOp::Log1p: return "log1p";
    case PwOp::Expm1: return "expm1";
    case PwOp::Erf: return "erf";
    case PwOp::Silu: return "silu";
    case PwOp::Gelu: return "gelu";
    case PwOp::GeluTanh: return "gelu_tanh";
    case PwOp::LeakyRelu: return "leaky_relu";
    case PwOp::PowScalar: return "pow";
    case PwOp::ThresholdBackward: return "threshold_backward";
    case PwOp::SigmoidBackward: return "sigmoid_backward";
    case PwOp::TanhBackward: return "tanh_backward";
    case PwOp::SiluBackward: return "silu_backward";
  }
  return "?";
}

namespace {

// How a target lowers. Operands are positional args 0..arity-1 (tensor refs or numbers).
enum class Form {
  Binary,         // op(a0, a1)
  BinaryAlpha,    // a0 op alpha * a1   (add/sub .Tensor, alpha kwarg or arg 2, default 1)
  RsubAlpha,      // a1 - alpha * a0    (rsub)
  Unary,          // op(a0)
  UnaryK,         // op(a0) with k = number arg 1 (or kwarg `k_name`), default k_default
  BackwardK,      // op(a0, a1) with k = number arg 2 (threshold_backward)
  Gelu,           // gelu(a0, approximate='none'|'tanh')
};
struct OpRule {
  PwOp op;
  Form form;
  const char* k_name = "";
  double k_default = 0.0;
};

const std::map<std::string, OpRule>& rules() {
  static const std::map<std::string, OpRule> kRules = {
      {"aten::add.Tensor", {PwOp::Add, Form::BinaryAlpha}},
      {"aten::sub.Tensor", {PwOp::Sub, Form::BinaryAlpha}},
      {"aten::rsub.Tensor", {PwOp::Sub, Form::RsubAlpha}},
      {"aten::rsub.Scalar", {PwOp::Sub, Form::RsubAlpha}},
      {"aten::mul.Tensor", {PwOp::Mul, Form::Binary}},
      {"aten::div.Tensor", {PwOp::Div, Form::Binary}},
      {"aten::maximum.default", {PwOp::Maximum, Form::Binary}},
      {"aten::minimum.default", {PwOp::Minimum, Form::Binary}},
      {"aten::neg.default", {PwOp::Neg, Form::Unary}},
      {"aten::relu.default", {PwOp::Relu, Form::Unary}},
      {"aten::sigmoid.default", {PwOp::Sigmoid, Form::Unary}},
      {"aten::tanh.default", {PwOp::Tanh, Form::Unary}},
      {"aten::exp.default", {PwOp::Exp, Form::Unary}},
      {"aten::log.default", {PwOp::Log, Form::Unary}},
      {"aten::sqrt.default", {PwOp::Sqrt, Form::Unary}},
      {"aten::rsqrt.default", {PwOp::Rsqrt, Form::Unary}},
      {"aten::abs.default", {PwOp::Abs, Form::Unary}},
      {"aten::reciprocal.default", {PwOp::Reciprocal, Form::Unary}},
      {"aten::sin.default", {PwOp::Sin, Form::Unary}},
      {"aten::cos.default", {PwOp::Cos, Form::Unary}},
      {"aten::log1p.default", {PwOp::Log1p, Form::Unary}},
      {"aten::expm1.default", {PwOp::Expm1, Form::Unary}},
      {"aten::erf.default", {PwOp::Erf, Form::Unary}},
      {"aten::silu.default", {PwOp::Silu, Form::Unary}},
      {"aten::gelu.default", {PwOp::Gelu, Form::Gelu}},
      {"aten::leaky_relu.default", {PwOp::LeakyRelu, Form::UnaryK, "negative_slope", 0.01}},
      {"aten::pow.Tensor_Scalar", {PwOp::PowScalar, Form::UnaryK, "exponent", 1.0}},
      {"aten::threshold_backward.default", {PwOp::ThresholdBackward, Form::BackwardK, "threshold", 0.0}},
      {"aten::sigmoid_backward.default", {PwOp::SigmoidBackward, Form::Binary}},
      {"aten::tanh_backward.default", {PwOp::TanhBackward, Form::Binary}},
      {"aten::silu_backward.default", {PwOp::SiluBackward, Form::Binary}},
  };
  return kRules;
}

int arity(Form f) {
  switch (f) {
    case Form::Unary:
    case Form::UnaryK:
    case Form::Gelu: return 1;
    default: return 2;
  }
}

bool is_number(const Arg& a) { return a.kind == Arg::Kind::Int || a.kind == Arg::Kind::Float; }
double number(const Arg& a) { return a.kind == Arg::Kind::Int ? static_cast<double>(a.i) : a.f; }

// The scalar parameter of a node: positional `pos`, else kwarg `name`, else `def`. nullptr when present
// but not a constant number.
const Arg* param(const Node& n, size_t pos, const std::string& name) {
  if (n.args.size() > pos) return &n.args[pos];
  return name.empty() ? nullptr : n.kwarg(name);
}

bool fail(std::string* why, const std::string& what) {
  if (why) *why = what;
  return false;
}

}  // namespace

std::string PointwiseProgram::to_string() const {
  std::ostringstream os;
  for (size_t r = 0; r < code.size(); ++r) {
    const PwInstr& in = code[r];
    os << (r ? "; " : "") << "r" << r << " = " << pw_op_name(in.op);
    if (in.op == PwOp::Load) os << " " << in.a;
    else if (in.a >= 0) os << " r" << in.a;
    if (in.b >= 0) os << " r" << in.b;
    if (in.op == PwOp::Const || in.op == PwOp::LeakyRelu || in.op == PwOp::PowScalar ||
        in.op == PwOp::ThresholdBackward)
      os << " " << in.k;
  }
  return os.str();
}

bool has_pointwise_kernel(const std::string& device) {
  // CUDA groups run codegen/cuda/FusedPointwise.cu where the module was built with CUDA; elsewhere
  // the runtime runs their bodies op by op (same results).
  return device == "cpu" || device.rfind("cuda", 0) == 0;
}

bool is_fusable_pointwise(const Graph& g, int i, std::string* why) {
  const Node& n = g.nodes[i];
  if (n.op != OpKind::CallFunction) return fail(why, "not a call");
  auto it = rules().find(n.target);
  if (it == rules().end()) return fail(why, "not a fusable pointwise op");
  const OpRule& rule = it->second;
  if (n.effects.mutates || n.effects.is_view) return fail(why, "in-place or view");
  if (n.type.kind != ValueType::Kind::Tensor) return fail(why, "result is not a tensor");
  const TensorType& t = n.type.tensor;
  if (!is_floating(t.dtype)) return fail(why, std::string("dtype ") + dtype_name(t.dtype) + " is not floating");
  if (!has_pointwise_kernel(t.device)) return fail(why, "no fused pointwise kernel for device " + t.device);
  const int k = arity(rule.form);
  if (static_cast<int>(n.args.size()) < k) return fail(why, "missing operands");
  bool any_tensor = false;
  for (int j = 0; j < k; ++j) {
    const Arg& a = n.args[j];
    if (a.kind == Arg::Kind::Ref) {
      const ValueType& vt = g.nodes[a.ref].type;
      if (vt.kind != ValueType::Kind::Tensor) return fail(why, "operand %" + a.s + " is not a tensor");
      if (vt.tensor.dtype != t.dtype || vt.tensor.device != t.device)
        return fail(why, "operand %" + a.s + " has another dtype or device (type promotion)");
      any_tensor = true;
    } else if (!is_number(a)) {
      return fail(why, "operand " + std::to_string(j) + " is neither a tensor nor a number");
    }
  }
  if (!any_tensor) return fail(why, "no tensor operand");
  // Parameters must be constant numbers (a SymInt alpha would change per call).
  switch (rule.form) {
    case Form::BinaryAlpha:
    case Form::RsubAlpha: {
      const Arg* alpha = param(n, 2, "alpha");
      if (alpha && !is_number(alpha[0])) return fail(why, "alpha is not a constant number");
      break;
    }
    case Form::UnaryK:
    case Form::BackwardK: {
      const Arg* p = param(n, rule.form == Form::UnaryK ? 1 : 2, rule.k_name);
      if (p && !is_number(*p)) return fail(why, std::string(rule.k_name) + " is not a constant number");
      if (!p && rule.form == Form::BackwardK) return fail(why, "missing threshold");
      break;
    }
    case Form::Gelu: {
      const Arg* ap = n.kwarg("approximate");
      if (n.args.size() > 1) ap = &n.args[1];
      if (ap && !(ap->kind == Arg::Kind::Str && (ap->s == "none" || ap->s == "tanh")))
        return fail(why, "unknown gelu approximation");
      break;
    }
    default: break;
  }
  return true;
}

PointwiseProgram compile_pointwise(const Graph& body) {
  PointwiseProgram p;
  std::vector<int> reg(body.nodes.size(), -1);
  auto emit = [&](PwInstr in) {
    p.code.push_back(in);
    return static_cast<int>(p.code.size()) - 1;
  };
  auto constant = [&](double k) { return emit({PwOp::Const, -1, -1, k}); };
  auto operand = [&](const Node& n, const Arg& a) {
    if (a.kind == Arg::Kind::Ref) {
      HB_INTERNAL_CHECK(reg[a.ref] >= 0) << "fused body '" << body.name << "': %" << n.name << " reads %" << a.s
                                         << " before it is computed";
      return reg[a.ref];
    }
    HB_INTERNAL_CHECK(is_number(a)) << "fused body '" << body.name << "': %" << n.name << " has a non-number operand";
    return constant(number(a));
  };
  int result = -1;
  for (size_t i = 0; i < body.nodes.size(); ++i) {
    const Node& n = body.nodes[i];
    if (n.op == OpKind::Placeholder) {
      reg[i] = emit({PwOp::Load, p.num_inputs++, -1, 0.0});
      continue;
    }
    if (n.op == OpKind::Output) {
      HB_INTERNAL_CHECK(n.args.size() == 1 && n.args[0].kind == Arg::Kind::Ref)
          << "fused body '" << body.name << "' must return one value";
      result = reg[n.args[0].ref];
      continue;
    }
    std::string why;
    HB_INTERNAL_CHECK(is_fusable_pointwise(body, static_cast<int>(i), &why))
        << "fused body '" << body.name << "': " << describe(body, static_cast<int>(i)) << " cannot be fused: " << why;
    const OpRule& rule = rules().at(n.target);
    const int a = operand(n, n.args[0]);
    switch (rule.form) {
      case Form::Binary:
        reg[i] = emit({rule.op, a, operand(n, n.args[1]), 0.0});
        break;
      case Form::BinaryAlpha:
      case Form::RsubAlpha: {
        const Arg* alpha = param(n, 2, "alpha");
        const double al = alpha ? number(*alpha) : 1.0;
        int b = operand(n, n.args[1]);
        int scaled = rule.form == Form::BinaryAlpha ? b : a;
        if (al != 1.0) scaled = emit({PwOp::Mul, scaled, constant(al), 0.0});
        reg[i] = rule.form == Form::BinaryAlpha ? emit({rule.op, a, scaled, 0.0}) : emit({rule.op, b, scaled, 0.0});
        break;
      }
      case Form::Unary:
        reg[i] = emit({rule.op, a, -1, 0.0});
        break;
      case Form::UnaryK: {
        const Arg* k = param(n, 1, rule.k_name);
        reg[i] = emit({rule.op, a, -1, k ? number(*k) : rule.k_default});
        break;
      }
      case Form::BackwardK:
        reg[i] = emit({rule.op, a, operand(n, n.args[1]), number(*param(n, 2, rule.k_name))});
        break;
      case Form::Gelu: {
        const Arg* ap = n.args.size() > 1 ? &n.args[1] : n.kwarg("approximate");
        reg[i] = emit({ap && ap->s == "tanh" ? PwOp::GeluTanh : PwOp::Gelu, a, -1, 0.0});
        break;
      }
    }
  }
  HB_INTERNAL_CHECK(result >= 0) << "fused body '" << body.name << "' has no output";
  // The result must be the last register (eval_pointwise writes the last one to `out`).
  if (result != static_cast<int>(p.code.size()) - 1) emit({PwOp::Mul, result, constant(1.0), 0.0});
  return p;
}

}  // namespace hb
