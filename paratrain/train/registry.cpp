// The user model/dataset registry (registry.h): two name -> factory maps
// behind one mutex, since ranks that are threads of one process (tests) may
// build models concurrently.
#include "paratrain/train/registry.h"

#include <algorithm>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::train {
namespace {

const std::vector<std::string> kBuiltinModels = {"mlp", "cnn", "gpt"};
const std::vector<std::string> kBuiltinDatasets = {"fashion_mnist", "synthetic", "text"};

struct Registry {
  std::mutex mutex;
  // std::map: node addresses stay valid, so find_* may return pointers.
  std::map<std::string, ModelBuilder, std::less<>> models;
  std::map<std::string, DatasetBuilder, std::less<>> datasets;
};
Registry& registry() {
  static Registry r;
  return r;
}

void check_name(const std::string& name, const std::vector<std::string>& builtins, const char* what) {
  if (name.empty()) throw ConfigError(fmt::format("register_{}: the name must not be empty", what));
  if (std::find(builtins.begin(), builtins.end(), name) != builtins.end())
    throw ConfigError(fmt::format("register_{}: \"{}\" is a built-in name; pick another", what, name));
}

template <class Map>
std::vector<std::string> names(const std::vector<std::string>& builtins, const Map& map) {
  std::vector<std::string> out = builtins;
  for (const auto& [name, factory] : map) out.push_back(name);
  return out;
}

}  // namespace

void register_model(const std::string& name, ModelBuilder factory) {
  check_name(name, kBuiltinModels, "model");
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.models[name] = std::move(factory);
}

void register_dataset(const std::string& name, DatasetBuilder factory) {
  check_name(name, kBuiltinDatasets, "dataset");
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.datasets[name] = std::move(factory);
}

const ModelBuilder* find_model(std::string_view name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.models.find(name);
  return it == r.models.end() ? nullptr : &it->second;
}

const DatasetBuilder* find_dataset(std::string_view name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.datasets.find(name);
  return it == r.datasets.end() ? nullptr : &it->second;
}

std::vector<std::string> model_kinds() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return names(kBuiltinModels, r.models);
}

std::vector<std::string> dataset_names() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return names(kBuiltinDatasets, r.datasets);
}

}  // namespace paratrain::train
