// parallelize_module: matches the plan's rules to the tree's modules,
// checks each, slices the planned parameters in place and attaches the plan
// (Note [Plans in C++], plan.h).
#include "paratrain/parallelize/plan.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <fnmatch.h>

#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "paratrain/core/error.h"
#include "paratrain/parallelize/planned_module.h"
#include "paratrain/tensor_parallel/random.h"

namespace paratrain::parallelize {
namespace {

namespace tpl = tensor_parallel;
using detail::PlannedModule;
using detail::PlanState;

constexpr long long kMaxParts = 1 << 16;
constexpr std::string_view kForms =
    "colwise, colwise[parts=N], colwise[gather], rowwise, vocab_embedding, sequence_parallel, replicate";

std::vector<std::string> atoms(std::string_view name) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t dot = name.find('.', start);
    out.emplace_back(name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) return out;
    start = dot + 1;
  }
}

bool matches(const std::string& pattern, const std::string& name) {
  const auto p = atoms(pattern), n = atoms(name);
  if (p.size() != n.size()) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (fnmatch(p[i].c_str(), n[i].c_str(), 0) != 0) return false;
  }
  return true;
}

std::string shown(const std::string& name) { return name.empty() ? "(the root module)" : "'" + name + "'"; }

tpl::ShardSpec split_spec(const at::Tensor& t, int64_t dim, int64_t parts) {
  return {.dim = dim, .groups = parts, .full_shape = t.sizes().vec()};
}

void check_split(const std::string& name, const char* what, int64_t size, int64_t parts, int tp) {
  if (size % (parts * tp) == 0) return;
  throw Error(fmt::format("tensor-parallel plan: {} has {} = {}, not divisible by {}tp = {}{}", shown(name), what,
                          size, parts > 1 ? fmt::format("parts ({}) x ", parts) : "", tp,
                          parts > 1 ? fmt::format(" ({})", parts * tp) : ""));
}

// In place: the parameter becomes this rank's shard (its members, the
// module's dictionary and every later optimizer see the same tensor).
void slice(at::Tensor& param, const tpl::ShardSpec& spec, const tpl::TpContext& tp) {
  at::NoGradGuard no_grad;
  param.set_data(tpl::shard_of(param.detach(), spec, tp.rank(), tp.size()));
}

// Checks `m`'s style against its type and sizes and says how each of its
// parameters splits over `tp` ranks (m.specs; nothing is changed).
void style_specs(PlannedModule& m, const torch::nn::Module& module, int tp) {
  const Style s = m.style.style;
  if (dynamic_cast<const tpl::ShardedModule*>(&module) != nullptr) {
    throw Error(fmt::format("tensor-parallel plan: {} is one of paratrain's tensor-parallel layers already; "
                            "plan the plain torch::nn layer instead",
                            shown(m.name)));
  }
  if (s == Style::kColwise || s == Style::kRowwise) {
    auto* linear = dynamic_cast<const torch::nn::LinearImpl*>(&module);
    if (linear == nullptr) {
      throw Error(fmt::format("tensor-parallel plan: {} is a {}, but {} applies to torch::nn::Linear only",
                              shown(m.name), module.name(), m.style.str()));
    }
    m.full_in = linear->weight.size(1);
    m.full_out = linear->weight.size(0);
    if (s == Style::kColwise) {
      if (m.style.gather_output && m.style.parts > 1) {
        throw Error(fmt::format("tensor-parallel plan: {}: colwise[gather] with parts > 1 would gather the parts "
                                "out of order; gather a layer of one part",
                                shown(m.name)));
      }
      check_split(m.name, "out_features", m.full_out, m.style.parts, tp);
      m.specs.emplace_back("weight", split_spec(linear->weight, 0, m.style.parts));
      if (linear->bias.defined()) {
        m.specs.emplace_back("bias", split_spec(linear->bias, 0, m.style.parts));
      }
    } else {
      check_split(m.name, "in_features", m.full_in, 1, tp);
      m.specs.emplace_back("weight", split_spec(linear->weight, 1, 1));
    }
  } else if (s == Style::kVocabEmbedding) {
    auto* embedding = dynamic_cast<const torch::nn::EmbeddingImpl*>(&module);
    if (embedding == nullptr) {
      throw Error(fmt::format("tensor-parallel plan: {} is a {}, but vocab_embedding applies to "
                              "torch::nn::Embedding only",
                              shown(m.name), module.name()));
    }
    const auto& o = embedding->options;
    if (o.padding_idx().has_value() || o.max_norm().has_value() || o.sparse() || o.scale_grad_by_freq()) {
      throw Error(fmt::format("tensor-parallel plan: {} has padding_idx, max_norm, sparse or scale_grad_by_freq "
                              "set, which a vocabulary-split lookup does not reproduce; plan it replicate",
                              shown(m.name)));
    }
    m.full_out = embedding->weight.size(0);
    check_split(m.name, "num_embeddings", m.full_out, 1, tp);
    m.specs.emplace_back("weight", split_spec(embedding->weight, 0, 1));
  }
}

// Slices the module's own parameters that `specs` split (in place).
void slice_parameters(torch::nn::Module& module, const std::vector<std::pair<std::string, tpl::ShardSpec>>& specs,
                      const tpl::TpContext& tp) {
  auto params = module.named_parameters(/*recurse=*/false);
  for (const auto& [name, spec] : specs) slice(params[name], spec, tp);
}

// The module each rule names, checked: every rule matches, and the rules
// that match one module agree.
std::map<std::string, StyleSpec> chosen_styles(
    const torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>& modules, const TpPlan& plan) {
  std::map<std::string, StyleSpec> chosen;
  for (const auto& [pattern, style] : plan.rules) {
    bool any = false;
    for (const auto& item : modules) {
      if (!matches(pattern, item.key())) continue;
      any = true;
      auto [it, fresh] = chosen.emplace(item.key(), style);
      if (!fresh && !(it->second == style)) {
        throw Error(fmt::format("tensor-parallel plan: {} is matched as {} and as {} (rule \"{}\"); give each "
                                "module one style",
                                shown(item.key()), it->second.str(), style.str(), pattern));
      }
    }
    if (!any) {
      std::vector<std::string> names;
      for (const auto& item : modules) {
        if (!item.key().empty() && names.size() < 12) names.push_back(item.key());
      }
      throw Error(fmt::format("tensor-parallel plan: rule \"{}\" ({}) matches no module; the model's modules "
                              "include: {}{}",
                              pattern, style.str(), fmt::join(names, ", "), modules.size() > 13 ? ", ..." : ""));
    }
  }
  return chosen;
}

}  // namespace

StyleSpec StyleSpec::parse(std::string_view text) {
  std::string_view base = text, options;
  if (const size_t open = text.find('['); open != std::string_view::npos) {
    if (text.back() != ']') {
      throw ConfigError(fmt::format("tensor-parallel style \"{}\": options go in one [...] at the end; one of {}",
                                    text, kForms));
    }
    base = text.substr(0, open);
    options = text.substr(open + 1, text.size() - open - 2);
  }
  StyleSpec spec;
  if (base == "colwise") spec.style = Style::kColwise;
  else if (base == "rowwise") spec.style = Style::kRowwise;
  else if (base == "vocab_embedding") spec.style = Style::kVocabEmbedding;
  else if (base == "sequence_parallel") spec.style = Style::kSequenceParallel;
  else if (base == "replicate") spec.style = Style::kReplicate;
  else throw ConfigError(fmt::format("unknown tensor-parallel style \"{}\"; one of {}", text, kForms));
  while (!options.empty()) {
    const size_t comma = options.find(',');
    std::string_view option = options.substr(0, comma);
    options = comma == std::string_view::npos ? std::string_view{} : options.substr(comma + 1);
    while (!option.empty() && option.front() == ' ') option.remove_prefix(1);
    if (spec.style == Style::kColwise && option == "gather") {
      spec.gather_output = true;
    } else if (spec.style == Style::kColwise && option.starts_with("parts=")) {
      const std::string digits(option.substr(6));
      char* end = nullptr;
      const long long parts = std::strtoll(digits.c_str(), &end, 10);
      if (digits.empty() || *end != '\0' || parts < 1 || parts > kMaxParts) {
        throw ConfigError(fmt::format("tensor-parallel style \"{}\": parts must be an integer in [1, {}]", text,
                                      kMaxParts));
      }
      spec.parts = parts;
    } else {
      throw ConfigError(fmt::format("tensor-parallel style \"{}\": unknown option \"{}\"; one of {}", text, option,
                                    kForms));
    }
  }
  return spec;
}

std::string StyleSpec::str() const {
  switch (style) {
    case Style::kColwise: {
      std::vector<std::string> options;
      if (parts > 1) options.push_back(fmt::format("parts={}", parts));
      if (gather_output) options.push_back("gather");
      return options.empty() ? "colwise" : fmt::format("colwise[{}]", fmt::join(options, ","));
    }
    case Style::kRowwise: return "rowwise";
    case Style::kVocabEmbedding: return "vocab_embedding";
    case Style::kSequenceParallel: return "sequence_parallel";
    case Style::kReplicate: return "replicate";
  }
  return "replicate";
}

AppliedPlan parallelize_module(torch::nn::Module& root, const TpPlan& plan, const PlanContext& ctx) {
  if (ctx.tp.group == nullptr) throw Error("parallelize_module: PlanContext.tp.group is null: pass the tp group");
  auto state = std::make_shared<PlanState>();
  state->ctx = ctx;
  state->sequence_parallel = plan.sequence_parallel;
  state->seq_dim = plan.seq_dim;
  state->defect_skip_input_gradient_sum = plan.defect_skip_input_gradient_sum;
  state->region = tpl::make_region_generator(ctx.seed, ctx.tp.rank());
  if (plan.sequence_parallel && ctx.tp.size() < 2) {
    throw Error("tensor-parallel plan: sequence_parallel (Megatron-SP) needs a tp group of 2 or more ranks");
  }

  const auto modules = root.named_modules("", /*include_self=*/true);
  for (const auto& item : modules) {
    if (detail::planned(*item.value())) {
      throw Error(fmt::format("tensor-parallel plan: {} is planned already; apply one plan to a model once",
                              shown(item.key())));
    }
  }
  const auto chosen = chosen_styles(modules, plan);

  AppliedPlan out;
  std::set<const void*> sp_seen;
  auto add_sp = [&](const at::Tensor& t) {
    if (t.defined() && sp_seen.insert(t.unsafeGetTensorImpl()).second) out.sequence_parallel_params.push_back(t);
  };
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, std::shared_ptr<PlannedModule>>> planned;
  std::map<const void*, std::string> sliced;  // tensor -> the name it was split under
  for (const auto& item : modules) {
    auto m = std::make_shared<PlannedModule>();
    m->plan = state;
    m->name = item.key();
    if (auto it = chosen.find(item.key()); it != chosen.end()) {
      m->style = it->second;
      m->named = true;
      out.styles.emplace_back(item.key(), it->second);
    }
    style_specs(*m, *item.value(), ctx.tp.size());
    // A tensor two modules hold (a tied head) is split once, by one of them.
    const auto own = item.value()->named_parameters(/*recurse=*/false);
    for (const auto& [name, spec] : m->specs) {
      const void* impl = own[name].unsafeGetTensorImpl();
      if (!sliced.emplace(impl, item.key().empty() ? name : item.key() + "." + name).second) {
        throw Error(fmt::format("tensor-parallel plan: {}'s {} is the tensor {} already split; a weight two modules "
                                "share is planned once (an LM head tied to a vocab_embedding runs as "
                                "parallelize::tied_logits(*embedding, x) and is not planned itself)",
                                shown(item.key()), name, sliced[impl]));
      }
    }
    slice_parameters(*item.value(), m->specs, ctx.tp);
    if (m->style.style == Style::kSequenceParallel) {
      // The whole module runs on the split sequence; none of it may be split
      // (its parameters' gradients are summed over tp).
      for (const auto& [name, style] : chosen) {
        const bool below = !item.key().empty() ? name.rfind(item.key() + ".", 0) == 0 : !name.empty();
        if (below && (style.style == Style::kColwise || style.style == Style::kRowwise ||
                      style.style == Style::kVocabEmbedding)) {
          throw Error(fmt::format("tensor-parallel plan: {} is sequence_parallel but holds '{}' ({}): plan the "
                                  "norms and other whole modules inside it sequence_parallel, not their parent",
                                  shown(item.key()), name, style.str()));
        }
      }
    }
    if (plan.sequence_parallel) {
      if (m->style.style == Style::kSequenceParallel) {
        for (const auto& p : item.value()->parameters()) add_sp(p);
      } else if (m->style.style == Style::kRowwise) {
        add_sp(item.value()->as<torch::nn::Linear>()->bias);
      }
    }
    planned.emplace_back(item.value(), std::move(m));
  }
  // A module that holds a split tensor under its own name without being its
  // planned owner would run whole on a shard.
  for (const auto& item : modules) {
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      auto it = sliced.find(p.value().unsafeGetTensorImpl());
      const std::string name = item.key().empty() ? p.key() : item.key() + "." + p.key();
      if (it != sliced.end() && it->second != name) {
        throw Error(fmt::format("tensor-parallel plan: '{}' is the tensor {} that the plan splits, but its module "
                                "runs it whole; an LM head tied to a vocab_embedding runs as "
                                "parallelize::tied_logits(*embedding, x) and holds no weight of its own",
                                name, it->second));
      }
    }
  }
  // Attached last, so a throw above leaves no half-planned tree behind
  // (the parameters already sliced are not restored: rebuild the model).
  for (auto& [module, m] : planned) tpl::attach_state(*module, m);
  out.layout = tpl::parameter_layout(root);
  return out;
}

torch::OrderedDict<std::string, tpl::ShardSpec> plan_layout(const torch::nn::Module& root, const TpPlan& plan,
                                                            int tp) {
  if (tp < 1) throw Error(fmt::format("plan_layout: tp must be >= 1, got {}", tp));
  const auto modules = root.named_modules("", /*include_self=*/true);
  const auto chosen = chosen_styles(modules, plan);
  std::map<std::string, tpl::ShardSpec> split;
  for (const auto& item : modules) {
    PlannedModule m;
    m.name = item.key();
    if (auto it = chosen.find(item.key()); it != chosen.end()) m.style = it->second;
    style_specs(m, *item.value(), tp);
    for (auto& [name, spec] : m.specs) split[item.key().empty() ? name : item.key() + "." + name] = spec;
  }
  torch::OrderedDict<std::string, tpl::ShardSpec> out;
  for (const auto& p : root.named_parameters(/*recurse=*/true)) {
    auto it = split.find(p.key());
    if (it != split.end()) {
      out.insert(p.key(), it->second);
    } else {
      tpl::ShardSpec whole;
      whole.full_shape = p.value().sizes().vec();
      out.insert(p.key(), whole);
    }
  }
  return out;
}

void check_sites_ran(const torch::nn::Module& root) {
  std::vector<std::string> missed;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    const auto m = detail::planned(*item.value());
    if (m && m->plan->sequence_parallel && m->plan->entered.load() == 0) {
      throw Error("tensor-parallel plan: sequence_parallel (Megatron-SP) is on but the forward never called "
                  "paratrain::parallelize::enter_sequence_parallel: without it the split layers would gather "
                  "copies of the whole sequence. Call it where the blocks begin (after the embeddings), or turn "
                  "parallel.megatron_sp off");
    }
    if (m && m->runs_at_site() && m->calls.load() == 0) {
      missed.push_back(fmt::format("'{}' ({})", m->name, m->style.str()));
    }
  }
  if (missed.empty()) return;
  throw Error(fmt::format(
      "tensor-parallel plan: the forward did not run {} through its site. A planned torch::nn::Linear must be "
      "called as paratrain::parallelize::linear(*layer, x), an Embedding as parallelize::embedding(*layer, ids) "
      "(or tied_logits): LibTorch's C++ modules have no forward hooks, and layer(x) would compute with this rank's "
      "shard and skip the collectives. A layer the forward never uses should not be in the plan. See "
      "docs/tensor-parallel-plans.md",
      fmt::join(missed, ", ")));
}

}  // namespace paratrain::parallelize
