#!/usr/bin/env python3
"""bench/checkpoint next to PyTorch: torch.distributed.checkpoint (DCP) save and
load against plain write()/read() of the same bytes, measured in the same run.

Usage:
  env -u OPENBLAS_CORETYPE python3 bench/checkpoint_torch.py [--mib=1024]
      [--tensors=4] [--ranks=8] [--rounds=3] [--dir=/tmp] [--json]

The checkpoint is bench/checkpoint's: `tensors` f32 CPU tensors [rows, 1024]
of `mib` MiB in all, DTensors with Shard(0) on a 1-D DeviceMesh of `ranks`
processes (torch.multiprocessing spawn, gloo, one intra-op and one interop
thread each, as bench/checkpoint has one thread per rank). Rows:
  save  S(0), N ranks    dcp.save (FileSystemWriter: one file per rank, fsync)
  load  S(0), N ranks    dcp.load into new DTensors of the same layout
  load  S(0), N/2 ranks  dcp.load on a DeviceMesh of the first N/2 ranks
  load  S(1), N ranks    dcp.load into new Shard(1) DTensors
each against "plain": rank 0 alone writes the checkpoint's total bytes to one
file with os.write, then fsyncs the file and its directory, and reads them
back with readinto() into a new uninitialised buffer. Nothing is dropped
from the page cache: both loads read files just written, warm. GiB/s is the
total bytes over rank 0's wall time from a barrier to a barrier after the
call; each row is the best of `rounds` rounds, each round running DCP and
plain back to back. The loaded values are checked in the first round.
Each process pins glibc's mmap threshold at its default, as bench/checkpoint
does (its header says why): every load maps new memory.
Without torch the script says so and exits 0.
"""
import ctypes
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import warnings

# torch warns on import when numpy is missing; nothing here uses numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

COLUMNS = 1024  # bench/checkpoint's kColumns: rows of 4 KiB
M_MMAP_THRESHOLD = -3  # mallopt(3)
GLIBC_DEFAULT_MMAP_THRESHOLD = 128 * 1024
GIB = float(1 << 30)


def parse_args(argv):
    opts = {"mib": "1024", "tensors": "4", "ranks": "8", "rounds": "3", "dir": "/tmp", "json": False}
    for arg in argv:
        if arg == "--json":
            opts["json"] = True
            continue
        key, _, value = arg.removeprefix("--").partition("=")
        if key not in opts or not value:
            sys.exit(f"checkpoint_torch: unknown or empty option {arg!r}; expected --key=value, one of {sorted(opts)}")
        opts[key] = value
    for key in ("mib", "tensors", "ranks", "rounds"):
        opts[key] = int(opts[key])
        if opts[key] < 1:
            sys.exit(f"checkpoint_torch: --{key}={opts[key]}; expected at least 1")
    return opts


def rows_of(cfg):
    return max(1, cfg["mib"] * (1 << 20) // cfg["tensors"] // (COLUMNS * 4))


def total_bytes(cfg):
    return cfg["tensors"] * rows_of(cfg) * COLUMNS * 4


def expected_values(tensor_index, row_offset, col_offset, rows, cols):
    """The values of tensor `tensor_index` at a box: exact in f32, position-dependent."""
    import torch
    r = torch.arange(row_offset, row_offset + rows, dtype=torch.int64).unsqueeze(1)
    c = torch.arange(col_offset, col_offset + cols, dtype=torch.int64).unsqueeze(0)
    return ((r * COLUMNS + c) % 65521 + tensor_index).to(torch.float32)


def chunk_range(size, parts, index):
    """torch.chunk's piece `index` of `size`: (offset, length)."""
    step = -(-size // parts)
    begin = min(size, step * index)
    return begin, min(size, begin + step) - begin


def shard_box(shape, dim, parts, index):
    offset, length = chunk_range(shape[dim], parts, index)
    offsets, sizes = [0, 0], list(shape)
    offsets[dim], sizes[dim] = offset, length
    return offsets, sizes


def make_state(mesh, cfg, dim, fill):
    """Per tensor, this rank's Shard(dim) DTensor: the saved values when `fill`, else uninitialised."""
    import torch
    from torch.distributed.tensor import DTensor, Shard
    shape = (rows_of(cfg), COLUMNS)
    parts, index = mesh.size(), mesh.get_local_rank()
    (r0, c0), (rows, cols) = shard_box(shape, dim, parts, index)
    state = {}
    for i in range(cfg["tensors"]):
        local = expected_values(i, r0, c0, rows, cols) if fill else torch.empty(rows, cols)
        state[f"layer{i}.weight"] = DTensor.from_local(local, mesh, [Shard(dim)], run_check=False, shape=shape,
                                                       stride=(COLUMNS, 1))
    return state


def check_state(state, mesh, dim, cfg):
    import torch
    (r0, c0), (rows, cols) = shard_box((rows_of(cfg), COLUMNS), dim, mesh.size(), mesh.get_local_rank())
    for i in range(cfg["tensors"]):
        got = state[f"layer{i}.weight"].to_local()
        if not torch.equal(got, expected_values(i, r0, c0, rows, cols)):
            raise RuntimeError(f"checkpoint_torch: layer{i}.weight S({dim}) on {mesh.size()} ranks loaded other values")


def host_view(tensor):
    """A writable memoryview of a contiguous uint8 CPU tensor (no numpy needed)."""
    return memoryview((ctypes.c_char * tensor.numel()).from_address(tensor.data_ptr())).cast("B")


def write_plain(path, source):
    view = host_view(source)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_plain(path, nbytes):
    import torch
    out = torch.empty(nbytes, dtype=torch.uint8)  # uninitialised, as a loader's would be
    view = host_view(out)
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < nbytes:
            n = f.readinto(view[done:])
            if not n:
                raise RuntimeError(f"checkpoint_torch: {path} ends at byte {done} of {nbytes}")
            done += n
    return out


def timed(fn):
    """Rank 0's wall time of fn on every rank, from a barrier to a barrier; fn's result."""
    import torch.distributed as dist
    dist.barrier()
    start = time.perf_counter()
    result = fn()
    dist.barrier()
    return time.perf_counter() - start, result


def load_cases(world):
    """(layout dim, ranks) per load row, as bench/checkpoint's load_cases."""
    cases = [(0, world)]
    if world >= 2:
        cases.append((0, world // 2))
    cases.append((1, world))
    return cases


def measure_load(dim, mesh, ckpt, plain, cfg, check, best):
    """One load row then a plain read, each timed into best = [dcp seconds, plain seconds]."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    state = make_state(mesh, cfg, dim, fill=False) if mesh is not None else None

    def load():
        if mesh is not None:
            dcp.load(state, storage_reader=dcp.FileSystemReader(ckpt), process_group=mesh.get_group())

    seconds, _ = timed(load)
    best[0] = min(best[0], seconds)
    if check and mesh is not None:
        check_state(state, mesh, dim, cfg)
    del state
    seconds, buffer = timed(lambda: read_plain(plain, total_bytes(cfg)) if dist.get_rank() == 0 else None)
    best[1] = min(best[1], seconds)
    del buffer  # freed outside the timing, as the loaded state above


def run_rounds(rank, world, cfg, work):
    """Every round on this rank; the best [dcp, plain] seconds per row."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    # DeviceMesh of a subset is a collective over the world: every rank makes each.
    load_meshes = []
    for dim, ranks in load_cases(world):
        sub = mesh if ranks == world else DeviceMesh("cpu", list(range(ranks)))
        load_meshes.append((dim, ranks, sub if rank < ranks else None))
    state = make_state(mesh, cfg, 0, fill=True)
    source = torch.full((total_bytes(cfg),), 0x5A, dtype=torch.uint8) if rank == 0 else None
    ckpt, plain = os.path.join(work, "checkpoint"), os.path.join(work, "plain.bin")
    best = [[float("inf"), float("inf")] for _ in range(1 + len(load_meshes))]
    for round_index in range(cfg["rounds"]):
        if rank == 0:  # both sides write new files, untimed removal of the last round's
            shutil.rmtree(ckpt, ignore_errors=True)
            if os.path.exists(plain):
                os.remove(plain)
        seconds, _ = timed(lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(ckpt, sync_files=True)))
        best[0][0] = min(best[0][0], seconds)
        seconds, _ = timed(lambda: write_plain(plain, source) if rank == 0 else None)
        best[0][1] = min(best[0][1], seconds)
        for i, (dim, _, sub) in enumerate(load_meshes):
            measure_load(dim, sub, ckpt, plain, cfg, round_index == 0, best[i + 1])
    rows = [("save", "S(0)", world)] + [("load", f"S({dim})", ranks) for dim, ranks, _ in load_meshes]
    return [(op, layout, ranks, b[0], b[1]) for (op, layout, ranks), b in zip(rows, best)]


def print_table(cfg, rows, work):
    nbytes = total_bytes(cfg)
    if not cfg["json"]:
        print(f"checkpoint_torch: torch.distributed.checkpoint, {cfg['tensors']} f32 tensors [{rows_of(cfg)},{COLUMNS}] "
              f"({nbytes / GIB:.2f} GiB), saved Shard(0) on a 1-D DeviceMesh of {cfg['ranks']} gloo processes; "
              f"best of {cfg['rounds']} rounds in {work}")
        print("plain: rank 0 os.write()s one file + fsync (file, directory), readinto()s a new buffer; "
              "page cache warm for both loads")
        print(f"{'op':<6} {'layout':>6} {'ranks':>5} {'torch GiB/s':>14} {'plain GiB/s':>12} {'ratio':>8}")
    for op, layout, ranks, dcp_s, plain_s in rows:
        ours, plain = nbytes / GIB / dcp_s, nbytes / GIB / plain_s
        if cfg["json"]:
            print(json.dumps({"operation": op, "layout": layout, "ranks": ranks, "backend": "torch-gloo",
                              "bytes": nbytes, "torch_gib_per_s": round(ours, 4), "plain_gib_per_s": round(plain, 4),
                              "ratio": round(ours / plain, 4)}))
        else:
            print(f"{op:<6} {layout:>6} {ranks:>5} {ours:>14.2f} {plain:>12.2f} {ours / plain:>8.2f}")
    sys.stdout.flush()


def run_rank(rank, world, port, cfg, work):
    import torch
    import torch.distributed as dist

    ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, GLIBC_DEFAULT_MMAP_THRESHOLD)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        rows = run_rounds(rank, world, cfg, work)
        if rank == 0:
            print_table(cfg, rows, work)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    cfg = parse_args(sys.argv[1:])
    try:
        import torch  # noqa: F401
        import torch.multiprocessing as mp
    except ImportError:
        print("torch is not installed: nothing to measure (pip install torch)")
        return 0
    work = tempfile.mkdtemp(prefix="torch-bench-checkpoint-", dir=cfg["dir"])
    try:
        mp.spawn(run_rank, args=(cfg["ranks"], free_port(), cfg, work), nprocs=cfg["ranks"], join=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
