// Which parameters each layer first reads: see ps_layers.h.
#include "paratrain/train/strategies/ps_layers.h"

#include <torch/nn/module.h>

#include <map>

namespace paratrain::train::strategies {

std::vector<std::vector<int>> first_reads(const std::vector<models::Layer>& layers,
                                          const std::vector<at::Tensor>& params) {
  if (layers.empty()) return {};
  std::map<const void*, int> index;  // TensorImpl -> params position
  for (size_t i = 0; i < params.size(); ++i) index[params[i].unsafeGetTensorImpl()] = static_cast<int>(i);
  std::vector<bool> planned(params.size(), false);
  std::vector<std::vector<int>> out(layers.size());
  for (size_t k = 0; k < layers.size(); ++k) {
    auto modules = layers[k].modules;
    modules.insert(modules.end(), layers[k].reads.begin(), layers[k].reads.end());
    for (const auto& [name, module] : modules) {
      for (const auto& p : module->parameters()) {
        auto it = index.find(p.unsafeGetTensorImpl());
        if (it == index.end() || planned[it->second]) continue;
        planned[it->second] = true;
        out[k].push_back(it->second);
      }
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!planned[i]) out[0].push_back(static_cast<int>(i));
  }
  return out;
}

std::vector<int> layer_of_param(const std::vector<std::vector<int>>& first_reads, size_t params) {
  if (first_reads.empty()) return {};
  std::vector<int> layer(params, 0);
  for (size_t k = 0; k < first_reads.size(); ++k)
    for (int p : first_reads[k]) layer.at(p) = static_cast<int>(k);
  return layer;
}

}  // namespace paratrain::train::strategies
