#!/usr/bin/env python3
"""The PyTorch peer of fsdp-train: the reference GPT of shared/spec/gpt.md
trained by PyTorch's own data-parallel engines, from the same torch wheel
that fsdp-cpp's LibTorch 2.x build links, so that bench/suite.sh can put
both in one alternating run.

    torchrun --standalone --nproc-per-node W bench/peer.py --engine ddp|fsdp1|fsdp2|local \
        [--preset medium] [--vocab V] [--context T] [--layers L] [--heads H] [--width C] \
        [--batch B] [--steps S] [--dtype fp32|bf16] [--device cpu|cuda] [--attention sdpa|written] [--summary FILE]

Without torchrun (no RANK in the environment) a distributed engine runs as a
1-rank group over a FileStore: W = 1 with no rendezvous at all.

What is the same as fsdp-train's defaults (so that only the engine differs):
the model code (tanh GELU, tied head, and attention as --attention says:
scaled_dot_product_attention, as fsdp-train's default on LibTorch 2.x, or
written out, masked softmax, as src/models/attention.cpp's other path), the
initialization scheme, the data (data/default_corpus.txt, the spec's shuffled
order with seed 0 and a 0.1 validation split), the per-rank batch,
threads per rank (cores / W), AdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8, no
weight decay; fused, as fsdp-train's default, or with --adamw torch the
single-tensor loop, as torch::optim::AdamW),
global-norm clipping at 1.0, and the step time (the median wall time of a
step after the first). bf16: DDP and local run under CPU autocast; FSDP1 and
FSDP2 keep bf16 parameters with fp32 gradient reductions (as fsdp-train's
--param-dtype bf16 --reduce-dtype fp32).

--device cuda: rank r on cuda:LOCAL_RANK, NCCL for the process group, CUDA
autocast for DDP and local bf16; the weights are initialized on the CPU (the
same draw as --device cpu) and then moved. A step's time is taken between
torch.cuda.synchronize() calls, and the summary adds device,
peak_device_bytes (torch.cuda.max_memory_allocated over the whole run, per
rank) and peak_device_reserved_bytes (the caching allocator's reserve).

The summary is one JSON object with fsdp-train's keys where they mean the
same: step_s, tokens_per_s, final_loss, peak_rss_bytes (per rank), ...
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {  # vocab, context, layers, heads, width, batch (shared/spec/gpt.md)
    "tiny": (256, 32, 2, 4, 64, 4),
    "small": (256, 128, 4, 8, 256, 8),
    "medium": (256, 256, 8, 8, 512, 4),
    "large": (256, 256, 12, 16, 1024, 2),
    "xl": (256, 1024, 48, 25, 1600, 1),  # fsdp-train's xl (not in the spec's table)
}


class Attention(nn.Module):
    def __init__(self, width, heads, fused):
        super().__init__()
        self.heads = heads
        self.fused = fused
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hs).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        y = torch.matmul(torch.softmax(scores, -1), v)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, width, heads, fused):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-5)
        self.attn = Attention(width, heads, fused)
        self.ln_2 = nn.LayerNorm(width, eps=1e-5)
        self.mlp = MLP(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, heads, width, fused):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, width),
            wpe=nn.Embedding(context, width),
            h=nn.ModuleList(Block(width, heads, fused) for _ in range(layers)),
            ln_f=nn.LayerNorm(width, eps=1e-5)))
        self.layers = layers

    def init_weights(self, seed):
        torch.manual_seed(seed)
        proj_std = 0.02 / math.sqrt(2 * self.layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(".bias"):
                    p.zero_()
                elif name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                    p.fill_(1.0)
                elif name.endswith("c_proj.weight"):
                    p.normal_(0.0, proj_std)
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, idx, targets):
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in t.h:
            x = block(x)
        logits = F.linear(t.ln_f(x), t.wte.weight)  # the lm head tied to the token embedding
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def splitmix64(z):
    mask = (1 << 64) - 1
    z = (z + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def batch(tokens, n_train, context, step, rank, world, per_rank, seed):
    """The spec's shuffled order: rank r of step s takes sequences j = r*B .. r*B+B-1 of the global batch."""
    global_batch = per_rank * world
    period = n_train - context - 1
    starts = [splitmix64((step * global_batch + j + seed * 0x100000000) % (1 << 64)) % period
              for j in range(rank * per_rank, (rank + 1) * per_rank)]
    x = torch.stack([tokens[s:s + context] for s in starts]).long()
    y = torch.stack([tokens[s + 1:s + context + 1] for s in starts]).long()
    return x, y


def wrap(model, engine, bf16, device):
    if engine == "local":
        return model
    if engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if engine == "fsdp1":
        from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel, MixedPrecision
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
        return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Block}), mixed_precision=mp,
                                        backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True,
                                        device_id=device)
    if engine == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
            MixedPrecisionPolicy()
        for block in model.transformer.h:
            fully_shard(block, mp_policy=mp)
        return fully_shard(model, mp_policy=mp)
    raise ValueError(f"unknown engine '{engine}': expected local, ddp, fsdp1 or fsdp2")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", required=True, choices=["local", "ddp", "fsdp1", "fsdp2"])
    p.add_argument("--preset", default="medium", choices=sorted(PRESETS))
    for name in ("vocab", "context", "layers", "heads", "width"):
        p.add_argument("--" + name, type=int, help="override the preset's " + name)
    p.add_argument("--batch", type=int, help="sequences per rank (default: the preset's)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--data", default="data/default_corpus.txt")
    p.add_argument("--seed", type=int, default=1337, help="initialization seed (fsdp-train's default)")
    p.add_argument("--adamw", default="fused", choices=["fused", "torch"],
                   help="fused AdamW (as fsdp-train's default) or the single-tensor loop")
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "written"],
                   help="scaled_dot_product_attention (fsdp-train's default on LibTorch 2.x) or the masked softmax")
    p.add_argument("--summary", help="write the summary JSON here (rank 0)")
    a = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = a.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            raise SystemExit("peer.py: --device cuda, but torch %s sees no CUDA device" % torch.__version__)
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if a.engine != "local":
        backend = "nccl" if cuda else "gloo"
        if "RANK" in os.environ:
            dist.init_process_group(backend)
        else:  # not under torchrun: one rank, no rendezvous
            import tempfile
            store = dist.FileStore(os.path.join(tempfile.mkdtemp(prefix="peer-"), "store"), 1)
            dist.init_process_group(backend, store=store, rank=0, world_size=1)
    elif world != 1:
        raise SystemExit("peer.py: --engine local runs one process, got WORLD_SIZE=%d" % world)
    rank = dist.get_rank() if dist.is_initialized() else 0
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(max(1, cores // world))  # as fsdp-run: cores / ranks

    vocab, context, layers, heads, width, preset_batch = PRESETS[a.preset]
    vocab, context, layers, heads, width = (v if v is not None else d for v, d in zip(
        (a.vocab, a.context, a.layers, a.heads, a.width), (vocab, context, layers, heads, width)))
    per_rank = a.batch or preset_batch
    bf16 = a.dtype == "bf16"
    with open(a.data, "rb") as f:
        tokens = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    n_train = len(tokens) - math.ceil(0.1 * len(tokens))

    model = GPT(vocab, context, layers, heads, width, a.attention == "sdpa")
    model.init_weights(a.seed)
    if cuda:
        model = model.to(device)
    model = wrap(model, a.engine, bf16, device)
    # fused: PyTorch's fused CPU AdamW, as fsdp-train's default fsdp::FusedAdamW;
    # torch: the single-tensor loop, as torch::optim::AdamW (--adamw torch).
    fused = a.adamw == "fused"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                                  foreach=False, fused=fused or None)
    autocast = bf16 and a.engine in ("local", "ddp")

    step_times, loss = [], float("nan")
    for step in range(a.steps):
        x, y = batch(tokens, n_train, context, step, rank, world, per_rank, 0)
        if cuda:
            x, y = x.to(device), y.to(device)
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = model(x, y)
        out.backward()
        if a.engine == "fsdp1":
            model.clip_grad_norm_(1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        reported = out.detach().clone()  # the mean over the global batch, as fsdp-train reports it
        if world > 1:
            dist.all_reduce(reported)
            reported /= world
        loss = reported.item()
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if step > 0 or a.steps == 1:
            step_times.append(elapsed)
        if rank == 0:
            print(f"step {step + 1}/{a.steps} | loss {loss:.4f} | {elapsed:.3f} s", flush=True)

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    mine = [rss] + ([torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)] if cuda else [])
    every = [mine]
    if world > 1:  # per rank, through the group's own backend (NCCL takes device tensors only)
        gathered = [torch.zeros(len(mine), dtype=torch.long, device=device) for _ in range(world)]
        dist.all_gather(gathered, torch.tensor(mine, device=device))
        every = [[int(v) for v in t.tolist()] for t in gathered]
    rss_all = [m[0] for m in every]
    step_s = sorted(step_times)[len(step_times) // 2] if len(step_times) % 2 else \
        sum(sorted(step_times)[len(step_times) // 2 - 1:len(step_times) // 2 + 1]) / 2
    tokens_per_step = per_rank * world * context
    summary = {"preset": a.preset, "world_size": world, "strategy": "torch_" + a.engine,
               "param_dtype": "bf16" if bf16 else "fp32", "libtorch": torch.__version__.split("+")[0],
               "autocast": autocast, "adamw": a.adamw, "threads_per_rank": torch.get_num_threads(), "steps": a.steps,
               "batch": per_rank, "final_loss": loss, "step_s": step_s, "tokens_per_s": tokens_per_step / step_s,
               "peak_rss_bytes": rss_all}
    if (vocab, context, layers, heads, width) != PRESETS[a.preset][:5]:
        summary.update(vocab=vocab, context=context, layers=layers, heads=heads, width=width)
    if cuda:
        summary.update(device="cuda", device_name=torch.cuda.get_device_name(device),
                       peak_device_bytes=[m[1] for m in every], peak_device_reserved_bytes=[m[2] for m in every])
    if rank == 0:
        device_peak = f", peak device {max(summary['peak_device_bytes']) / 2**30:.2f} GiB" if cuda else ""
        print(f"== summary: torch {a.engine} {a.dtype} W={world}: median step {step_s:.3f} s, "
              f"final loss {loss:.4f}, peak RSS {max(rss_all) / 2**30:.2f} GiB{device_peak}", flush=True)
        if a.summary:
            with open(a.summary, "w") as f:
                f.write(json.dumps(summary) + "\n")
    if dist.is_initialized():
        dist.barrier()
    # Not destroy_process_group and an interpreter teardown: with FSDP2, gloo's
    # threads sometimes end the process in std::terminate at exit (seen with
    # torch 2.15), after everything was measured and written.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
