#!/usr/bin/env python3
"""Write or remove a Prometheus ``file_sd`` target list for one Slurm job's agents.

    file_sd.py write --dir D --job NAME --job-id ID --port 9402 node1 node2 ...
    file_sd.py remove --dir D --job-id ID

``<D>/slurm-<ID>.json`` holds one target group: ``node:port`` per node, labelled
``slurm_job_id`` and ``slurm_job_name`` (not ``job``, which is the scrape job's,
``stormwatch-agent``, nor ``training_job``, which the agents' series carry themselves). Prometheus re-reads
the folder on change (``file_sd_configs``, deploy/slurm/prometheus-scrape.yml). The
file is replaced atomically, so Prometheus never reads half of it. Standard library
only: it runs with the system python3 of a compute node.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def target_groups(nodes: list[str], port: int, job: str, job_id: str) -> list[dict[str, object]]:
    """The file_sd document (prometheus.io/docs: ``<file_sd_config>``)."""
    return [
        {
            "targets": [f"{node}:{port}" for node in nodes],
            "labels": {"slurm_job_id": job_id, "slurm_job_name": job},
        }
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Prometheus file_sd for a Slurm job's agents")
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write")
    write.add_argument("--dir", type=Path, required=True)
    write.add_argument("--job", required=True)
    write.add_argument("--job-id", required=True)
    write.add_argument("--port", type=int, required=True)
    write.add_argument("nodes", nargs="+")
    remove = sub.add_parser("remove")
    remove.add_argument("--dir", type=Path, required=True)
    remove.add_argument("--job-id", required=True)
    args = parser.parse_args(argv)
    path = args.dir / f"slurm-{args.job_id}.json"
    if args.command == "remove":
        path.unlink(missing_ok=True)
        return 0
    if not 0 < args.port < 65536:
        parser.error(f"--port: must be 1..65535 (got {args.port})")
    args.dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(
        json.dumps(target_groups(args.nodes, args.port, args.job, args.job_id), indent=1)
    )
    tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
