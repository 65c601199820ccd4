"""Performance arithmetic: collective bandwidths (nccl-tests), model FLOPs, MFU, peak FLOP/s.

Bandwidths follow NCCL tests' definitions (NVIDIA/nccl-tests, doc/PERFORMANCE.md):

* ``algbw = S / t``: ``S`` is the operation's size in bytes, ``t`` its time.
  ``S`` is the full (unsharded) buffer: for all-reduce, broadcast and reduce
  the tensor; for reduce-scatter the input (``count * n``); for all-gather the
  output (``n`` times this rank's input); for all-to-all the send buffer.
* ``busbw = algbw * factor``, a number comparable to the hardware's peak
  whatever the rank count ``n``: all-reduce ``2 (n - 1) / n``; reduce-scatter,
  all-gather and all-to-all ``(n - 1) / n``; broadcast and reduce ``1``.
  Point-to-point (send/recv) uses 1 as well; barrier has no size.

MFU (model FLOPs utilisation, after PaLM, Chowdhery et al. 2022, appendix B,
as torchtitan computes it): ``flops_per_token = 6 N + 12 L d T`` with ``N``
non-embedding parameters, ``L`` layers, ``d`` width and ``T`` sequence length;
``MFU = flops_per_token * tokens_per_second_per_device / peak``.

No torch import here.
"""

from __future__ import annotations

import math

from stormwatch.errors import ConfigError

#: busbw / algbw per op, as a function of the group size n (nccl-tests PERFORMANCE.md).
_BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}

#: Dense bf16 peak FLOP/s by device-name substring, first match wins (vendor
#: data sheets, without sparsity). Override with ``--peak-flops``.
PEAK_FLOPS_BY_DEVICE: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
)

#: Nominal peak FLOP/s of one CPU rank (1e11 = 100 GFLOP/s, the order of one
#: modern core with two AVX-512 FMA units in fp32: 2 x 16 lanes x 2 flops x
#: ~3 GHz ~ 192 GFLOP/s, rounded down). Only a reference point so that MFU is
#: defined on CPU; override with ``--peak-flops``.
CPU_NOMINAL_PEAK_FLOPS = 1e11


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` over ``n`` ranks (0 for ops without a size, e.g. barrier)."""
    factor = _BUS_FACTORS.get(op)
    if factor is None or n < 1:
        return 0.0
    return factor(n)


def collective_size(op: str, nbytes: int, n: int) -> int:
    """nccl-tests' size ``S`` in bytes, from this rank's input bytes ``nbytes`` and ``n`` ranks."""
    return nbytes * n if op == "all_gather" else nbytes


def bandwidths(op: str, nbytes: int, n: int, seconds: float) -> tuple[float, float]:
    """``(algbw, busbw)`` in bytes/second; ``(0, 0)`` when ``seconds <= 0``."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = collective_size(op, nbytes, n) / seconds
    return algbw, algbw * bus_factor(op, n)


def flops_per_token(*, non_embedding_params: int, n_layers: int, d_model: int, seq_len: int) -> int:
    """Training FLOPs per token: ``6 N + 12 L d T`` (forward + backward, attention included)."""
    return 6 * non_embedding_params + 12 * n_layers * d_model * seq_len


def peak_flops(device_name: str, *, on_gpu: bool, override: float | None = None) -> float | None:
    """Peak FLOP/s of one device: ``override``, else the table, else the CPU nominal.

    Returns:
        ``None`` for a GPU whose name is not in :data:`PEAK_FLOPS_BY_DEVICE`
        (MFU is then not exported; pass ``--peak-flops``).

    Raises:
        ConfigError: ``override`` is not a positive finite number.
    """
    if override is not None:
        if not (math.isfinite(override) and override > 0):
            raise ConfigError(f"peak_flops: must be a finite number > 0 (got {override!r})")
        return float(override)
    if not on_gpu:
        return CPU_NOMINAL_PEAK_FLOPS
    for key, value in PEAK_FLOPS_BY_DEVICE:
        if key in device_name:
            return value
    return None


def mfu(*, flops_per_token: int, tokens: int, seconds: float, devices: int, peak: float) -> float:
    """Model FLOPs utilisation in [0, 1+) of one device.

    Args:
        flops_per_token: from :func:`flops_per_token`.
        tokens: tokens processed by the model replica in ``seconds``.
        seconds: wall time.
        devices: devices sharing that replica's work (the tensor-parallel degree).
        peak: peak FLOP/s of one device.
    """
    if seconds <= 0 or peak <= 0 or devices < 1:
        return 0.0
    return flops_per_token * tokens / seconds / devices / peak


__all__ = [
    "CPU_NOMINAL_PEAK_FLOPS",
    "PEAK_FLOPS_BY_DEVICE",
    "bandwidths",
    "bus_factor",
    "collective_size",
    "flops_per_token",
    "mfu",
    "peak_flops",
]
