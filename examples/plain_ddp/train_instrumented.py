"""``train.py`` with stormwatch's API: ``init`` once, ``step`` after each optimizer step,
and a ``phase`` around the checkpoint save (the lines marked ``# stormwatch``).

Run it like any DDP job; the node agent's metrics folder comes from the environment
(``STORMWATCH_METRICS_DIR``, as the lab, deploy/slurm/train.sbatch and the Kubernetes
manifests set it)::

    STORMWATCH_METRICS_DIR=/run/stormwatch/metrics \\
        torchrun --nproc-per-node 2 examples/plain_ddp/train_instrumented.py --steps 50

Beyond zero-code mode it gives step boundaries (step number, step time, heartbeat per
step), loss, samples, and checkpoint save phases the hang detection does not take for
hangs (docs/instrument-your-job.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import stormwatch.telemetry as swt  # stormwatch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A tiny DDP regression job (gloo, CPU).")
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--checkpoint", type=Path, help="file rank 0 saves the model to")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between saves")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    swt.init()  # stormwatch: rank, job and folders from the environment
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)  # each rank its own samples
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 32, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), 0.1 * x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        time.sleep(args.step_delay)
        swt.step(step, loss=loss.item(), samples=args.batch * world)  # stormwatch
        if args.checkpoint is not None and step % args.checkpoint_every == 0 and rank == 0:
            with swt.phase("checkpoint_save"):  # stormwatch: a pause, not a hang
                torch.save(net.state_dict(), args.checkpoint)
            swt.checkpoint(step)  # stormwatch
        if rank == 0 and (step % 10 == 0 or step == args.steps):
            print(f"step {step}/{args.steps} loss {loss.item():.4f} ({world} ranks)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
