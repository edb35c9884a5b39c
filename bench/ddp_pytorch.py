#!/usr/bin/python3
# The PyTorch side of the DDP throughput benchmark: one rank of the same work
# as bench/ddp_throughput.cpp (same models, batch, SGD, synthetic in-memory
# batches, one thread per rank), under torch.nn.parallel.DistributedDataParallel
# with Gloo, printing the same JSON line on rank 0. Not a driver: bench/run_ddp.sh
# launches it with `paratrain launch` next to the C++ program and compares.
# --mode nocomm (both sides) skips the all-reduce: analysis only.
# Run with Debian's /usr/bin/python3 (python3-torch 1.13.1, the same LibTorch).
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from paratrain_models import Mlp, Cnn  # the same layers as paratrain/models/


class GptBlock(nn.Module):
    """One pre-LN block of paratrain::models::make_gpt: x + attn(ln1(x)), then + mlp(ln2(.))."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def attn(self, x):
        # Written out as the C++ model is (LibTorch 1.13 has no fused SDPA in C++).
        b, s, d = x.shape
        hd = d // self.heads
        q, k, v = (t.view(b, s, self.heads, hd).transpose(1, 2) for t in self.qkv(x).split(d, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / hd ** 0.5)
        future = torch.ones(s, s, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(b, s, d))

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.fc_proj(F.gelu(self.fc(self.ln2(h))))


class Gpt(nn.Module):
    """make_gpt(bench_gpt()) of bench/ddp_throughput.cpp: byte tokens, 4 layers,
    d 256, 4 heads, seq 128, no dropout, LM head tied to wte. Same sizes and
    operations; initial weights are PyTorch's defaults (speed does not care)."""

    def __init__(self, vocab=256, seq_len=128, layers=4, d=256, heads=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(GptBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, tokens):
        pos = torch.arange(tokens.size(1))
        h = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            h = block(h)
        return F.linear(self.ln_f(h), self.wte.weight)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", choices=["mlp", "cnn", "gpt"], default="mlp")
    p.add_argument("--mode", choices=["bucketed", "local", "nocomm"], default="bucketed",
                   help="bucketed: torch DDP; local: no DDP, one rank; nocomm: DDP with a comm "
                        "hook that skips the all-reduce (analysis only: the ceiling)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--first-bucket-cap-mb", type=float, default=1.0,
                   help="must be 1: torch 1.13 fixes its first bucket at 1 MiB")
    p.add_argument("--gradient-as-bucket-view", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="")
    o = p.parse_args()
    if o.steps < 1 or o.warmup < 0 or o.batch < 1:
        p.error(f"need --steps >= 1, --warmup >= 0, --batch >= 1; got {o.steps}, {o.warmup}, {o.batch}")
    if o.first_bucket_cap_mb != 1.0:
        p.error("--first-bucket-cap-mb: torch 1.13's DDP has a fixed 1 MiB first bucket; pass 1")

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if o.mode == "local" and world != 1:
        p.error(f"--mode local needs one rank, got WORLD_SIZE={world}")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    # Loopback, as paratrain's Gloo device: one machine, same transport.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(o.seed)
    model = {"mlp": Mlp, "cnn": Cnn, "gpt": Gpt}[o.model]()
    pool = 8  # ready-made batches per rank, cycled through (as the C++ side)
    g = torch.Generator().manual_seed(o.seed + 1000 + rank)
    if o.model == "gpt":
        windows = [torch.randint(0, 256, (o.batch, 129), generator=g) for _ in range(pool)]
        inputs = [w[:, :128].contiguous() for w in windows]
        targets = [w[:, 1:].contiguous() for w in windows]
    else:
        shape = (784,) if o.model == "mlp" else (1, 28, 28)
        inputs = [torch.randn((o.batch, *shape), generator=g) for _ in range(pool)]
        targets = [torch.randint(0, 10, (o.batch,), generator=g) for _ in range(pool)]

    net = model
    if o.mode in ("bucketed", "nocomm"):
        net = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=o.bucket_cap_mb,
            gradient_as_bucket_view=o.gradient_as_bucket_view)
        if o.mode == "nocomm":
            net.register_comm_hook(None, skip_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=o.lr)

    def run_steps(steps):
        t = dict(forward=0.0, backward=0.0, sync=0.0, optimizer=0.0)
        loss = None
        for i in range(steps):
            b = i % pool
            t0 = time.perf_counter()
            logits = net(inputs[b])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets[b].reshape(-1))
            t1 = time.perf_counter()
            opt.zero_grad()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            t["forward"] += t1 - t0
            t["backward"] += t2 - t1
            t["optimizer"] += t3 - t2
        return t, loss

    run_steps(o.warmup)
    dist.barrier()
    start = time.perf_counter()
    t, loss = run_steps(o.steps)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
    elapsed_s = elapsed.item()

    if rank == 0:
        params = sum(x.numel() for x in model.parameters())
        j = {
            "impl": "pytorch", "model": o.model, "mode": o.mode, "world": world,
            "batch": o.batch, "steps": o.steps, "warmup": o.warmup,
            "bucket_cap_mb": o.bucket_cap_mb, "first_bucket_cap_mb": 1.0,
            "gradient_as_bucket_view": o.gradient_as_bucket_view,
            "threads": torch.get_num_threads(), "params": params, "grad_bytes": params * 4,
            "elapsed_s": elapsed_s,
            "samples_per_s": world * o.batch * o.steps / elapsed_s,
            "step_ms": elapsed_s * 1000.0 / o.steps,
            "final_loss": loss.item(),
            "phase_ms": {k: v * 1000.0 / o.steps for k, v in t.items()},
            "torch_version": torch.__version__,
        }
        if o.mode in ("bucketed", "nocomm"):
            j["comm"] = ddp_logging(net)
        line = json.dumps(j, sort_keys=True)
        print(line, flush=True)
        if o.out:
            with open(o.out, "a") as f:
                f.write(line + "\n")
    # Leave together and skip teardown: torch 1.13 can deadlock at interpreter
    # exit (DDP's Reducer destructor joins a Gloo thread that waits for the
    # GIL the destructor holds), and a rank left behind spins on the store.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def skip_allreduce_hook(state, bucket):
    """--mode nocomm: hands the bucket back unreduced (divided by the world
    size, as the default hook does before its all-reduce)."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer().div_(dist.get_world_size()))
    return fut


def ddp_logging(net):
    """PyTorch DDP's own overlap timers (ns, averaged over its sampled
    iterations: the first 10, then every 100th; warm-up ones included)."""
    try:
        d = net._get_ddp_logging_data()
    except Exception as e:  # private API: report, do not fail the run
        return {"source": f"unavailable: {e}"}
    ms = lambda k: d.get(k, 0) / 1e6
    comm, overlap = ms("avg_backward_comm_time"), ms("avg_backward_compute_comm_overlap_time")
    return {
        "source": "torch DDP logging data (sampled iterations)",
        # Not paratrain's definitions: torch times comm from the first bucket's
        # launch to the last one's completion (compute in between included) and
        # counts as hidden everything from that launch to the end of backward.
        "definitions": "comm_ms: first launch -> last completion; hidden_ms: first launch -> "
                       "end of backward compute",
        # Buckets are rebuilt after the first iteration in gradient-ready order.
        "buckets": len(str(d.get("rebuilt_bucket_sizes") or d.get("bucket_sizes", "")).split(",")),
        "backward_ms": ms("avg_backward_compute_time"),
        "comm_ms": comm,
        "hidden_ms": overlap,
        "hidden_share": overlap / comm if comm > 0 else 0.0,
        "forward_ms": ms("avg_forward_compute_time"),
    }


if __name__ == "__main__":
    sys.exit(main())
