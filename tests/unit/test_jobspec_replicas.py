"""The spec's replica keys: ``training.replicas`` (int or "auto"), ``training.sync`` and ``[training.diloco]``,
checked field by field with one-line problems, round-tripped, and absent from the hash of a spec without them."""

from __future__ import annotations

from typing import Any

import pytest

from arceusd.jobs.spec.parsed import DiLoCoSpec
from arceusd.jobs.spec.schema import JobSpecError, parse_spec, spec_from_dict, spec_hash, to_dict
from tests.unit.test_jobspec import ROOT, mnist_doc


def doc(**training: Any) -> dict[str, Any]:
    d = mnist_doc()
    d["training"] = {"steps": 1000, "batch_size": 64, "micro_batches": 4, "optimizer": "sgd", "lr": 0.1, **training}
    return d


def parse(d: dict[str, Any]) -> Any:
    return parse_spec(d, base_dir=ROOT, check_files=False)


def test_defaults_are_one_pipeline_and_keep_the_hash() -> None:
    spec = parse(doc())
    t = spec.training
    assert (t.replicas, t.sync, t.diloco) == (1, "auto", DiLoCoSpec(500, 0.7, 0.9, "int8"))
    assert not {"replicas", "sync", "diloco"} & set(to_dict(spec)["training"])


@pytest.mark.parametrize(
    "training",
    [
        {"replicas": "auto"},
        {"replicas": 4, "sync": "every_step"},
        {
            "replicas": 2,
            "sync": "diloco",
            "diloco": {"inner_steps": 50, "outer_lr": 0.5, "outer_momentum": 0.8, "compression": "fp16"},
        },
        {"replicas": "auto", "diloco": {"inner_steps": 100}},
    ],
)
def test_replica_keys_are_read_and_round_trip(training: dict[str, Any]) -> None:
    spec = parse(doc(**training))
    back = spec_from_dict(to_dict(spec))
    assert back.training == spec.training and spec_hash(back) == spec_hash(spec)
    assert spec_hash(spec) != spec_hash(parse(doc()))
    assert spec.training.replicas == training["replicas"]
    if "diloco" in training:
        assert spec.training.diloco.inner_steps == training["diloco"]["inner_steps"]


@pytest.mark.parametrize(
    ("training", "path", "words"),
    [
        ({"replicas": 0}, "training.replicas", "<= 256"),
        ({"replicas": "many"}, "training.replicas", "'auto'"),
        ({"replicas": 3}, "training.replicas", "multiple of 12"),
        ({"sync": "sometimes"}, "training.sync", "'every_step'"),
        ({"sync": "diloco"}, "training.sync", "needs training.replicas >= 2"),
        ({"replicas": 2, "sync": "every_step", "diloco": {"inner_steps": 5}}, "training.diloco", "applies only"),
        ({"replicas": 2, "diloco": {"inner_steps": 0}}, "training.diloco.inner_steps", ">= 1"),
        ({"replicas": 2, "diloco": {"inner_steps": 5000}}, "training.diloco.inner_steps", "never sync"),
        ({"replicas": 2, "diloco": {"outer_momentum": 1.0}}, "training.diloco.outer_momentum", "must be"),
        ({"replicas": 2, "diloco": {"outer_lr": 0}}, "training.diloco.outer_lr", "must be"),
        ({"replicas": 2, "diloco": {"compression": "topk"}}, "training.diloco.compression", "'int8'"),
        ({"replicas": 2, "diloco": {"h": 5}}, "training.diloco.h", "unknown key"),
        ({"replicas": 2, "diloco": 5}, "training.diloco", "must be a table"),
    ],
)
def test_bad_replica_keys_name_their_field_in_one_line(training: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(JobSpecError) as err:
        parse(doc(**training))
    assert err.value.paths() == [path]
    (problem,) = err.value.problems
    assert words in problem.message and "\n" not in str(problem)
