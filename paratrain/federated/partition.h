// How a training set is split among federated clients: IID, label-skewed
// Dirichlet(alpha) (Hsu et al. 2019, arXiv 1909.06335) and McMahan et al.'s
// label-sorted shards (arXiv 1602.05629). Pure index arithmetic on labels,
// seeded and deterministic: every rank computes the same partition without
// talking. Not the data loading (data/) nor the client loop (client.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace paratrain::federated {

// partition[c] = the dataset rows client c holds, ascending. Every row is
// held by exactly one client.
using Partition = std::vector<std::vector<int64_t>>;

enum class PartitionKind { kIid, kDirichlet, kShards };
// "iid" | "dirichlet" | "shards"; throws ConfigError naming federated.partition.
PartitionKind parse_partition_kind(std::string_view name);

struct PartitionOptions {
  PartitionKind kind = PartitionKind::kIid;
  int64_t clients = 1;
  // Dirichlet concentration: -> 0 gives each client one label, -> infinity
  // gives every client the global label mix (IID).
  double alpha = 0.5;
  // Shards: each client takes this many label-sorted shards (2 in McMahan et
  // al.: most clients see two labels).
  int64_t shards_per_client = 2;
  uint64_t seed = 0;
};

// `labels[i]` is row i's class (0 .. classes-1). Throws ConfigError naming
// the federated key when the split is impossible (more clients than rows,
// or than shards can be cut).
Partition make_partition(const std::vector<int64_t>& labels, const PartitionOptions& options);

// histogram[c][k] = rows of class k held by client c.
std::vector<std::vector<int64_t>> label_histograms(const std::vector<int64_t>& labels, const Partition& partition,
                                                   int64_t classes);

// A few lines for the log: client sizes (min / median / max), labels per
// client (those holding >= 1 row), and the histograms of the first clients.
std::string summarize_partition(const std::vector<int64_t>& labels, const Partition& partition, int64_t classes,
                                int64_t show_clients = 5);

}  // namespace paratrain::federated
