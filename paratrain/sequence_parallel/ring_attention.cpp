// Ring attention: the ring schedule, its transfers and the autograd function.
// The block arithmetic is in blockwise_attention.cpp.
#include "paratrain/sequence_parallel/ring_attention.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/core/error.h"
#include "paratrain/sequence_parallel/blockwise_attention.h"

namespace paratrain::sequence_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Note [Ring schedule]
// Step s = 0..P-1 on rank r: the rank holds key/value chunk c = (r - s) mod P.
// Before computing with it, it posts the send of that chunk to r + 1 and the
// receive of chunk (r - s - 1) from r - 1, so the transfer of the next chunk
// overlaps this block's computation, and waits for both afterwards: at most
// two key/value chunks live per rank.
// Under a causal mask rank r needs chunks 0..r only (needs() below): a chunk
// is sent only to a neighbour that needs it, so rank P-1 sends nothing and
// rank 0 receives nothing in forward, P(P-1)/2 transfers instead of P(P-1).
//
// Backward visits the chunks in the same order. The ranks that need chunk c
// (its "contributors") are c, c+1, ... along the ring, a contiguous run
// starting at the owner, so dK/dV of chunk c is an accumulator that travels
// with it: each contributor adds its block's dK/dV to what arrived from
// r - 1 and passes the sum on; the last contributor sends the total straight
// back to the owner (for the non-causal ring the last one is c - 1, whose
// next rank is the owner anyway). Each rank computes its block's dK/dV into
// fresh tensors and waits for the incoming accumulator only after that, so
// the accumulator's transfer also overlaps computation.

enum class Kind { kKeyValue = 0, kGradAccumulator = 1, kGradFinal = 2 };

// One tag per (kind, chunk): each (sender, receiver, tag) carries at most
// one message per call, so no message can match another's receive.
int tag_of(Kind kind, int chunk) { return static_cast<int>(kind) * (1 << 16) + chunk; }

const char* describe(Kind kind) {
  switch (kind) {
    case Kind::kKeyValue: return "key/value chunk";
    case Kind::kGradAccumulator: return "dK/dV accumulator of chunk";
    case Kind::kGradFinal: return "final dK/dV of chunk";
  }
  return "?";
}

struct RingArgs {
  comm::ProcessGroup* group = nullptr;
  bool causal = true;
  double scale = 1.0;
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
};

// Ring arithmetic and the transfers in flight on one rank.
class Ring {
 public:
  explicit Ring(const RingArgs& args)
      : args_(args), rank_(args.group->rank()), size_(args.group->size()) {}
  ~Ring() {
    // Never let the backend touch freed buffers: drain quietly (an error is
    // already on its way up when we get here early).
    for (auto& p : pending_) {
      if (!p.work) continue;  // waited already
      try {
        p.work->wait(p.is_send ? args_.timeout : std::chrono::milliseconds(1));
      } catch (...) {
      }
    }
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int next() const { return (rank_ + 1) % size_; }
  int prev() const { return (rank_ + size_ - 1) % size_; }
  int chunk_at(int step) const { return ((rank_ - step) % size_ + size_) % size_; }
  // Does `rank` attend to key chunk `chunk`? See Note [Ring schedule].
  bool needs(int rank, int chunk) const { return !args_.causal || chunk <= rank; }
  // The mask of (this rank's queries, key chunk `chunk`), for a needed chunk.
  BlockMask mask(int chunk) const {
    return args_.causal && chunk == rank_ ? BlockMask::kCausalDiagonal : BlockMask::kNone;
  }
  // Where the dK/dV accumulator of `chunk` goes after this rank added to it:
  // the next contributor, else the owner (-1: this rank is the owner and the
  // only contributor).
  int grad_destination(int chunk) const {
    if (next() != chunk && needs(next(), chunk)) return next();
    return chunk == rank_ ? -1 : chunk;
  }
  // Who sends this rank the final dK/dV of its own chunk (-1: nobody).
  int last_contributor() const {
    int r = rank_;
    while ((r + 1) % size_ != rank_ && needs((r + 1) % size_, rank_)) r = (r + 1) % size_;
    return r == rank_ ? -1 : r;
  }

  // Non-blocking; the tensor is kept alive until the send is waited for.
  size_t send(const at::Tensor& tensor, int dst, Kind kind, int chunk) {
    pending_.push_back({tensor, args_.group->send(tensor, dst, tag_of(kind, chunk)), dst, kind, chunk, true});
    return pending_.size() - 1;
  }
  size_t recv(at::Tensor buffer, int src, Kind kind, int chunk) {
    auto work = args_.group->recv(buffer, src, tag_of(kind, chunk));
    pending_.push_back({std::move(buffer), std::move(work), src, kind, chunk, false});
    return pending_.size() - 1;
  }
  // Waits for transfer `id` and lets go of its tensor (returned: a
  // receive's data), so a finished step's buffers are freed as soon as the
  // caller drops them: two key/value chunks alive per rank, not all of them.
  at::Tensor wait(size_t id) {
    Pending& p = pending_.at(id);
    TORCH_INTERNAL_ASSERT(p.work, "ring attention: transfer ", id, " waited twice");
    try {
      p.work->wait(args_.timeout);
    } catch (const Error& e) {
      throw CommError(fmt::format(
          "ring attention, cp rank {}: {} the {} {} {} cp rank {} (global rank {}) failed: {}. That rank probably "
          "died, stalled or called ring attention with other shapes: see its log",
          rank_, p.is_send ? "sending" : "receiving", describe(p.kind), p.chunk, p.is_send ? "to" : "from", p.peer,
          args_.group->global_ranks().at(p.peer), e.what()));
    }
    p.work.reset();
    return std::move(p.tensor);
  }

 private:
  struct Pending {
    at::Tensor tensor;
    comm::WorkHandle work;
    int peer;
    Kind kind;
    int chunk;
    bool is_send;
  };
  RingArgs args_;
  int rank_;
  int size_;
  std::vector<Pending> pending_;
};

// Key and value of one chunk packed into one flat buffer: one message per
// step instead of two (and v may have another head dim than k).
struct KvLayout {
  std::vector<int64_t> k_shape, v_shape;
  int64_t k_numel, v_numel;
  at::Tensor pack(const at::Tensor& k, const at::Tensor& v) const {
    return at::cat({k.reshape(-1), v.reshape(-1)});
  }
  at::Tensor key(const at::Tensor& packed) const { return packed.narrow(0, 0, k_numel).view(k_shape); }
  at::Tensor value(const at::Tensor& packed) const { return packed.narrow(0, k_numel, v_numel).view(v_shape); }
};
KvLayout layout_of(const at::Tensor& k, const at::Tensor& v) {
  return {k.sizes().vec(), v.sizes().vec(), k.numel(), v.numel()};
}

struct ForwardResult {
  at::Tensor out;  // fp32
  at::Tensor lse;  // fp32
};

ForwardResult ring_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RingArgs& args) {
  Ring ring(args);
  const KvLayout kv = layout_of(k, v);
  OnlineSoftmax softmax;
  at::Tensor current = kv.pack(k, v);  // chunk ring.rank(), always needed
  for (int step = 0; step < ring.size() && current.defined(); ++step) {
    const int chunk = ring.chunk_at(step);
    const int incoming = ring.chunk_at(step + 1);
    std::optional<size_t> sent, received;
    if (step + 1 < ring.size()) {
      if (ring.needs(ring.next(), chunk)) sent = ring.send(current, ring.next(), Kind::kKeyValue, chunk);
      if (ring.needs(ring.rank(), incoming)) {
        received = ring.recv(at::empty_like(current), ring.prev(), Kind::kKeyValue, incoming);
      }
    }
    softmax.add_block(q, kv.key(current), kv.value(current), args.scale, ring.mask(chunk));
    if (sent) ring.wait(*sent);
    current = received ? ring.wait(*received) : at::Tensor();
  }
  return {softmax.output(), softmax.log_sum_exp()};
}

struct Grads {
  at::Tensor dq, dk, dv;  // fp32
};

Grads ring_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                    const at::Tensor& lse, const at::Tensor& grad_out, const RingArgs& args) {
  Ring ring(args);
  const KvLayout kv = layout_of(k, v);
  const at::Tensor dout = grad_out.to(at::kFloat);
  const at::Tensor delta = (dout * out.to(at::kFloat)).sum(-1);
  at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
  const auto f32 = q.options().dtype(at::kFloat);

  // Posted first, so the last contributor's send never waits on us.
  std::optional<size_t> final_grad;
  at::Tensor own_grad;  // [dK | dV] of our chunk, flat fp32
  if (const int src = ring.last_contributor(); src >= 0) {
    final_grad = ring.recv(at::empty({kv.k_numel + kv.v_numel}, f32), src, Kind::kGradFinal, ring.rank());
  }

  at::Tensor current = kv.pack(k, v);
  std::optional<size_t> grad_sent;  // last step's accumulator send, waited one step later
  for (int step = 0; step < ring.size() && current.defined(); ++step) {
    const int chunk = ring.chunk_at(step);
    const int incoming = ring.chunk_at(step + 1);
    std::optional<size_t> sent, received, grad_in;
    if (step + 1 < ring.size()) {
      if (ring.needs(ring.next(), chunk)) sent = ring.send(current, ring.next(), Kind::kKeyValue, chunk);
      if (ring.needs(ring.rank(), incoming)) {
        received = ring.recv(at::empty_like(current), ring.prev(), Kind::kKeyValue, incoming);
      }
    }
    if (chunk != ring.rank()) {
      grad_in = ring.recv(at::empty({kv.k_numel + kv.v_numel}, f32), ring.prev(), Kind::kGradAccumulator, chunk);
    }

    BlockGrads g = attention_block_backward(q, kv.key(current), kv.value(current), dout, lse, delta, args.scale,
                                            ring.mask(chunk));
    dq.add_(g.dq);
    at::Tensor acc = at::cat({g.dk.reshape(-1), g.dv.reshape(-1)});
    if (grad_in) acc.add_(ring.wait(*grad_in));
    if (grad_sent) ring.wait(*grad_sent);
    grad_sent.reset();
    if (const int dst = ring.grad_destination(chunk); dst < 0) {
      own_grad = acc;
    } else {
      const Kind kind = dst == ring.next() && dst != chunk ? Kind::kGradAccumulator : Kind::kGradFinal;
      grad_sent = ring.send(acc, dst, kind, chunk);
    }

    if (sent) ring.wait(*sent);
    current = received ? ring.wait(*received) : at::Tensor();
  }
  if (grad_sent) ring.wait(*grad_sent);
  if (final_grad) own_grad = ring.wait(*final_grad);
  TORCH_INTERNAL_ASSERT(own_grad.defined(), "ring attention: rank ", ring.rank(), " has no dK/dV of its own chunk");
  return {dq, kv.key(own_grad), kv.value(own_grad)};
}

class RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            RingArgs args) {
    ForwardResult r = ring_forward(q, k, v, args);
    at::Tensor out = r.out.to(q.scalar_type());
    // Memory that outlives forward: inputs, output and one fp32 value per
    // query row; every score block is rebuilt in backward.
    ctx->save_for_backward({q, k, v, out, r.lse});
    // saved_data holds IValues only; the group outlives backward by contract,
    // so its address is a safe handle (as SyncBatchNorm does).
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(args.group);
    ctx->saved_data["causal"] = args.causal;
    ctx->saved_data["scale"] = args.scale;
    ctx->saved_data["timeout_ms"] = static_cast<int64_t>(args.timeout.count());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    RingArgs args;
    args.group = reinterpret_cast<comm::ProcessGroup*>(ctx->saved_data["group"].toInt());
    args.causal = ctx->saved_data["causal"].toBool();
    args.scale = ctx->saved_data["scale"].toDouble();
    args.timeout = std::chrono::milliseconds(ctx->saved_data["timeout_ms"].toInt());
    // An output nobody used still takes part: peers need our chunk.
    at::Tensor grad_out = grads[0].defined() ? grads[0] : at::zeros_like(out);
    Grads g = ring_backward(q, k, v, out, lse, grad_out, args);
    return {g.dq.to(q.scalar_type()), g.dk.to(k.scalar_type()), g.dv.to(v.scalar_type()), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::ProcessGroup& cp,
                          const RingAttentionOptions& options) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "ring_attention: q, k, v must be [B, heads, S/cp, "
              "head_dim], got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(k.sizes() == q.sizes(), "ring_attention: k ", k.sizes(), " must have q's shape ", q.sizes());
  TORCH_CHECK(v.sizes().slice(0, 3) == q.sizes().slice(0, 3), "ring_attention: v ", v.sizes(),
              " must match q ", q.sizes(), " in batch, heads and chunk length");
  TORCH_CHECK(q.is_floating_point() && k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "ring_attention: q, k, v must share one floating dtype, got ", q.scalar_type(), ", ", k.scalar_type(),
              ", ", v.scalar_type());
  TORCH_CHECK(q.size(2) > 0, "ring_attention: empty sequence chunk");
  RingArgs args;
  args.group = &cp;
  args.causal = options.causal;
  args.scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  args.timeout = options.timeout;
  return RingAttentionFunction::apply(q.contiguous(), k.contiguous(), v.contiguous(), args);
}

void check_sequence_split(int64_t seq_len, int cp_size) {
  if (cp_size < 1) throw Error(fmt::format("ring attention: cp must be at least 1, got {}", cp_size));
  if (seq_len <= 0 || seq_len % cp_size != 0) {
    throw Error(fmt::format(
        "ring attention: sequence length {} is not divisible by cp = {} (each rank holds an equal chunk of the "
        "sequence). Use a sequence length that is a multiple of {} (e.g. {}) or another cp",
        seq_len, cp_size, cp_size, std::max<int64_t>(cp_size, (seq_len + cp_size - 1) / cp_size * cp_size)));
  }
}

at::Tensor sequence_chunk(const at::Tensor& full, int64_t dim, int cp_rank, int cp_size) {
  const int64_t d = dim < 0 ? dim + full.dim() : dim;
  TORCH_CHECK(d >= 0 && d < full.dim(), "sequence_chunk: dim ", dim, " out of range for ", full.sizes());
  check_sequence_split(full.size(d), cp_size);
  TORCH_CHECK(cp_rank >= 0 && cp_rank < cp_size, "sequence_chunk: rank ", cp_rank, " outside cp = ", cp_size);
  const int64_t len = full.size(d) / cp_size;
  return full.narrow(d, cp_rank * len, len);
}

int64_t chunk_offset(int64_t seq_len, int cp_rank, int cp_size) {
  check_sequence_split(seq_len, cp_size);
  return cp_rank * (seq_len / cp_size);
}

}  // namespace paratrain::sequence_parallel
