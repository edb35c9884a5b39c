#!/usr/bin/env python3
"""PyTorch DDP over Gloo on CPU ranks: the PyTorch side of the CPU scaling
benchmark (bench/run_cpu_scaling.sh, issue 31 item 9).

Trains the model of a paratrain config (configs/fashion_mnist_mlp.toml or
configs/fashion_mnist_cnn.toml: the same layers, per-rank batch and SGD) on
the real Fashion-MNIST training set, read from its *-ubyte.gz files with
gzip + struct (no torchvision), normalized as paratrain does, each rank
drawing its own shard of a per-epoch shuffle (DistributedSampler's split).
One thread per rank. Warm-up steps, a barrier, then timed steps; rank 0
prints one JSON line:

  {"impl": "pytorch_ddp_gloo", "model": "mlp", "ranks": 2, "samples_per_s": ..., "steps": ...}

(samples/s = ranks x batch x steps / the slowest rank's time: weak scaling,
the global batch grows with the ranks).

Starts its ranks itself with torch.multiprocessing (--nproc N), or runs as
one rank of a launcher that set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
(torchrun, or `paratrain launch --plain-store`). Works with Debian's
python3-torch 1.13 and PyTorch 2.x.

  python3 bench/pytorch_ddp_cpu.py --config configs/fashion_mnist_mlp.toml --nproc 2 \\
      --data /usr/share/datasets/fashion-mnist --warmup 50 --steps 500
"""
import argparse
import gzip
import json
import os
import socket
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from paratrain_models import Mlp, Cnn  # the same layers as paratrain/models/

try:
    import tomllib  # Python >= 3.11
except ImportError:  # pragma: no cover - older Pythons: built-in defaults only
    tomllib = None

# paratrain/data/fashion_mnist.h
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530

# The defaults of docs/config-reference.md for every key this script reads
# (a config leaves out what keeps its default).
DEFAULTS = {
    "model": {"kind": "mlp", "hidden": [256, 128], "channels": [32, 64], "cnn_hidden": 128, "batchnorm": False},
    "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0, "nesterov": False,
                  "clip_grad_norm": 0.0},
    "data": {"dataset": "fashion_mnist", "dir": "/usr/share/datasets/fashion-mnist", "batch_size": 64,
             "global_batch_size": 0},
    "train": {"accumulate": 1},
    "ddp": {"mode": "bucketed", "bucket_cap_mb": 25.0, "first_bucket_cap_mb": 1.0},
    "run": {"seed": 0},
}


def load_config(path):
    """The config's values over DEFAULTS; refuses what this script does not mirror."""
    cfg = {section: dict(keys) for section, keys in DEFAULTS.items()}
    if path:
        if tomllib is None:
            sys.exit("pytorch_ddp_cpu.py: reading --config needs Python >= 3.11 (tomllib)")
        with open(path, "rb") as f:
            for section, keys in tomllib.load(f).items():
                if isinstance(keys, dict):
                    cfg.setdefault(section, {}).update(keys)
    m, o, d = cfg["model"], cfg["optimizer"], cfg["data"]
    unsupported = []
    if m["kind"] not in ("mlp", "cnn"):
        unsupported.append(f"model.kind = {m['kind']!r} (mlp or cnn)")
    if m["kind"] == "cnn" and m["batchnorm"]:
        unsupported.append("model.batchnorm = true")
    if o["kind"] != "sgd":
        unsupported.append(f"optimizer.kind = {o['kind']!r} (sgd)")
    if o["clip_grad_norm"]:
        unsupported.append("optimizer.clip_grad_norm")
    if d["dataset"] != "fashion_mnist":
        unsupported.append(f"data.dataset = {d['dataset']!r}")
    if d["global_batch_size"] or cfg["train"]["accumulate"] != 1:
        unsupported.append("data.global_batch_size / train.accumulate")
    if cfg["ddp"]["mode"] != "bucketed":
        unsupported.append(f"ddp.mode = {cfg['ddp']['mode']!r} (bucketed)")
    if unsupported:
        sys.exit(f"pytorch_ddp_cpu.py: {path}: not mirrored here: " + "; ".join(unsupported))
    return cfg


def read_idx(path, ndim):
    """One IDX file (gzip-compressed or not) as a uint8 tensor of ndim dims."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype, dims = struct.unpack_from(">HBB", raw, 0)
    if zero != 0 or dtype != 0x08 or dims != ndim:
        raise ValueError(f"{path}: not a uint8 IDX file with {ndim} dimensions "
                         f"(header {zero:#x} {dtype:#x} {dims})")
    shape = struct.unpack_from(f">{dims}I", raw, 4)
    offset = 4 + 4 * dims
    count = 1
    for s in shape:
        count *= s
    if len(raw) - offset != count:
        raise ValueError(f"{path}: {len(raw) - offset} bytes of data for shape {shape}")
    return torch.frombuffer(bytearray(raw[offset:]), dtype=torch.uint8).reshape(shape)


def find_file(folder, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    sys.exit(f"pytorch_ddp_cpu.py: no {stem}(.gz) in {folder} (--data names the folder of the *-ubyte.gz files)")


def load_fashion_mnist_train(folder):
    """paratrain/data/fashion_mnist.cpp: [60000, 1, 28, 28] floats, (x/255 - mean)/std, int64 labels."""
    images = read_idx(find_file(folder, "train-images-idx3-ubyte"), 3)
    labels = read_idx(find_file(folder, "train-labels-idx1-ubyte"), 1)
    if images.size(0) != labels.size(0) or tuple(images.shape[1:]) != (28, 28):
        raise ValueError(f"{folder}: {tuple(images.shape)} images for {labels.size(0)} labels")
    x = images.float().div_(255.0).sub_(FASHION_MEAN).div_(FASHION_STD).unsqueeze(1).contiguous()
    return x, labels.long()


def batches(n_items, rank, world, batch, seed):
    """Endless index batches of this rank: per epoch a seeded shuffle, this
    rank's strided shard (DistributedSampler's split), whole batches only."""
    per_rank = n_items // world
    epoch = 0
    while True:
        g = torch.Generator().manual_seed(seed + epoch)
        shard = torch.randperm(n_items, generator=g)[rank:per_rank * world:world]
        for start in range(0, per_rank - batch + 1, batch):
            yield shard[start:start + batch]
        epoch += 1


def worker(rank, world, o):
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    cfg = load_config(o.config)
    m, opt_cfg = cfg["model"], cfg["optimizer"]
    batch = o.batch or cfg["data"]["batch_size"]
    seed = cfg["run"]["seed"]
    dist.init_process_group("gloo", rank=rank, world_size=world)

    x, y = load_fashion_mnist_train(o.data or cfg["data"]["dir"])
    if batch * world > x.size(0):
        sys.exit(f"pytorch_ddp_cpu.py: batch {batch} x {world} ranks exceeds the {x.size(0)} training images")
    torch.manual_seed(seed)
    if m["kind"] == "mlp":
        model = Mlp(m["hidden"])
    else:
        model = Cnn(m["channels"], m["cnn_hidden"])
    ddp = cfg["ddp"]
    net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=ddp["bucket_cap_mb"])
    opt = torch.optim.SGD(model.parameters(), lr=opt_cfg["lr"], momentum=opt_cfg["momentum"],
                          weight_decay=opt_cfg["weight_decay"], nesterov=opt_cfg["nesterov"])
    it = batches(x.size(0), rank, world, batch, seed)

    def run(steps):
        loss = None
        for _ in range(steps):
            idx = next(it)
            inputs, targets = x.index_select(0, idx), y.index_select(0, idx)
            opt.zero_grad()
            loss = F.cross_entropy(net(inputs), targets)
            loss.backward()
            opt.step()
        return loss

    run(o.warmup)
    dist.barrier()
    start = time.perf_counter()
    loss = run(o.steps)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
    elapsed_s = elapsed.item()
    if rank == 0:
        line = json.dumps({
            "impl": "pytorch_ddp_gloo", "model": m["kind"], "ranks": world,
            "samples_per_s": world * batch * o.steps / elapsed_s, "steps": o.steps,
            "warmup": o.warmup, "batch_per_rank": batch, "global_batch": world * batch,
            "elapsed_s": elapsed_s, "step_ms": 1000.0 * elapsed_s / o.steps,
            "final_loss": loss.item(), "threads_per_rank": torch.get_num_threads(),
            "params": sum(p.numel() for p in model.parameters()),
            "torch": torch.__version__, "config": o.config,
        })
        print(line, flush=True)
        if o.out:
            with open(o.out, "a") as f:
                f.write(line + "\n")
    # Leave together and skip teardown: torch 1.13 can deadlock at
    # interpreter exit (DDP's Reducer destructor joins a Gloo thread that
    # waits for the GIL), and a rank left behind would spin on the store.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawned(rank, world, o):
    os.environ["RANK"], os.environ["LOCAL_RANK"] = str(rank), str(rank)
    worker(rank, world, o)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a paratrain config (mlp or cnn, SGD, Fashion-MNIST)")
    p.add_argument("--data", default="", help="folder of the Fashion-MNIST *-ubyte.gz files (default: data.dir)")
    p.add_argument("--nproc", type=int, default=1,
                   help="ranks to spawn (ignored under a launcher that set RANK and WORLD_SIZE)")
    p.add_argument("--steps", type=int, default=300, help="timed steps")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps first")
    p.add_argument("--batch", type=int, default=0, help="per-rank batch (default: the config's data.batch_size)")
    p.add_argument("--out", default="", help="also append the JSON line to this file")
    o = p.parse_args()
    if o.steps < 1 or o.warmup < 0 or o.nproc < 1 or o.batch < 0:
        p.error("need --steps >= 1, --warmup >= 0, --nproc >= 1, --batch >= 0")
    load_config(o.config)  # fail here, not in N ranks
    # One compute thread per rank; loopback, one machine.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun / paratrain launch
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), o)
        return 0
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ["WORLD_SIZE"] = str(o.nproc)
    mp.spawn(spawned, args=(o.nproc, o), nprocs=o.nproc, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
