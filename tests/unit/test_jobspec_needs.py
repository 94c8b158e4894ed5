"""The spec's optional [needs] section: read, checked field by field, round-tripped, and absent from the hash
of a spec that states none."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from arceusd.jobs.spec.parsed import NeedsSpec
from arceusd.jobs.spec.schema import JobSpecError, parse_spec, spec_from_dict, spec_hash, to_dict
from tests.unit.test_jobspec import ROOT, mnist_doc


def parse(doc: dict[str, Any]) -> Any:
    return parse_spec(doc, base_dir=ROOT, check_files=False)


def test_no_needs_is_the_default_and_keeps_the_hash() -> None:
    spec = parse(mnist_doc())
    assert spec.needs == NeedsSpec()
    assert "needs" not in to_dict(spec)


def test_needs_are_read_and_round_trip() -> None:
    doc = mnist_doc()
    doc["needs"] = {
        "memory_total_mib": 4096,
        "memory_per_device_mib": 512,
        "device_kinds": ["mps", "cpu"],
        "min_members": 2,
        "max_members": 4,
        "deadline_hours": 1.5,
        "max_price_per_hour": 0.2,
        "budget_usd": 3,
    }
    spec = parse(doc)
    assert spec.needs == NeedsSpec(4096, 512, ("cpu", "mps"), 2, 4, 1.5, 0.2, 3.0)
    back = spec_from_dict(to_dict(spec))
    assert back.needs == spec.needs and spec_hash(back) == spec_hash(spec)
    assert spec_hash(spec) != spec_hash(parse(mnist_doc()))


@pytest.mark.parametrize(
    "needs, path",
    [
        ({"memory_total_mib": -1}, "needs.memory_total_mib"),
        ({"min_members": 0}, "needs.min_members"),
        ({"min_members": 3, "max_members": 2}, "needs.max_members"),
        ({"device_kinds": ["tpu"]}, "needs.device_kinds"),
        ({"device_kinds": "cpu"}, "needs.device_kinds"),
        ({"max_price_per_hour": "cheap"}, "needs.max_price_per_hour"),
        ({"deadline_hours": -2}, "needs.deadline_hours"),
        ({"budget": 5}, "needs.budget"),
    ],
)
def test_bad_needs_name_their_field(needs: dict[str, Any], path: str) -> None:
    doc = copy.deepcopy(mnist_doc())
    doc["needs"] = needs
    with pytest.raises(JobSpecError) as err:
        parse(doc)
    assert path in err.value.paths()
