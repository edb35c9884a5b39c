// Client partitions: see partition.h.
#include "paratrain/federated/partition.h"

#include <algorithm>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::federated {
namespace {

// std::shuffle's algorithm is the library's to choose; Fisher-Yates with the
// standard mt19937_64 draws keeps the split the same on every rank and build.
template <class T>
void shuffle(std::vector<T>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng() % i]);
}

void check_clients(int64_t rows, int64_t clients) {
  if (clients < 1 || clients > rows)
    throw ConfigError(fmt::format("federated.clients = {} with {} training rows: every client needs at least one "
                                  "row; use between 1 and {} clients",
                                  clients, rows, rows));
}

Partition iid(int64_t rows, int64_t clients, std::mt19937_64& rng) {
  std::vector<int64_t> order(rows);
  std::iota(order.begin(), order.end(), 0);
  shuffle(order, rng);
  Partition out(clients);
  // Equal sizes up to one row: the first rows % clients clients take one more.
  int64_t begin = 0;
  for (int64_t c = 0; c < clients; ++c) {
    const int64_t size = rows / clients + (c < rows % clients ? 1 : 0);
    out[c].assign(order.begin() + begin, order.begin() + begin + size);
    begin += size;
  }
  return out;
}

// Hsu et al.: per class, draw the clients' shares q ~ Dir(alpha * 1) and cut
// that class's (shuffled) rows at the cumulative shares. Dir(alpha) is drawn
// as normalized Gamma(alpha, 1) variables. Splits that leave a client empty
// are drawn again (common practice; an empty client cannot train).
Partition dirichlet(const std::vector<int64_t>& labels, int64_t clients, double alpha, std::mt19937_64& rng) {
  const int64_t classes = *std::max_element(labels.begin(), labels.end()) + 1;
  std::vector<std::vector<int64_t>> by_class(classes);
  for (int64_t i = 0; i < static_cast<int64_t>(labels.size()); ++i) by_class[labels[i]].push_back(i);
  for (int attempt = 0; attempt < 100; ++attempt) {
    Partition out(clients);
    for (auto rows : by_class) {
      shuffle(rows, rng);
      std::gamma_distribution<double> gamma(alpha, 1.0);
      std::vector<double> share(clients);
      for (auto& s : share) s = gamma(rng);
      const double total = std::accumulate(share.begin(), share.end(), 0.0);
      // Cut points from the cumulative shares: rows [cut(c), cut(c+1)) go to c.
      double cumulative = 0;
      size_t begin = 0;
      for (int64_t c = 0; c < clients; ++c) {
        cumulative += share[c];
        size_t end = c + 1 == clients || total <= 0
                         ? rows.size()
                         : std::min(rows.size(), static_cast<size_t>(cumulative / total * rows.size() + 0.5));
        end = std::max(end, begin);
        out[c].insert(out[c].end(), rows.begin() + begin, rows.begin() + end);
        begin = end;
      }
    }
    if (std::all_of(out.begin(), out.end(), [](const auto& rows) { return !rows.empty(); })) return out;
  }
  throw ConfigError(fmt::format("federated.alpha = {} with federated.clients = {} and {} rows: 100 Dirichlet draws "
                                "each left a client without data; raise federated.alpha or use fewer clients",
                                alpha, clients, labels.size()));
}

// McMahan et al.: sort rows by label, cut into clients * per_client shards of
// equal size, give each client per_client shards picked at random.
Partition shards(const std::vector<int64_t>& labels, int64_t clients, int64_t per_client, std::mt19937_64& rng) {
  const int64_t rows = static_cast<int64_t>(labels.size());
  const int64_t count = clients * per_client;
  if (count > rows)
    throw ConfigError(fmt::format("federated.clients = {} x federated.shards_per_client = {} = {} shards from {} "
                                  "rows: a shard needs at least one row; use fewer clients or shards",
                                  clients, per_client, count, rows));
  std::vector<int64_t> sorted(rows);
  std::iota(sorted.begin(), sorted.end(), 0);
  std::stable_sort(sorted.begin(), sorted.end(), [&](int64_t a, int64_t b) { return labels[a] < labels[b]; });
  std::vector<int64_t> shard_ids(count);
  std::iota(shard_ids.begin(), shard_ids.end(), 0);
  shuffle(shard_ids, rng);
  auto shard_begin = [&](int64_t s) { return s * (rows / count) + std::min(s, rows % count); };
  Partition out(clients);
  for (int64_t c = 0; c < clients; ++c)
    for (int64_t j = 0; j < per_client; ++j) {
      const int64_t s = shard_ids[c * per_client + j];
      out[c].insert(out[c].end(), sorted.begin() + shard_begin(s), sorted.begin() + shard_begin(s + 1));
    }
  return out;
}

}  // namespace

PartitionKind parse_partition_kind(std::string_view name) {
  if (name == "iid") return PartitionKind::kIid;
  if (name == "dirichlet") return PartitionKind::kDirichlet;
  if (name == "shards") return PartitionKind::kShards;
  throw ConfigError(fmt::format("federated.partition = \"{}\": use \"iid\", \"dirichlet\" or \"shards\"", name));
}

Partition make_partition(const std::vector<int64_t>& labels, const PartitionOptions& options) {
  const int64_t rows = static_cast<int64_t>(labels.size());
  check_clients(rows, options.clients);
  if (std::any_of(labels.begin(), labels.end(), [](int64_t l) { return l < 0; }))
    throw DataError("federated partition: labels must be class indices >= 0");
  std::mt19937_64 rng(options.seed ^ 0x9e3779b97f4a7c15ULL);
  Partition out;
  switch (options.kind) {
    case PartitionKind::kIid: out = iid(rows, options.clients, rng); break;
    case PartitionKind::kDirichlet:
      if (!(options.alpha > 0))
        throw ConfigError(fmt::format("federated.alpha = {}: must be > 0", options.alpha));
      out = dirichlet(labels, options.clients, options.alpha, rng);
      break;
    case PartitionKind::kShards: out = shards(labels, options.clients, options.shards_per_client, rng); break;
  }
  for (auto& rows_of_client : out) std::sort(rows_of_client.begin(), rows_of_client.end());
  return out;
}

std::vector<std::vector<int64_t>> label_histograms(const std::vector<int64_t>& labels, const Partition& partition,
                                                   int64_t classes) {
  std::vector<std::vector<int64_t>> out(partition.size(), std::vector<int64_t>(classes, 0));
  for (size_t c = 0; c < partition.size(); ++c)
    for (int64_t row : partition[c]) ++out[c].at(labels.at(row));
  return out;
}

std::string summarize_partition(const std::vector<int64_t>& labels, const Partition& partition, int64_t classes,
                                int64_t show_clients) {
  const auto hist = label_histograms(labels, partition, classes);
  std::vector<int64_t> sizes, distinct;
  for (size_t c = 0; c < partition.size(); ++c) {
    sizes.push_back(static_cast<int64_t>(partition[c].size()));
    distinct.push_back(std::count_if(hist[c].begin(), hist[c].end(), [](int64_t n) { return n > 0; }));
  }
  auto sorted_sizes = sizes;
  std::sort(sorted_sizes.begin(), sorted_sizes.end());
  const double mean_labels =
      std::accumulate(distinct.begin(), distinct.end(), 0.0) / static_cast<double>(distinct.size());
  std::string out = fmt::format("{} clients: rows per client min {} / median {} / max {}; labels per client mean "
                                "{:.1f} (min {}, max {})",
                                partition.size(), sorted_sizes.front(), sorted_sizes[sorted_sizes.size() / 2],
                                sorted_sizes.back(), mean_labels, *std::min_element(distinct.begin(), distinct.end()),
                                *std::max_element(distinct.begin(), distinct.end()));
  for (int64_t c = 0; c < std::min<int64_t>(show_clients, static_cast<int64_t>(partition.size())); ++c)
    out += fmt::format("\n  client {:>3}: {:>5} rows, labels [{}]", c, sizes[c], fmt::join(hist[c], " "));
  return out;
}

}  // namespace paratrain::federated
