"""Checks of the values a job hands the telemetry API: each bad value is one warning per kind
(:func:`stormwatch.telemetry.lifecycle.guard.warn_once`) naming the argument and the fix, and the
caller drops the call. No torch import here (a tensor is converted with ``float()``, which
it supports, without importing torch).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from typing import SupportsIndex

from stormwatch.telemetry.lifecycle.guard import warn_once
from stormwatch.telemetry.phases import PhaseSpec

#: What happens to a call whose argument is bad: the whole call, or only that argument.
IGNORED = "this call is ignored"
LEFT_OUT = "it is left out of this step mark (the step itself is recorded)"


def _kind(value: object) -> str:
    """The kind of a bad value, so each different mistake is warned about once."""
    return type(value).__name__


def _detached(value: object) -> object:
    """A tensor without its autograd graph (``float()`` of one that requires grad warns)."""
    detach = getattr(value, "detach", None)
    return detach() if callable(detach) else value


def count(
    name: str, value: object, *, call: str, consequence: str = IGNORED
) -> tuple[bool, int | None]:
    """(ok, value) of an optional integer >= 0 argument (a step, tokens, samples)."""
    if value is None:
        return True, None
    if type(value) is int and value >= 0:  # the common case, without the Protocol check
        return True, value
    kind = _kind(value)
    if not isinstance(value, bool) and isinstance(value, SupportsIndex):
        try:
            number = operator.index(value)  # int, numpy and 0-d torch integers
        except TypeError:  # a tensor of several values
            number = -1
        if number >= 0:
            return True, number
        kind = "negative" if number < 0 and kind == "int" else kind
    warn_once(
        f"{call}:{name}:{kind}",
        "%s(%s=%r): %s must be an int >= 0; %s (pass e.g. %s=int(...))",
        call,
        name,
        value,
        name,
        consequence,
        name,
    )
    return False, None


def real(
    name: str, value: object, *, call: str, consequence: str = IGNORED
) -> tuple[bool, float | None]:
    """(ok, value) of an optional real-number argument (NaN and inf pass: see :func:`finite`)."""
    if value is None:
        return True, None
    if type(value) is float:  # the common case
        return True, value
    if not isinstance(value, (bool, str, bytes)):
        try:
            return True, float(_detached(value))  # type: ignore[arg-type]
        except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of many values
            pass  # warned below
        except OverflowError:  # an int beyond a float's range (10**400)
            warn_once(
                f"{call}:{name}:overflow",
                "%s(%s=<int of %d digits>): %s is too large for a float (above 1.8e308); %s",
                call,
                name,
                len(str(abs(value))) if isinstance(value, int) else 0,
                name,
                consequence,
            )
            return False, None
    warn_once(
        f"{call}:{name}:{_kind(value)}",
        "%s(%s=%r): %s must be a number (a Python float or a one-element tensor); %s",
        call,
        name,
        value,
        name,
        consequence,
    )
    return False, None


def finite(name: str, value: float | None, *, step: int) -> None:
    """Warn once when ``value`` is NaN or infinite: the run diverged. The value is still
    recorded (the ``StormwatchLossNaN`` alert reads it); only the warning is once."""
    if value is not None and not math.isfinite(value):
        warn_once(
            f"step:{name}:not_finite",
            "step(%d, %s=%r): the %s is not finite (training diverged?); it is recorded "
            "as is, so the StormwatchLossNaN alert fires; check the learning rate and the data",
            step,
            name,
            value,
            name,
        )


@dataclass(frozen=True)
class StepArgs:
    """The checked arguments of :func:`stormwatch.telemetry.step`."""

    step: int
    loss: float | None
    tokens: int | None
    samples: int | None
    learning_rate: float | None
    grad_norm: float | None


def step_args(
    step: object,
    *,
    loss: object,
    tokens: object,
    samples: object,
    lr: object,
    grad_norm: object,
) -> StepArgs | None:
    """The arguments of ``step()`` checked; ``None`` (after one warning) when the step number
    is bad. A bad optional argument is left out of the mark (one warning per argument and
    kind of value); the step itself is still recorded."""
    if step is None:
        warn_once("step:step", "step(None): the step number is required (an int >= 0)")
        return None
    ok_step, number = count("step", step, call="step")
    if not ok_step or number is None:
        return None
    _, n_tokens = count("tokens", tokens, call="step", consequence=LEFT_OUT)
    _, n_samples = count("samples", samples, call="step", consequence=LEFT_OUT)
    _, loss_value = real("loss", loss, call="step", consequence=LEFT_OUT)
    _, lr_value = real("lr", lr, call="step", consequence=LEFT_OUT)
    _, norm_value = real("grad_norm", grad_norm, call="step", consequence=LEFT_OUT)
    finite("loss", loss_value, step=number)
    return StepArgs(number, loss_value, n_tokens, n_samples, lr_value, norm_value)


def phase_with_bound(spec: PhaseSpec, bound_seconds: object) -> PhaseSpec:
    """``spec`` with ``bound_seconds`` for one entry (``phase(name, bound_seconds=...)``); one
    warning and ``spec`` unchanged (the configured bound) when it is not a positive, finite
    number of seconds."""
    try:
        seconds = float(bound_seconds)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        warn_once(
            f"phase:bound:{_kind(bound_seconds)}",
            "phase(%r, bound_seconds=%r): not a positive number of seconds; the phase's "
            "configured bound applies",
            spec.name,
            bound_seconds,
        )
        return spec
    return replace(spec, bound_seconds=seconds)


def error_text(error: object) -> str:
    """A failure as recorded: ``"<Type>: <message>"`` for an exception, the text as given,
    else its ``repr``."""
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return error if isinstance(error, str) else repr(error)


__all__ = ["IGNORED", "LEFT_OUT", "StepArgs", "count", "error_text", "finite", "real", "step_args"]
