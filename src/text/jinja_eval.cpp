// Renders a parsed chat template as Jinja's ImmutableSandboxedEnvironment does
// under transformers (see jinja_eval.h): scopes, loops, macros, {% generation %}.
#include "text/jinja_eval.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <unordered_map>

namespace fsdp::text::jinja {
namespace {

constexpr int kMaxCallDepth = 100;          // macros calling macros (or themselves)
constexpr size_t kMaxOutputBytes = 1 << 28;  // 256 MiB of text: a runaway loop, not a conversation
constexpr size_t kMaxLoopSteps = 10'000'000;

enum class Flow { normal, loop_break, loop_continue };

using Frame = std::unordered_map<std::string, Value>;
// Frames are shared: a macro keeps the frames it was defined in (weakly, so
// that a macro stored in its own frame is no cycle) and reads them live at
// call time, as Jinja's macros, which are Python closures, do.
using FramePtr = std::shared_ptr<Frame>;

// Where a render error happened: the line of the innermost node being run.
struct LocatedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Evaluator {
 public:
  Evaluator(const Dict& variables, const std::string& origin) : origin_(origin) {
    frames_.push_back(std::make_shared<Frame>());
    Dict globals;
    add_globals(globals);
    for (const auto& [k, v] : globals.items) (*frames_[0])[k.string] = v;
    for (const auto& [k, v] : variables.items)
      if (k.is_string()) (*frames_[0])[k.string] = v;
  }
  RenderOutput run(const Body& body) {
    exec(body, output_.text);
    return std::move(output_);
  }

 private:
  [[noreturn]] void fail(int line, const std::string& message) const {
    throw LocatedError(origin_ + ":" + std::to_string(line) + ": " + message);
  }
  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto found = (*it)->find(name);
      if (found != (*it)->end()) return found->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }
  void assign(const std::string& name, Value v) { (*frames_.back())[name] = std::move(v); }
  void push_frame() { frames_.push_back(std::make_shared<Frame>()); }
  void assign_targets(const Node& node, const Value& v, int line);
  void write(std::string& out, const std::string& text, int line) {
    out += text;
    if (out.size() > kMaxOutputBytes) fail(line, "the rendering grows past 256 MiB");
  }

  Flow exec(const Body& body, std::string& out);
  Flow exec_node(const Node& node, std::string& out);
  Flow exec_in_own_scope(const Body& body, std::string& out);
  Flow exec_for(const Node& node, std::string& out);
  Flow exec_if(const Node& node, std::string& out);
  void exec_set_attribute(const Node& node);
  void exec_generation(const Node& node, std::string& out);
  class MacroScope;
  Value make_macro(const Node& node);
  Value call_macro(const Node& node, const std::vector<std::weak_ptr<Frame>>& closure, CallArgs& args);
  Value make_loop(const std::vector<Value>& items, const std::shared_ptr<size_t>& index);
  void advance_loop(Value& loop, const std::vector<Value>& items, size_t i);

  Value eval(const Expr& e);
  Value eval_core(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_filter(const Expr& e, const Value* block_operand);
  Value eval_test(const Expr& e);
  Value eval_call(const Expr& e);
  CallArgs eval_arguments(const Expr& e, size_t first);

  const std::string& origin_;
  std::vector<FramePtr> frames_;
  RenderOutput output_;
  int call_depth_ = 0;
  size_t loop_steps_ = 0;
};

Flow Evaluator::exec(const Body& body, std::string& out) {
  for (const auto& node : body) {
    Flow flow = exec_node(*node, out);
    if (flow != Flow::normal) return flow;
  }
  return Flow::normal;
}

// Filter blocks, block sets and {% generation %} run in an inner frame, as
// Jinja compiles them: names they set do not outlive them (a namespace's
// attributes do).
Flow Evaluator::exec_in_own_scope(const Body& body, std::string& out) {
  push_frame();
  Flow flow;
  try {
    flow = exec(body, out);
  } catch (...) {
    frames_.pop_back();
    throw;
  }
  frames_.pop_back();
  return flow;
}

Flow Evaluator::exec_node(const Node& node, std::string& out) {
  try {
    switch (node.kind) {
      case NodeKind::text: write(out, node.text, node.line); return Flow::normal;
      case NodeKind::output: write(out, to_str(eval(*node.expr)), node.line); return Flow::normal;
      case NodeKind::if_chain: return exec_if(node, out);
      case NodeKind::for_loop: return exec_for(node, out);
      case NodeKind::set: assign_targets(node, eval(*node.expr), node.line); return Flow::normal;
      case NodeKind::set_attribute: exec_set_attribute(node); return Flow::normal;
      case NodeKind::set_block:
      case NodeKind::filter_block: {
        std::string captured;
        Flow flow = exec_in_own_scope(node.body, captured);
        if (flow != Flow::normal) return flow;  // a break inside leaves the block unwritten, as in Jinja
        Value v = Value::from(std::move(captured));
        if (node.expr) v = eval_filter(*node.expr, &v);
        if (node.kind == NodeKind::set_block) assign(node.targets[0], v);
        else write(out, to_str(v), node.line);
        return Flow::normal;
      }
      case NodeKind::macro: assign(node.text, make_macro(node)); return Flow::normal;
      case NodeKind::generation: exec_generation(node, out); return Flow::normal;
      case NodeKind::loop_break: return Flow::loop_break;
      case NodeKind::loop_continue: return Flow::loop_continue;
    }
  } catch (const RenderError& e) {
    fail(node.line, e.what());
  }
  return Flow::normal;
}

Flow Evaluator::exec_if(const Node& node, std::string& out) {
  for (size_t i = 0; i < node.branches.size(); ++i) {
    if (i < node.conditions.size() && !eval(*node.conditions[i]).truthy()) continue;
    return exec(node.branches[i], out);
  }
  return Flow::normal;
}

void Evaluator::assign_targets(const Node& node, const Value& v, int line) {
  if (!node.unpack) {
    assign(node.targets[0], v);
    return;
  }
  std::vector<Value> items = iterate(v);
  if (items.size() != node.targets.size())
    fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                   std::to_string(node.targets.size()) + " names");
  for (size_t i = 0; i < items.size(); ++i) assign(node.targets[i], items[i]);
}

void Evaluator::exec_set_attribute(const Node& node) {
  Value target = lookup(node.targets[0]);
  if (target.kind != Kind::ns) throw RenderError("cannot assign attribute on non-namespace object");
  if (!node.text.empty() && node.text[0] == '_')
    throw RenderError("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
                      node.text + "'. Please rename the attribute.");
  Value value = eval(*node.expr);
  // Python's collector frees a namespace that holds itself; shared pointers would not.
  if (holds(value, target.dict.get())) throw RenderError("a namespace cannot hold itself ('" + node.text + "')");
  int nesting = std::max(target.dict->nesting, value.current_nesting() + 1);
  if (nesting > 512) throw RenderError("values nested deeper than 512 ('" + node.text + "')");
  target.dict->nesting = nesting;
  target.dict->set(Value::from(node.text), std::move(value));
}

// transformers' AssistantTracker: the body's text, and where it begins and ends
// in the output, counted from what the top level has written so far (also
// inside a macro or a block set, whose text is not written yet, as there).
void Evaluator::exec_generation(const Node& node, std::string& out) {
  std::string body;
  exec_in_own_scope(node.body, body);  // a call block's body: a macro, so its sets stay inside
  size_t begin = output_.text.size();
  output_.generation_ranges.emplace_back(begin, begin + body.size());
  write(out, body, node.line);
}

// Jinja's LoopContext is one object that advances, so one namespace per loop
// is updated in place (a template that keeps `loop` sees it advance too).
Value Evaluator::make_loop(const std::vector<Value>& items, const std::shared_ptr<size_t>& index) {
  Value loop = Value::make_namespace();
  loop.view = "LoopContext";  // printed as Jinja's <LoopContext 1/3>
  loop.dict->set(Value::from("length"), Value::from(static_cast<int64_t>(items.size())));
  loop.dict->set(Value::from("depth"), Value::from(1));
  loop.dict->set(Value::from("depth0"), Value::from(0));
  loop.dict->set(Value::from("cycle"), Value::make_function([index](CallArgs& args) {
                   if (args.positional.empty()) throw RenderError("no items for cycling given");
                   return args.positional[*index % args.positional.size()];
                 }));
  for (const char* name : {"index", "index0", "revindex", "revindex0", "first", "last", "previtem", "nextitem"})
    loop.dict->set(Value::from(name), Value());
  return loop;
}

void Evaluator::advance_loop(Value& loop, const std::vector<Value>& items, size_t i) {
  auto& entries = loop.dict->items;  // in make_loop's order: length, depth, depth0, cycle, then these
  const int64_t n = static_cast<int64_t>(items.size()), at = static_cast<int64_t>(i);
  entries[4].second = Value::from(at + 1);
  entries[5].second = Value::from(at);
  entries[6].second = Value::from(n - at);
  entries[7].second = Value::from(n - at - 1);
  entries[8].second = Value::from(i == 0);
  entries[9].second = Value::from(at + 1 == n);
  entries[10].second = i > 0 ? items[i - 1] : Value::undefined("'previtem' is undefined on the first iteration");
  entries[11].second = at + 1 < n ? items[i + 1] : Value::undefined("'nextitem' is undefined on the last iteration");
}

Flow Evaluator::exec_for(const Node& node, std::string& out) {
  Value iterable = eval(*node.expr);
  if (iterable.is_undefined()) iterable = Value::make_list();
  std::vector<Value> all = iterate(iterable), items;
  for (const Value& item : all) {
    if (!node.loop_filter) {
      items.push_back(item);
      continue;
    }
    push_frame();
    assign_targets(node, item, node.line);
    bool keep = eval(*node.loop_filter).truthy();
    frames_.pop_back();
    if (keep) items.push_back(item);
  }
  auto index = std::make_shared<size_t>(0);
  Value loop = make_loop(items, index);
  for (size_t i = 0; i < items.size(); ++i) {
    if (++loop_steps_ > kMaxLoopSteps) fail(node.line, "more than 10 million loop steps");
    *index = i;
    advance_loop(loop, items, i);
    push_frame();
    assign("loop", loop);
    assign_targets(node, items[i], node.line);
    Flow flow;
    try {
      flow = exec(node.body, out);
    } catch (...) {
      frames_.pop_back();
      throw;
    }
    frames_.pop_back();
    if (flow == Flow::loop_break) break;
  }
  if (items.empty()) return exec(node.else_body, out);
  return Flow::normal;
}

Value Evaluator::make_macro(const Node& node) {
  const Node* macro = &node;
  std::vector<std::weak_ptr<Frame>> closure(frames_.begin() + 1, frames_.end());
  return Value::make_function(
      [this, macro, closure](CallArgs& args) { return call_macro(*macro, closure, args); });
}

// A macro runs in its own frame above the top level and the frames it was
// defined in (those still alive), as Jinja's do: the caller's loop and local
// names are out of its sight until it returns.
class Evaluator::MacroScope {
 public:
  MacroScope(Evaluator& evaluator, const std::vector<std::weak_ptr<Frame>>& closure) : evaluator_(evaluator) {
    auto& frames = evaluator_.frames_;
    saved_.assign(std::make_move_iterator(frames.begin() + 1), std::make_move_iterator(frames.end()));
    frames.resize(1);
    for (const auto& weak : closure) {
      FramePtr frame = weak.lock();
      if (!frame) {
        // Jinja's closure would still see them; this one does not, so it refuses rather than guess.
        restore();
        throw RenderError("a macro called after the block it was defined in has ended (kept in a namespace?)");
      }
      frames.push_back(std::move(frame));
    }
    evaluator_.push_frame();
    ++evaluator_.call_depth_;
  }
  ~MacroScope() {
    restore();
    --evaluator_.call_depth_;
  }

 private:
  void restore() {
    auto& frames = evaluator_.frames_;
    frames.resize(1);
    frames.insert(frames.end(), std::make_move_iterator(saved_.begin()), std::make_move_iterator(saved_.end()));
  }

  Evaluator& evaluator_;
  std::vector<FramePtr> saved_;
};

Value Evaluator::call_macro(const Node& node, const std::vector<std::weak_ptr<Frame>>& closure, CallArgs& args) {
  if (call_depth_ >= kMaxCallDepth)
    throw RenderError("macro '" + node.text + "' nests calls deeper than " + std::to_string(kMaxCallDepth));
  MacroScope scope(*this, closure);
  // Defaults are evaluated in the macro's frame, so `b=a` sees the argument a.
  for (size_t i = 0; i < node.params.size(); ++i) {
    const Value* given = args.get(i, node.params[i]);
    if (given) assign(node.params[i], *given);
    else if (node.defaults[i]) assign(node.params[i], eval(*node.defaults[i]));
    else assign(node.params[i], Value::undefined("'" + node.params[i] + "' is undefined"));
  }
  args.expect_all_used("macro '" + node.text + "'");
  std::string out;
  exec(node.body, out);
  return Value::from(std::move(out));
}

Value Evaluator::eval(const Expr& e) {
  try {
    return eval_core(e);
  } catch (const RenderError& err) {
    fail(e.line, err.what());
  }
}

Value Evaluator::eval_core(const Expr& e) {
  switch (e.kind) {
    case ExprKind::literal: return e.value;
    case ExprKind::name: return lookup(e.name);
    case ExprKind::list:
    case ExprKind::tuple: {
      std::vector<Value> items;
      for (const auto& c : e.children) items.push_back(eval(*c));
      return e.kind == ExprKind::list ? Value::make_list(std::move(items)) : Value::make_tuple(std::move(items));
    }
    case ExprKind::dict: {
      Value d = Value::make_dict();
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) d.dict->set(eval(*e.children[i]), eval(*e.children[i + 1]));
      d.refresh_nesting();
      return d;
    }
    case ExprKind::attribute: return get_attribute(eval(*e.children[0]), e.name);
    case ExprKind::subscript: return get_item(eval(*e.children[0]), eval(*e.children[1]));
    case ExprKind::slice: {
      Value parts[3];
      const Value* given[3] = {nullptr, nullptr, nullptr};
      for (int i = 0; i < 3; ++i)
        if (e.children[i + 1]) {
          parts[i] = eval(*e.children[i + 1]);
          given[i] = &parts[i];
        }
      return get_slice(eval(*e.children[0]), given[0], given[1], given[2]);
    }
    case ExprKind::call: return eval_call(e);
    case ExprKind::filter: return eval_filter(e, nullptr);
    case ExprKind::test: return Value::from(eval_test(e).truthy());
    case ExprKind::negate: {
      Value v = eval(*e.children[0]);
      if (v.kind == Kind::floating) return Value::from(-v.floating);  // -0.0 stays negative
      return binary_operation("-", Value::from(0), v);
    }
    case ExprKind::plus: return binary_operation("+", Value::from(0), eval(*e.children[0]));
    case ExprKind::logical_not: return Value::from(!eval(*e.children[0]).truthy());
    case ExprKind::binary: return binary_operation(e.name, eval(*e.children[0]), eval(*e.children[1]));
    case ExprKind::concat: {
      std::string s;
      for (const auto& c : e.children) s += to_str(eval(*c));
      return Value::from(std::move(s));
    }
    case ExprKind::compare: return eval_compare(e);
    case ExprKind::logical_and: {
      Value left = eval(*e.children[0]);
      return left.truthy() ? eval(*e.children[1]) : left;
    }
    case ExprKind::logical_or: {
      Value left = eval(*e.children[0]);
      return left.truthy() ? left : eval(*e.children[1]);
    }
    case ExprKind::conditional:
      if (eval(*e.children[0]).truthy()) return eval(*e.children[1]);
      return e.children[2] ? eval(*e.children[2]) : Value::undefined("the conditional expression has no else");
  }
  return Value();
}

Value Evaluator::eval_compare(const Expr& e) {
  Value left = eval(*e.children[0]);
  for (size_t i = 0; i < e.comparisons.size(); ++i) {
    Value right = eval(*e.children[i + 1]);
    const std::string& op = e.comparisons[i];
    bool result;
    if (op == "==") result = equals(left, right);
    else if (op == "!=") result = !equals(left, right);
    else if (op == "<") result = less_than(left, right);
    else if (op == ">") result = less_than(right, left);
    else if (op == "<=") result = !less_than(right, left);
    else if (op == ">=") result = !less_than(left, right);
    else if (op == "in") result = contains(right, left);
    else result = !contains(right, left);
    if (!result) return Value::from(false);
    left = std::move(right);
  }
  return Value::from(true);
}

CallArgs Evaluator::eval_arguments(const Expr& e, size_t first) {
  CallArgs args;
  size_t keyword_start = e.children.size() - e.keyword_names.size();
  for (size_t i = first; i < keyword_start; ++i) args.positional.push_back(eval(*e.children[i]));
  for (size_t i = keyword_start; i < e.children.size(); ++i)
    args.keywords.emplace_back(e.keyword_names[i - keyword_start], eval(*e.children[i]));
  return args;
}

Value Evaluator::eval_filter(const Expr& e, const Value* block_operand) {
  Value operand;
  if (e.children[0]) {
    const Expr& inner = *e.children[0];
    operand = inner.kind == ExprKind::filter ? eval_filter(inner, block_operand) : eval(inner);
  } else if (block_operand) {
    operand = *block_operand;
  }
  CallArgs args = eval_arguments(e, 1);
  try {
    return apply_filter(e.name, operand, args);
  } catch (const RenderError& err) {
    fail(e.line, err.what());
  }
}

Value Evaluator::eval_test(const Expr& e) {
  Value operand = eval(*e.children[0]);
  CallArgs args = eval_arguments(e, 1);
  bool result = apply_test(e.name, operand, args);
  return Value::from(e.negated ? !result : result);
}

Value Evaluator::eval_call(const Expr& e) {
  Value callee = eval(*e.children[0]);
  CallArgs args = eval_arguments(e, 1);
  return call_value(callee, args);
}

}  // namespace

RenderOutput render(const Body& body, const Dict& variables, const std::string& origin) {
  Evaluator evaluator(variables, origin);
  try {
    return evaluator.run(body);
  } catch (const LocatedError& e) {
    throw std::runtime_error(e.what());
  } catch (const std::exception& e) {
    // Not the renderer's own (a number too long to convert, memory): still one kind of error, naming the file.
    throw std::runtime_error(origin + ": " + e.what());
  }
}

}  // namespace fsdp::text::jinja
