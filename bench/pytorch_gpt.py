#!/usr/bin/python3
# The PyTorch side of the GPT comparison on one device (issue 31, item 7): a
# plain PyTorch eager twin of paratrain's built-in GPT (paratrain/models/gpt.h)
# trained the way `paratrain train` trains configs/gpt_fortunes.toml at world 1:
#
#   model   GPT-2 layout, parameter names and shapes of gpt.h (wte, wpe,
#           blocks.<i>.{ln1,attn.qkv,attn.proj,ln2,mlp.fc,mlp.proj}, ln_f), the
#           LM head tied to wte; attention written out (matmul, causal mask,
#           softmax, dropout) as gpt.cpp does (--attention sdpa: torch 2.x's
#           fused kernel instead); GELU (exact), LayerNorm eps 1e-5; Linear
#           layers through F.linear, or (--linear cpp) as LibTorch C++ runs
#           them: matmul, then the bias added in place (see class Linear).
#   init    torch.manual_seed(seed), the modules built in gpt.cpp's order (their
#           default init draws), then normal(0, 0.02) for wte, wpe and every
#           Linear weight, normal(0, 0.02 / sqrt(2 * layers)) for attn.proj and
#           mlp.proj, biases 0, LayerNorms 1/0; drawn on the CPU, then moved.
#           With the same torch version this gives paratrain's weights bit for
#           bit; --init-from loads them from a consolidated checkpoint instead.
#   data    byte tokens (vocabulary 256) of data.path: a file, or every regular,
#           non-symlink, non-binary file below a folder in path order; the last
#           ceil(5%) held out; windows of seq_len + 1 with stride seq_len
#           (paratrain/data/text.h); each epoch randperm(N) from a CPU generator
#           seeded with seed + epoch, batches of batch_size, the last partial
#           one dropped (paratrain/data/sampler.h at world 1).
#   loss    cross-entropy over all B*S tokens, logits cast to fp32 first
#           (train/precision.cpp); the forward and the loss under
#           torch.autocast(bf16) with --precision bf16.
#   step    backward, clip_grad_norm_ when > 0 (optimizer.clip_grad_norm), the
#           rate of step t (lr.warmup_steps: peak * t / W for t < W), AdamW
#           (decoupled weight decay on every parameter, as LibTorch's AdamW in
#           train/builders.cpp), zero_grad; loss.item() every step as
#           paratrain's loop does (--loss-sync-every 0 to skip).
#
# Prints one JSON line and appends it to --json-out: {"impl": "pytorch_eager",
# "precision", "tokens_per_s", "samples_per_s", "peak_mem_bytes" (CUDA:
# torch.cuda.max_memory_allocated(), else null), "steps", "final_loss",
# "torch", ...}. Throughput counts only the steps after --warmup-steps, with
# torch.cuda.synchronize() on both ends of the timed region.
#
# bench/check_pytorch_gpt.sh shows on the CPU that it is paratrain's model:
# with --linear cpp every loss and the weights after 10 steps are bit-equal
# to paratrain's (fp32, bf16 and dropout 0.1); with F.linear the fp32 losses
# agree to ~1e-7 relative.
#
# Runs with Debian's /usr/bin/python3 (torch 1.13, CPU) and with a GPU
# machine's Python 3.12 + torch 2.x: only APIs present in both, newer ones
# guarded. Nothing beyond torch is needed (the safetensors reader is here).
#
#   python3 bench/pytorch_gpt.py --steps 20 --warmup-steps 5 --device cpu
#   python3 bench/pytorch_gpt.py --d-model 512 --layers 6 --heads 8 --seq-len 256 \
#       --batch-size 32 --steps 200 --warmup-steps 20 --device cuda --precision bf16 --json-out out.jsonl
#
# bench/run_pytorch_gpt.sh runs it next to `paratrain train` on a GPU.
import argparse
import json
import math
import os
import struct
import sys
import time
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256  # byte tokens (paratrain/train/config/config_model.cpp)


# ---------------------------------------------------------------- safetensors

_ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors(path):
    """{name: tensor} and the metadata of a safetensors file: 8-byte little-endian
    header length, a JSON header {name: {dtype, shape, data_offsets}}, raw data."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: {len(blob)} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} runs past the end of the file ({len(blob)} bytes)")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, which this reader does not know")
        begin, end = info["data_offsets"]
        shape = [int(s) for s in info["shape"]]
        raw = bytearray(blob[base + begin:base + end])  # writable: frombuffer would warn on bytes
        count = 1
        for s in shape:
            count *= s
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        t = torch.frombuffer(raw, dtype=dtype, count=count)
        if sys.byteorder != "little" and t.element_size() > 1:
            raise ValueError("safetensors data is little-endian; this machine is not")
        tensors[name] = t.reshape(shape).clone()
    return tensors, metadata


def model_state_from(path):
    """The model tensors of a paratrain consolidated checkpoint ("model/<param>"),
    or of a plain safetensors state dict (names without the prefix)."""
    tensors, metadata = read_safetensors(path)
    model = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    if not model:
        model = {k: v for k, v in tensors.items() if "/" not in k}
    return model, metadata


# ----------------------------------------------------------------------- data

def _path_key(p):
    # std::filesystem::path's operator<: element by element.
    return tuple(p.split(os.sep))


def _looks_binary(path):
    with open(path, "rb") as f:
        return b"\0" in f.read(8192)


def list_text_files(source):
    """paratrain::data::list_text_files: the file itself, or every regular file
    below the folder (symbolic links and files with a NUL in their first 8 KiB
    skipped), sorted by path."""
    if os.path.isfile(source):
        return [source]
    if not os.path.isdir(source):
        raise SystemExit(f"text corpus {source} does not exist (Debian: apt-get install fortunes)")
    files = []
    for root, dirs, names in os.walk(source, followlinks=False):
        for name in names:
            p = os.path.join(root, name)
            if os.path.islink(p) or not os.path.isfile(p) or _looks_binary(p):
                continue
            files.append(p)
    files.sort(key=_path_key)
    if not files:
        raise SystemExit(f"text corpus {source} holds no text file")
    return files


def load_corpus(source, seq_len, validation_fraction=0.05):
    """Training windows (inputs, targets) as uint8 [rows, seq_len], the token count
    and the CRC-32 of the tokens (the token cache's header field)."""
    data = b"".join(open(p, "rb").read() for p in list_text_files(source))
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    total = tokens.numel()
    held_out = int(math.ceil(total * validation_fraction))
    train = tokens[:total - held_out]
    rows = (train.numel() - 1) // seq_len if train.numel() > 0 else 0
    if rows == 0:
        raise SystemExit(f"text corpus {source} ({total} tokens) is too small for seq_len {seq_len}")
    inputs = train.as_strided((rows, seq_len), (seq_len, 1), 0)
    targets = train.as_strided((rows, seq_len), (seq_len, 1), 1)
    return inputs, targets, total, zlib.crc32(data) & 0xFFFFFFFF


class Batches:
    """World-1 DistributedSampler + Loader: epoch e's order is randperm(N) from a
    CPU generator seeded with seed + e; batch b is positions [b*B, (b+1)*B);
    drop_last (batches per epoch = N // B)."""

    def __init__(self, inputs, targets, batch_size, seed, start_epoch=0, start_batch=0):
        self.inputs, self.targets, self.batch_size, self.seed = inputs, targets, batch_size, seed
        self.per_epoch = inputs.size(0) // batch_size
        if self.per_epoch == 0:
            raise SystemExit(f"{inputs.size(0)} windows are fewer than one batch of {batch_size}")
        self.epoch, self.batch = start_epoch, start_batch
        self.order = self._order()

    def _order(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.inputs.size(0), generator=g)

    def next(self):
        if self.batch >= self.per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
            self.order = self._order()
        idx = self.order[self.batch * self.batch_size:(self.batch + 1) * self.batch_size]
        self.batch += 1
        return self.inputs.index_select(0, idx), self.targets.index_select(0, idx)


# ---------------------------------------------------------------------- model

class Linear(nn.Linear):
    """nn.Linear (the same parameters and init draws). With matmul_add set, the
    forward is LibTorch C++'s torch::nn::functional::linear, which LinearImpl
    calls (1.13 and 2.x headers): addmm for 2-D inputs, else matmul(x, W^T)
    then `out += bias` in place, two kernels where Python's F.linear fuses the
    bias into one (_flatten_3d_linear / addmm). Equal in fp32; under bf16
    autocast the bias is then added in bf16 after rounding, so only this mode
    reproduces paratrain's bf16 numbers bit for bit (--linear cpp)."""

    matmul_add = False

    def forward(self, x):
        if not Linear.matmul_add or x.dim() == 2:
            return F.linear(x, self.weight, self.bias)
        out = x.matmul(self.weight.t())
        out += self.bias
        return out


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, dropout, sdpa=False):
        super().__init__()
        self.qkv = Linear(d, 3 * d)
        self.proj = Linear(d, d)
        self.heads, self.dropout, self.sdpa = heads, dropout, sdpa

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:  # torch >= 2.0 only (guarded in main)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            att = torch.softmax(att.masked_fill(future, float("-inf")), -1)
            att = F.dropout(att, self.dropout, self.training)
            y = torch.matmul(att, v)
        return self.proj(y.transpose(1, 2).contiguous().view(b, s, d))


class Mlp(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = Linear(d, 4 * d)
        self.proj = Linear(4 * d, d)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d, heads, dropout, sdpa=False):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, dropout, sdpa)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = Mlp(d)
        self.dropout = dropout

    def forward(self, x):
        h = x + F.dropout(self.attn(self.ln1(x)), self.dropout, self.training)
        return h + F.dropout(self.mlp(self.ln2(h)), self.dropout, self.training)


class Gpt(nn.Module):
    """paratrain::models::make_gpt: same names, shapes, construction order and init."""

    def __init__(self, vocab, seq_len, layers, d_model, heads, dropout, sdpa=False):
        super().__init__()
        if d_model % heads:
            raise SystemExit(f"--d-model ({d_model}) must be a multiple of --heads ({heads})")
        self.seq_len, self.layers = seq_len, layers
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, heads, dropout, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self):
        std = 0.02
        residual_std = std / math.sqrt(2.0 * self.layers)
        self.wte.weight.normal_(0, std)
        self.wpe.weight.normal_(0, std)
        for block in self.blocks:
            for linear in (block.attn.qkv, block.attn.proj, block.mlp.fc, block.mlp.proj):
                residual = linear is block.attn.proj or linear is block.mlp.proj
                linear.weight.normal_(0, residual_std if residual else std)
                linear.bias.zero_()

    def forward(self, tokens):
        s = tokens.size(1)
        if not 1 <= s <= self.seq_len:
            raise ValueError(f"sequence length {s} outside [1, {self.seq_len}]")
        ids = tokens.long()
        h = self.drop(self.wte(ids) + self.wpe(torch.arange(s, device=ids.device)))
        for block in self.blocks:
            h = block(h)
        return F.linear(self.ln_f(h), self.wte.weight)  # tied head, no bias


def load_weights(model, path):
    state, metadata = model_state_from(path)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing or extra:
        raise SystemExit(f"--init-from {path}: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}")
    for name, t in state.items():
        if tuple(t.shape) != tuple(own[name].shape):
            raise SystemExit(f"--init-from {path}: {name} has shape {list(t.shape)}, the model's is "
                             f"{list(own[name].shape)} (check --d-model/--layers/--heads/--seq-len)")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})
    return metadata


def compare_weights(model, path):
    """max|a-b| / max|b| of every model tensor against a checkpoint (as `paratrain
    checkpoint compare` measures it), worst first: [(rel, name), ...]."""
    state, _ = model_state_from(path)
    out = []
    for name, p in model.state_dict().items():
        ref, a = state[name].double(), p.detach().cpu().double()
        # qkv's rows are [q; k; v]: each part on its own scale. The k bias's
        # gradient is zero up to rounding (softmax ignores a per-query
        # constant), so AdamW moves it by normalized noise: ~1e-6 in size,
        # reported apart so that it does not hide the rest.
        parts = [(name, a, ref)]
        if ".attn.qkv." in name:
            parts = [(f"{name}[{c}]", x, r) for c, x, r in zip("qkv", a.chunk(3, 0), ref.chunk(3, 0))]
        for n, x, r in parts:
            out.append(((x - r).abs().max().item() / max(r.abs().max().item(), 1e-30), n))
    return sorted(out, reverse=True)


# ---------------------------------------------------------------------- train

def lr_at(step, peak, warmup):
    """optim::LrSchedule with lr.warmup_start_factor 0 and lr.decay constant."""
    return peak * step / warmup if step < warmup else peak


def make_adamw(params, args):
    kwargs = dict(lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps, weight_decay=args.weight_decay)
    if args.adamw_impl in ("foreach", "fused", "for_loop"):
        import inspect
        accepted = inspect.signature(torch.optim.AdamW.__init__).parameters
        key = "foreach" if args.adamw_impl in ("foreach", "for_loop") else "fused"
        if key not in accepted:
            raise SystemExit(f"--adamw-impl {args.adamw_impl}: torch {torch.__version__}'s AdamW has no '{key}'")
        kwargs[key] = args.adamw_impl != "for_loop"
    return torch.optim.AdamW(params, **kwargs)


def write_profile(profiler, args, device):
    """The profiled steps' operators, most device (else CPU) self time first."""
    averages = profiler.key_averages()
    table = None
    keys = ["self_device_time_total", "self_cuda_time_total"] if device.type == "cuda" else []
    for key in keys + ["self_cpu_time_total"]:
        try:
            table = averages.table(sort_by=key, row_limit=25)
            break
        except (AttributeError, KeyError, ValueError):
            continue
    with open(args.profile_out, "w") as f:
        f.write(f"# {args.profile_steps} steps after {args.warmup_steps}, {args.precision}, {device}\n{table}\n")
    print(f"profile of {args.profile_steps} steps -> {args.profile_out}", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description="A plain PyTorch eager twin of paratrain's GPT (models/gpt.h), "
                                "trained as `paratrain train -c configs/gpt_fortunes.toml` trains it at world 1; "
                                "prints one JSON line of throughput and peak memory (see the file's header).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=300, help="optimizer steps in all (train.max_steps)")
    p.add_argument("--warmup-steps", type=int, default=10,
                   help="the first steps, not timed (throughput counts --steps minus these)")
    p.add_argument("--lr", type=float, default=1e-3, help="optimizer.lr")
    p.add_argument("--lr-warmup-steps", type=int, default=0, help="lr.warmup_steps (linear from 0)")
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip-grad-norm", type=float, default=1.0, help="0 = no clipping")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0, help="run.seed: model init and data order")
    p.add_argument("--data", default="/usr/share/games/fortunes", help="text file or folder (data.path)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--attention", default="manual", choices=["manual", "sdpa"],
                   help="manual = gpt.cpp's matmul/mask/softmax; sdpa = F.scaled_dot_product_attention (torch 2.x)")
    p.add_argument("--linear", default="python", choices=["python", "cpp"],
                   help="python = F.linear (bias fused); cpp = LibTorch C++'s F::linear as paratrain runs it "
                        "(matmul, then the bias added in place): bit-equal to paratrain under bf16 too")
    p.add_argument("--adamw-impl", default="default", choices=["default", "for_loop", "foreach", "fused"],
                   help="default = what torch picks (foreach on CUDA in 2.x, a loop on the CPU)")
    p.add_argument("--init-from", metavar="FILE.safetensors",
                   help="initial weights from a paratrain consolidated checkpoint (model/<param>)")
    p.add_argument("--start-batch", type=int, default=-1,
                   help="first batch of epoch 0 to train on; -1 = the checkpoint's position with --init-from "
                        "(its epoch/batch_in_epoch metadata), else 0")
    p.add_argument("--compare-weights", metavar="FILE.safetensors",
                   help="after training, print the worst max|a-b|/max|b| of the model tensors against this "
                        "checkpoint (qkv's q, k and v rows apart)")
    p.add_argument("--loss-sync-every", type=int, default=1,
                   help="loss.item() every N steps (paratrain: every step); 0 = only the last")
    p.add_argument("--print-losses", action="store_true",
                   help="each synced step's loss on stderr, and all of them in the JSON line (\"losses\")")
    p.add_argument("--loss-window", type=int, default=20,
                   help="window_loss = the mean of the last N synced losses (paratrain's logged loss is the mean "
                        "since its previous line: run.log_every = N gives the same window)")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch's default)")
    p.add_argument("--json-out", metavar="FILE", help="append the JSON line to FILE")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="profile this many steps after the warmup with torch.profiler (slows them: a run for the "
                        "profile, not for tokens/s) and write the operator table to --profile-out")
    p.add_argument("--profile-out", metavar="FILE", default="pytorch_profile.txt")
    args = p.parse_args()

    if args.steps <= args.warmup_steps:
        raise SystemExit(f"--steps ({args.steps}) must exceed --warmup-steps ({args.warmup_steps})")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is false")
    sdpa = args.attention == "sdpa"
    Linear.matmul_add = args.linear == "cpp"
    if sdpa and not hasattr(F, "scaled_dot_product_attention"):
        raise SystemExit(f"--attention sdpa needs torch >= 2.0 (this is {torch.__version__})")
    device = torch.device(args.device)

    inputs, targets, total_tokens, crc = load_corpus(args.data, args.seq_len)
    print(f"corpus {args.data}: {total_tokens} tokens (crc32 {crc:08x}), {inputs.size(0)} training windows "
          f"of {args.seq_len}", file=sys.stderr)

    torch.manual_seed(args.seed)  # paratrain: seeded_model_factory (train/builders.cpp)
    model = Gpt(VOCAB, args.seq_len, args.layers, args.d_model, args.heads, args.dropout, sdpa)
    metadata = load_weights(model, args.init_from) if args.init_from else {}
    model.to(device)
    model.train()
    start_epoch, start_batch = 0, max(args.start_batch, 0)
    if args.start_batch < 0 and metadata:
        start_epoch = int(metadata.get("epoch", 0))
        start_batch = int(metadata.get("batch_in_epoch", 0))
    batches = Batches(inputs, targets, args.batch_size, args.seed, start_epoch, start_batch)
    params = list(model.parameters())  # unique: wte once (the head is tied to it)
    optimizer = make_adamw(params, args)
    autocast = (lambda: torch.autocast(device_type=args.device, dtype=torch.bfloat16)) \
        if args.precision == "bf16" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    last_loss = None
    losses = []  # every synced step's loss
    t0 = None
    profiler = None
    for step in range(args.steps):
        if step == args.warmup_steps:
            sync()
            t0 = time.perf_counter()
            if args.profile_steps > 0:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if device.type == "cuda":
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                profiler = torch.profiler.profile(activities=activities)
                profiler.__enter__()
        if profiler is not None and step == args.warmup_steps + args.profile_steps:
            sync()
            profiler.__exit__(None, None, None)
            write_profile(profiler, args, device)
            profiler = None
        x, y = batches.next()
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        if autocast is not None:
            with autocast():
                logits = model(x)
                loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1).long())
        else:
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1).long())
        loss.backward()
        grad_norm = None
        if args.clip_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, args.clip_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.lr, args.lr_warmup_steps)
        optimizer.step()
        optimizer.zero_grad()
        del logits
        if (args.loss_sync_every > 0 and (step + 1) % args.loss_sync_every == 0) or step + 1 == args.steps:
            last_loss = loss.item()
            losses.append(last_loss)
            if args.print_losses:
                norm = "" if grad_norm is None else f" grad_norm {float(grad_norm):.6f}"
                print(f"step {step + 1} loss {last_loss:.8f}{norm}", file=sys.stderr)
    sync()
    elapsed = time.perf_counter() - t0
    timed = args.steps - args.warmup_steps

    result = {
        "impl": "pytorch_eager",
        "precision": args.precision,
        "tokens_per_s": timed * args.batch_size * args.seq_len / elapsed,
        "samples_per_s": timed * args.batch_size / elapsed,
        "peak_mem_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None,
        "steps": args.steps,
        "timed_steps": timed,
        "timed_s": elapsed,
        "final_loss": last_loss,
        "window_loss": sum(losses[-args.loss_window:]) / len(losses[-args.loss_window:]),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cuda": torch.version.cuda,
        "allow_tf32": torch.backends.cuda.matmul.allow_tf32,  # False by default: fp32 is full fp32 on both sides
        "attention": args.attention,
        "linear": args.linear,
        "adamw_impl": args.adamw_impl,
        "d_model": args.d_model, "layers": args.layers, "heads": args.heads, "seq_len": args.seq_len,
        "batch_size": args.batch_size, "dropout": args.dropout,
        "parameters": sum(t.numel() for t in params),
        "init_from": args.init_from,
    }
    if args.print_losses:
        result["losses"] = losses
    if args.compare_weights:
        diffs = compare_weights(model, args.compare_weights)
        result["max_rel_diff_vs"] = {"file": args.compare_weights, "worst": [[n, r] for r, n in diffs]}
        print(f"weights vs {args.compare_weights}, max|a-b|/max|b| worst first: "
              + ", ".join(f"{n} {r:.3e}" for r, n in diffs[:4]), file=sys.stderr)
    line = json.dumps(result)
    print(line)
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
