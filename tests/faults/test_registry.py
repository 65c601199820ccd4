"""The registry: every kind is declared completely once, and its two models agree."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any, get_args

import pytest
from pydantic import TypeAdapter, ValidationError

import stormwatch.faults.kinds as kinds_package
from stormwatch.faults import (
    AGENT_KINDS,
    FAULT_CATEGORIES,
    MAX_TTL_SECONDS,
    REGISTRY,
    AnyExperimentFault,
    DetectClass,
    DetectClassBy,
    Fault,
    FaultKind,
    InvalidFaultRequest,
    Placement,
    Target,
    category_of,
    detect_class_of,
    parse_request,
)
from stormwatch.faults.kind import Blast
from stormwatch.faults.kinds.link import LinkFlapRequest
from stormwatch.plan import load_failure_table

KINDS = list(REGISTRY.values())
REQUESTED = [d for d in KINDS if d.request is not None]
#: Request fields an experiment never holds, whatever the kind.
AGENT_SIDE = {"id", "kind", "ttl_seconds", "job"}


def _ids(definition: FaultKind) -> str:
    return definition.kind


class _Agents:
    """Three nodes with agents, as the controller resolves them."""

    def nodes(self) -> list[str]:
        return ["n0", "n1", "n2"]

    def address(self, node: str) -> tuple[str, int | None]:
        return f"10.0.0.1{node[-1]}", 9400


def test_every_fault_kind_declared_in_a_kind_module_is_registered_once() -> None:
    declared = []
    for info in pkgutil.iter_modules(kinds_package.__path__):
        module = importlib.import_module(f"{kinds_package.__name__}.{info.name}")
        declared += [v for v in vars(module).values() if isinstance(v, FaultKind)]
    assert {id(d) for d in declared} == {id(d) for d in KINDS}
    assert len(REGISTRY) == len(KINDS) == 22
    assert all(name == d.kind for name, d in REGISTRY.items())


@pytest.mark.parametrize("definition", KINDS, ids=_ids)
def test_every_kind_is_complete(definition: FaultKind) -> None:
    traits = definition.traits
    assert definition.summary.strip()
    assert (definition.request is None) == (definition.fault is None)
    assert (definition.request is None) == (traits.placement is Placement.CONTROLLER)
    if definition.request is not None:
        assert get_args(definition.request.model_fields["kind"].annotation) == (definition.kind,)
        fields = set(definition.request.model_fields)
        assert traits.job_scoped == ("job" in fields)
        accounted = set(definition.params) | definition.targeting.supplies | AGENT_SIDE
        assert fields <= accounted | definition.agent_only, fields - accounted
        assert definition.agent_only <= fields
        required = {n for n, f in definition.request.model_fields.items() if f.is_required()}
        assert required <= set(definition.params) | definition.targeting.supplies | {"id", "kind"}
    if definition.fault is not None:
        assert issubclass(definition.fault, Fault)
        assert not inspect.isabstract(definition.fault), definition.fault.__abstractmethods__
    experiment = definition.experiment
    assert experiment.definition is definition
    assert get_args(experiment.model_fields["kind"].annotation) == (definition.kind,)
    assert experiment.__doc__ == definition.summary


@pytest.mark.parametrize("definition", KINDS, ids=_ids)
def test_traits_agree_with_each_other(definition: FaultKind) -> None:
    traits = definition.traits
    assert (traits.fixed_place is not None) == (traits.target in (Target.NODE_SETS, Target.NONE))
    assert (traits.placement is Placement.EACH_NODE) == (traits.target is Target.NODE_SETS)
    assert (traits.placement is Placement.EVERY_AGENT) == (traits.target is Target.NONE)
    if traits.placement in (Placement.CONTROLLER, Placement.RANK_AGENT):
        assert traits.target is Target.RANK
    assert traits.reverts_itself == (
        traits.placement is not Placement.CONTROLLER and not traits.kills_agent
    )
    if traits.kills_agent:
        assert traits.final and traits.blast is Blast.NOTHING
    if traits.category is not None:
        assert traits.category in load_failure_table().ids


@pytest.mark.parametrize("definition", KINDS, ids=_ids)
def test_every_kind_has_a_detection_class_for_every_value_that_decides_it(
    definition: FaultKind,
) -> None:
    trait = definition.traits.detect_class
    assert trait is not None, f"{definition.kind}: declare Traits(detect_class=...)"
    if isinstance(trait, DetectClassBy):
        assert definition.request is not None
        values = get_args(definition.request.model_fields[trait.field].annotation)
        assert set(trait.classes) == set(values), set(values) ^ set(trait.classes)
        assert all(isinstance(c, DetectClass) for c in trait.classes.values())
    else:
        assert isinstance(trait, DetectClass)
        assert detect_class_of(definition.kind) is trait
    assert detect_class_of("no_such_kind") is None


@pytest.mark.parametrize("definition", REQUESTED, ids=_ids)
def test_the_experiment_and_agent_models_share_every_field_they_both_hold(
    definition: FaultKind,
) -> None:
    assert definition.request is not None
    experiment = definition.experiment.model_fields
    for name in definition.params:
        mine, theirs = experiment[name], definition.request.model_fields[name]
        assert mine.annotation == theirs.annotation, name
        assert repr(mine.metadata) == repr(theirs.metadata), name  # bounds, patterns, lengths
        assert mine.default == theirs.default, name
    ttl = experiment["ttl_seconds"]
    agent_ttl = definition.request.model_fields["ttl_seconds"]
    assert ttl.annotation == agent_ttl.annotation  # the same bounds: (0, MAX_TTL_SECONDS]
    assert ttl.default == definition.ttl_default
    assert agent_ttl.default == 300.0


#: One experiment fault per kind, with every optional field it has set to a valid value.
FULL: dict[str, dict[str, Any]] = {
    "kill_rank": {"rank": 1, "signal": "SIGTERM"},
    "freeze_rank": {"rank": 1},
    "freeze_ranks": {"rank": 2, "include_torchrun": True},
    "kill_torchrun": {"node": "n1", "signal": "SIGTERM"},
    "kill_node_processes": {"rank": 0},
    "kill_rdzv_host": {"signal": "SIGTERM"},
    "kill_agent": {"node": "n2"},
    "partition": {"nodes": ["n0"], "direction": "inbound", "verify_timeout_seconds": 1.0},
    "isolate_store": {"node": "n1", "store": "host:29500"},
    "bandwidth_limit": {"node": "n1", "rate_kbit": 800, "burst_bytes": 4096, "latency_ms": 5.0},
    "packet_drop": {"node": "n1", "probability": 0.2, "peers": ["n0", "n2"]},
    "link_flap": {"node": "n1", "period_seconds": 2.0, "down_seconds": 0.5},
    "cpu_throttle": {"rank": 3, "cpu_fraction": 0.5, "method": "duty_cycle"},
    "trainer_fault": {"rank": 0, "point": "collective_delay", "seconds": 0.1, "op": "all_reduce"},
    "gpu_xid": {"node": "n0", "gpu": 1, "xid": 48},
    "gpu_throttle": {"node": "n0", "reason": "thermal"},
    "nvlink_down": {"node": "n0", "links": [0, 3]},
    "nvlink_errors": {"node": "n0", "link": 2, "counter": "replay", "count": 5},
    "gpu_lost": {"node": "n0", "gpu": 2},
    "gpu_power_cap": {"node": "n0", "watts": 300.0, "max_clock_mhz": 1200},
    "checkpoint_readonly": {"node": "n0", "path": "/ckpt"},
    "checkpoint_full": {"rank": 1},
}


def test_the_examples_cover_every_kind() -> None:
    assert set(FULL) == set(REGISTRY)


@pytest.mark.parametrize("definition", REQUESTED, ids=_ids)
def test_an_experiment_fault_becomes_a_request_the_agent_accepts_unchanged(
    definition: FaultKind,
) -> None:
    fault = TypeAdapter(AnyExperimentFault).validate_python(
        {"kind": definition.kind, "ttl_seconds": 42.0, **FULL[definition.kind]}
    )
    body = definition.agent_body(fault, job="job-a", agents=_Agents())
    request = parse_request({"id": "e.f", **body})
    assert type(request) is definition.request
    assert request.ttl_seconds == 42.0
    for name in definition.params:  # every shared field reaches the agent as set
        assert getattr(request, name) == getattr(fault, name), name
    assert ("job" in body) == definition.traits.job_scoped


def test_the_agent_refuses_a_controller_side_or_unknown_kind() -> None:
    for kind in ("freeze_rank", "melt_gpu"):
        with pytest.raises(InvalidFaultRequest) as caught:
            parse_request({"id": "a", "kind": kind, "rank": 0})
        field, message = caught.value.problems[0]
        allowed = message.split("(got")[0]
        assert field == "kind" and "'freeze_rank'" not in allowed and "'kill_rank'" in allowed
    assert set(AGENT_KINDS) == set(REGISTRY) - {"freeze_rank"}


def test_limits_are_the_same_on_both_sides() -> None:
    for definition in REQUESTED:
        assert definition.request is not None
        request = definition.request
        with pytest.raises(ValidationError):
            request.model_validate(
                {"id": "a", "kind": definition.kind, "ttl_seconds": MAX_TTL_SECONDS + 1}
            )
    for kind in ("kill_rank", "cpu_throttle", "trainer_fault"):
        with pytest.raises(ValidationError, match="less than or equal to 65535"):
            REGISTRY[kind].experiment.model_validate({"kind": kind, "rank": 65_536})


def test_a_cross_field_rule_is_one_declaration_for_both_sides() -> None:
    definition = REGISTRY["link_flap"]
    with pytest.raises(
        ValidationError, match="down_seconds\n  must be shorter than period_seconds"
    ):
        definition.experiment.model_validate(
            {"kind": "link_flap", "node": "n0", "period_seconds": 1, "down_seconds": 2}
        )
    with pytest.raises(InvalidFaultRequest) as raised:
        parse_request({"id": "a", "kind": "link_flap", "period_seconds": 1.0, "down_seconds": 2.0})
    assert raised.value.problems == (("down_seconds", "must be shorter than period_seconds"),)
    assert definition.checks == LinkFlapRequest.checks


def test_categories_come_from_the_traits() -> None:
    assert {
        d.kind: d.traits.category for d in KINDS if d.traits.category is not None
    } == FAULT_CATEGORIES
    assert category_of("kill_rank") == "software_bug" and category_of("kill_agent") is None
    assert category_of(None) is None and category_of("melt_gpu") is None
