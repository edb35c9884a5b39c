#!/usr/bin/python3
# The PyTorch side of the ZeRO/FSDP benchmark: one rank of the same work as
# bench/zero_throughput.cpp (MLP 784-1024-1024-10, Adam, synthetic in-memory
# batches, one thread per rank) under torch DDP (--mode ddp), DDP plus
# torch.distributed.optim.ZeroRedundancyOptimizer (--mode zero), or FSDP
# (--mode fsdp: expected to fail on CPU in 1.13; the line then carries the
# error text). Prints one JSON line on rank 0. Not a driver: bench/run_zero.sh
# launches it with `paratrain launch`. Run with Debian's /usr/bin/python3.
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from paratrain_models import Mlp  # the same layers as paratrain/models/


def storage_bytes(tensors):
    """Bytes of the distinct storages behind `tensors` (views counted once),
    as paratrain's tensor_bytes (core/model_state.h) counts."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        s = t.storage()
        if s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        total += s.nbytes()
    return total


def state_tensors(optimizer):
    return [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=["ddp", "zero", "fsdp"], default="ddp")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="")
    o = p.parse_args()
    if o.steps < 1 or o.warmup < 1 or o.batch < 1:
        p.error(f"need --steps >= 1, --warmup >= 1, --batch >= 1; got {o.steps}, {o.warmup}, {o.batch}")

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(o.seed)
    model = Mlp()
    pool = 8
    g = torch.Generator().manual_seed(o.seed + 1000 + rank)
    inputs = [torch.randn((o.batch, 784), generator=g) for _ in range(pool)]
    targets = [torch.randint(0, 10, (o.batch,), generator=g) for _ in range(pool)]
    base = {"impl": "pytorch", "mode": o.mode, "stage": {"ddp": 0, "zero": 1, "fsdp": 3}[o.mode],
            "world": world, "batch": o.batch, "steps": o.steps, "warmup": o.warmup,
            "optimizer": "adam", "threads": torch.get_num_threads(),
            "params": sum(x.numel() for x in model.parameters()), "torch_version": torch.__version__}

    if o.mode == "fsdp":
        return try_fsdp(model, inputs[0], targets[0], o, rank, base)

    net = nn.parallel.DistributedDataParallel(model)
    if o.mode == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=o.lr)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=o.lr)

    def run_steps(steps):
        t = dict(forward=0.0, backward=0.0, step=0.0)  # as the C++ side's phases
        loss = None
        for i in range(steps):
            t0 = time.perf_counter()
            loss = F.cross_entropy(net(inputs[i % pool]), targets[i % pool])
            t1 = time.perf_counter()
            opt.zero_grad(set_to_none=False)  # keep .grad, as the C++ side
            loss.backward()
            t2 = time.perf_counter()
            opt.step()  # ZeroRedundancyOptimizer: local step, then parameter broadcasts
            t3 = time.perf_counter()
            t["forward"] += t1 - t0
            t["backward"] += t2 - t1
            t["step"] += t3 - t2
        return loss, t

    run_steps(o.warmup)
    dist.barrier()
    start = time.perf_counter()
    loss, t = run_steps(o.steps)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    elapsed_s = elapsed.item()

    # Live tensors after the last step. ZeroRedundancyOptimizer keeps the
    # state of the parameters this rank owns in its local optimizer (.optim);
    # DDP's bucket buffers are not reachable from Python (not counted).
    inner = opt.optim if o.mode == "zero" else opt
    params = list(model.parameters())
    mine = torch.tensor([storage_bytes(params), storage_bytes([x.grad for x in params]),
                         storage_bytes(state_tensors(inner)), -1,
                         resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=torch.int64)
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        ranks = [{"params": int(v[0]), "grads": int(v[1]), "optimizer_state": int(v[2]),
                  "model_state": int(v[0] + v[1] + v[2]), "comm_buffers": None, "peak_rss": int(v[4])}
                 for v in gathered]
        j = dict(base, elapsed_s=elapsed_s, samples_per_s=world * o.batch * o.steps / elapsed_s,
                 step_ms=elapsed_s * 1000.0 / o.steps, final_loss=loss.item(),
                 phase_ms={k: v * 1000.0 / o.steps for k, v in t.items()},
                 bytes_source="python: storages of parameters, .grad, optimizer state after the last step",
                 ranks=ranks)
        emit(j, o.out)
    # As bench/ddp_pytorch.py: leave together and skip teardown (torch 1.13
    # can deadlock at exit in DDP's Reducer destructor).
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def try_fsdp(model, x, y, o, rank, base):
    """FSDP on CPU: wrap and take one step; record what 1.13 says."""
    error = None
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        net = FSDP(model)
        opt = torch.optim.Adam(net.parameters(), lr=o.lr)
        F.cross_entropy(net(x), y).backward()
        opt.step()
    except Exception as e:  # the point of this mode: report, do not fail
        error = f"{type(e).__name__}: {e}".strip()
    if rank == 0:
        emit(dict(base, error=error, ran=error is None), o.out)
    sys.stdout.flush()
    os._exit(0)


def emit(j, out):
    line = json.dumps(j, sort_keys=True)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
