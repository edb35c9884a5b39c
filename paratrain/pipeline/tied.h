// Parameters that layers on different pipeline stages share: a GPT's word
// embedding, read by the first stage for the input and by the last for the
// tied LM head (models/gpt.h). As Megatron-LM does it, each stage keeps its
// own copy, the copies start equal (broadcast from the first stage), and
// after backward their gradients are summed over the stages holding them
// (Megatron's "embedding group", built by topology/stage_group.h), so every
// copy takes the same step and stays equal. Not here: cutting the model.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "paratrain/comm/process_group.h"
#include "paratrain/models/model.h"
#include "paratrain/topology/device_mesh.h"
#include "paratrain/topology/stage_group.h"

namespace paratrain::pipeline {

struct TiedParameter {
  std::string name;         // the first name the model gives it: "wte.weight"
  std::vector<int> stages;  // the pp ranks whose chunks use it, increasing; 2 or more
  /// The name each of `stages` holds it under (its first, in layer order):
  /// the model's one name for a module two layers list (the GPT's wte), or
  /// each layer's own for a tensor registered twice (a program's module
  /// that registers another layer's module as its child: "2.weight" and
  /// "4.shared.weight").
  std::vector<std::string> names;
};

// The parameters that chunks on different stages share (one tensor in the
// modules of layers that land on two stages), in the order the layers list
// them. Chunk j ([bounds[j], bounds[j+1]) of `layers`) runs on stage
// j % stages. A tensor shared only within one stage is not listed (autograd
// already sums its uses).
std::vector<TiedParameter> find_tied_parameters(const std::vector<models::Layer>& layers,
                                                const std::vector<int>& bounds, int stages);

class TiedGradients {
 public:
  // Collective over the world (builds one mesh stage group per distinct set
  // of stages): every rank calls it with the same `tied`. `local` is this
  // rank's module (merge_chunks); its copies are found there by name.
  TiedGradients(const topology::DeviceMesh& mesh, const std::vector<TiedParameter>& tied, torch::nn::Module& local,
                std::chrono::milliseconds timeout);

  // Overwrites every copy with the first stage's. Collective over the groups.
  void broadcast_from_first();
  // Sums each copy's gradient over its stages (an undefined gradient counts
  // as zeros). Collective over the groups: call it on every rank after the
  // step's last backward, after the data-parallel reduction or before it
  // (both are sums, so the order does not change the result).
  void all_reduce_gradients();
  // True when this rank holds `name` as a copy of a tensor that an earlier
  // stage holds under the same name: that stage writes it to checkpoints. A
  // copy under a name of its own is written by this rank (a one-process
  // checkpoint has both names).
  bool is_copy(const std::string& name) const;
  // True when an earlier stage holds the tensor this rank holds as `name`
  // (under any name): gradient norms count it on the first stage only.
  bool counted_on_an_earlier_stage(const std::string& name) const;
  // The same by identity: `t` is one of this rank's copies of a tensor an
  // earlier stage holds (whatever name this rank lists it under).
  bool counted_on_an_earlier_stage(const at::Tensor& t) const;
  // The name a tied tensor's optimizer state is kept under on every stage:
  // its first name in the model's order, as one process and ZeRO key it.
  // `name` for a parameter that is not tied across stages.
  std::string optimizer_name(const std::string& name) const;
  // Whether this rank writes the optimizer state of `name` (its canonical
  // name's holder does; one stage per tied tensor).
  bool writes_optimizer_state(const std::string& name) const;
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    std::string name;        // this rank's
    std::string first_name;  // the first stage's
    std::string canonical;   // the model's first name for it (TiedParameter::name)
    at::Tensor local;
    comm::ProcessGroup* group = nullptr;
    bool first = false;  // this rank is the first stage holding it
    bool writes_state = false;  // the first stage holding it under `canonical`
  };
  std::map<std::vector<int>, std::shared_ptr<comm::ProcessGroup>> groups_;
  std::vector<Entry> entries_;  // those this rank holds
  std::chrono::milliseconds timeout_;
};

}  // namespace paratrain::pipeline
