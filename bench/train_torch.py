#!/usr/bin/env python3
"""bench/train next to PyTorch: the same GPT training step on CPU processes over gloo.

Usage:
  env -u OPENBLAS_CORETYPE python3 bench/train_torch.py [--compare=build/bench/train]
      [--ranks=1,2,4,8] [--plans=ddp,zero1,fsdp2,tp] [--layers=6] [--d-model=384]
      [--heads=8] [--seq=64] [--batch=8] [--warmup=1] [--steps=5] [--rounds=1]
      [--overlap=0]

The model is bench/train's (train/, nn::GPT): token and learned position
embeddings, pre-LN blocks with separate q, k, v and proj linears (biases),
causal attention (F.scaled_dot_product_attention, is_causal=True), an MLP
4x with exact GELU, a final layer norm and an untied lm_head without bias;
f32, AdamW (lr 1e-3, weight decay 0, PyTorch's default implementation). The
batch (batch x seq tokens, all ranks together) is the same shape; tokens are
random bytes.

One process per rank (torch.multiprocessing spawn), torch.set_num_threads(1)
and one interop thread per process, to match bench/train's one thread per
rank; torch.distributed on the gloo backend. Plans:
  plain  one process, no torch.distributed (bench/train's `plain` row)
  ddp    DistributedDataParallel, the batch split over the ranks
  zero1  DDP with ZeroRedundancyOptimizer(AdamW): states sharded (ZeRO-1)
  fsdp2  fully_shard on every block and the root (ZeRO-3: parameters too)
  tp     Megatron tensor parallel with DTensor (parallelize_module):
         q, k, v, fc ColwiseParallel; proj RowwiseParallel; wte
         RowwiseParallel (vocab-parallel); lm_head ColwiseParallel with
         loss_parallel; the whole batch on every rank
Not here: bench/train's tp_sp and the 2-D ddp,tp rows.

Timing as bench/train: `warmup` untimed steps, then `steps` timed ones; each
step is zero_grad, forward, loss, backward, optimizer step and reading the
loss (.item()); tokens/s is batch * seq * steps over the sum of the timed
steps' wall times on rank 0.

With --compare=BINARY the script runs bench/train (--json, the same sizes)
for each rank count just before PyTorch's rows for that count, and prints
dtensor / PyTorch tokens/s per plan and rank count (> 1: dtensor is faster);
with --rounds=N it alternates the two N times per rank count and keeps each
row's best round; --overlap=1 runs bench/train with --overlap (PyTorch's
DDP and FSDP2 overlap by default):
ddp against DDP, zero1 against ZeroRedundancyOptimizer and against FSDP2,
fsdp against FSDP2, tp against tp. Without torch the script says so and exits 0.
"""
import json
import os
import socket
import subprocess
import sys
import time
import warnings

# torch warns on import when numpy is missing; nothing here uses numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

TORCH_PLANS = ("plain", "ddp", "zero1", "fsdp2", "tp")
# PyTorch's plan -> bench/train's plans it is compared with. FSDP2 shards
# parameters, gradients and optimizer states (ZeRO-3), so it stands against
# our fsdp (the same sharding) and against our zero1 (which keeps whole
# parameters and gradients, the cheaper choice at these sizes).
OURS = {"plain": ["plain"], "ddp": ["ddp"], "zero1": ["zero1"], "fsdp2": ["zero1", "fsdp"], "tp": ["tp"]}
OUR_ORDER = ["ddp", "zero1", "fsdp", "tp"]


def parse_args(argv):
    opts = {"ranks": "1,2,4,8", "plans": "ddp,zero1,fsdp2,tp", "layers": "6", "d-model": "384", "heads": "8",
            "seq": "64", "batch": "8", "warmup": "1", "steps": "5", "rounds": "1", "compare": "",
            "overlap": "0"}
    for a in argv:
        if not a.startswith("--") or "=" not in a:
            sys.exit(f"train_torch: '{a}': expected --name=value")
        k, v = a[2:].split("=", 1)
        if k not in opts:
            sys.exit(f"train_torch: unknown option --{k}; expected one of {', '.join(opts)}")
        opts[k] = v
    cfg = {}
    for k in ("layers", "d-model", "heads", "seq", "batch", "warmup", "steps", "rounds", "overlap"):
        try:
            cfg[k] = int(opts[k])
        except ValueError:
            sys.exit(f"train_torch: --{k}={opts[k]}: expected an integer")
    cfg["ranks"] = [int(r) for r in opts["ranks"].split(",")]
    cfg["plans"] = opts["plans"].split(",")
    for p in cfg["plans"]:
        if p not in TORCH_PLANS:
            sys.exit(f"train_torch: unknown plan '{p}'; expected one of {', '.join(TORCH_PLANS)}")
    cfg["compare"] = opts["compare"]
    return cfg


def build_model(cfg):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    D, H, T, V = cfg["d-model"], cfg["heads"], cfg["seq"], 256

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.proj = (nn.Linear(D, D) for _ in range(4))
            self.head_dim = D // H

        def forward(self, x):
            B, L, _ = x.shape
            # -1 heads: under tensor parallelism q, k, v hold this rank's heads.
            split = lambda t: t.view(B, L, -1, self.head_dim).transpose(1, 2)
            y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(B, L, -1))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(D), Attention(), nn.LayerNorm(D), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.ln_f = nn.LayerNorm(D)
            self.lm_head = nn.Linear(D, V, bias=False)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
            for b in self.blocks:
                x = b(x)
            return self.lm_head(self.ln_f(x))

    torch.manual_seed(1)
    return GPT()


def apply_plan(model, plan, world):
    """The model and optimizer under `plan` on `world` ranks, and the loss context."""
    import contextlib

    import torch
    from torch.distributed.device_mesh import init_device_mesh

    ctx = contextlib.nullcontext
    adamw = dict(lr=1e-3, weight_decay=0.0)
    if plan == "plain":
        return model, torch.optim.AdamW(model.parameters(), **adamw), ctx
    mesh = init_device_mesh("cpu", (world,))
    if plan in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        if plan == "ddp":
            return model, torch.optim.AdamW(model.parameters(), **adamw), ctx
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **adamw), ctx
    if plan == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), **adamw), ctx
    if plan == "tp":
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel,
                                                       parallelize_module)

        layer_plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                      "attn.proj": RowwiseParallel(), "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}
        for b in model.blocks:
            parallelize_module(b, mesh, layer_plan)
        parallelize_module(model, mesh, {
            "wte": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
        })
        return model, torch.optim.AdamW(model.parameters(), **adamw), loss_parallel
    raise ValueError(plan)


def run_rank(rank, world, port, plan, cfg, results):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    if plan != "plain":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model, opt, loss_ctx = apply_plan(build_model(cfg), plan, world)
    B, T = cfg["batch"], cfg["seq"]
    local_b = B // world if plan in ("ddp", "zero1", "fsdp2") else B
    g = torch.Generator().manual_seed(7)
    times = []
    for step in range(cfg["warmup"] + cfg["steps"]):
        tokens = torch.randint(0, 256, (B, T + 1), generator=g)
        rows = tokens[rank * local_b:(rank + 1) * local_b] if local_b != B else tokens
        x, y = rows[:, :-1], rows[:, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with loss_ctx():
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
        opt.step()
        value = loss.full_tensor().item() if hasattr(loss, "full_tensor") else loss.item()
        took = time.perf_counter() - t0
        if step >= cfg["warmup"]:
            times.append(took)
    if rank == 0:
        results.put({"plan": plan, "ranks": world, "step_seconds": sum(times) / len(times),
                     "tokens_per_second": B * T * len(times) / sum(times), "loss": value})
    if plan != "plain":
        dist.barrier()
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_torch(plan, world, cfg):
    import torch.multiprocessing as mp

    if plan in ("ddp", "zero1", "fsdp2") and cfg["batch"] % world:
        return {"plan": plan, "ranks": world, "skipped": f"batch {cfg['batch']} not divisible by {world}"}
    if plan == "tp" and cfg["heads"] % world:
        return {"plan": plan, "ranks": world, "skipped": f"heads {cfg['heads']} not divisible by {world}"}
    results = mp.get_context("spawn").SimpleQueue()
    try:
        mp.spawn(run_rank, args=(world, free_port(), plan, cfg, results), nprocs=world, join=True)
    except Exception as e:  # a plan PyTorch cannot run here: say so and go on
        last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        return {"plan": plan, "ranks": world, "skipped": last[:160]}
    return results.get()


def run_ours(binary, world, cfg, with_plain):
    plans = sorted({o for p in cfg["plans"] if p != "plain" for o in OURS[p]}, key=OUR_ORDER.index)
    cmd = [binary, "--json", f"--ranks={world}", f"--plans={','.join(plans)}", "--no-2d",
           f"--layers={cfg['layers']}", f"--d-model={cfg['d-model']}", f"--heads={cfg['heads']}",
           f"--seq={cfg['seq']}", f"--batch={cfg['batch']}", f"--warmup={cfg['warmup']}", f"--steps={cfg['steps']}"]
    if not with_plain:
        cmd.append("--no-plain")
    if cfg["overlap"]:
        cmd.append("--overlap")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {(r["plan"], r["ranks"]): r for r in rows if not r.get("skipped")}


def main():
    cfg = parse_args(sys.argv[1:])
    try:
        import torch
    except ImportError:
        print("torch is not installed: nothing to compare (pip install torch)")
        return 0
    D, L = cfg["d-model"], cfg["layers"]
    params = 2 * 256 * D + cfg["seq"] * D + L * (12 * D * D + 13 * D) + 2 * D
    print(f"train_torch: GPT {L} layers, d_model {D}, {cfg['heads']} heads, seq {cfg['seq']}, batch {cfg['batch']} "
          f"({params / 1e6:.1f}M parameters, f32), AdamW; {cfg['warmup']} warm-up + {cfg['steps']} timed steps; "
          f"torch {torch.__version__}, gloo, 1 thread per process")
    compare = cfg["compare"]
    rows = []  # (torch row, our row or None)
    plain_done = False
    for world in cfg["ranks"]:
        plans = [p for p in cfg["plans"] if p != "plain"]
        if world == 1 and not plain_done:
            plans = ["plain"] + plans
        best_ours, best_torch = {}, {}
        for _ in range(cfg["rounds"]):  # alternating, so that both see the same load; the best round counts
            ours = run_ours(compare, world, cfg, with_plain="plain" in plans) if compare else {}
            for key, row in ours.items():
                if key not in best_ours or row["tokens_per_second"] > best_ours[key]["tokens_per_second"]:
                    best_ours[key] = row
            for plan in plans:
                t = measure_torch(plan, world, cfg)
                old = best_torch.get(plan)
                if old is None or old.get("skipped") or (
                        not t.get("skipped") and t["tokens_per_second"] > old["tokens_per_second"]):
                    best_torch[plan] = t
        for plan in plans:
            for ours_plan in OURS[plan]:
                t, o = best_torch[plan], best_ours.get((ours_plan, world))
                rows.append((t, o))
                print_row(t, ours_plan, o)
        plain_done = True
    return 0


HEADER_PRINTED = []


def print_row(t, ours_plan, o):
    if not HEADER_PRINTED:
        print(f"{'torch plan':<10} {'ranks':>5} {'torch ms':>9} {'torch tok/s':>11} {'dtensor plan':>12} "
              f"{'dtensor tok/s':>13} {'dtensor/torch':>13}")
        HEADER_PRINTED.append(True)
    if t.get("skipped"):
        print(f"{t['plan']:<10} {t['ranks']:>5}  skipped: {t['skipped']}")
        return
    mine = f"{o['tokens_per_second']:>13.0f} {o['tokens_per_second'] / t['tokens_per_second']:>13.2f}" if o else \
        f"{'-':>13} {'-':>13}"
    print(f"{t['plan']:<10} {t['ranks']:>5} {1e3 * t['step_seconds']:>9.1f} {t['tokens_per_second']:>11.0f} "
          f"{ours_plan:>12} {mine}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
