"""``docs/reference.md`` names every name gpu-tailor reads or writes and every configuration key, and each value the
annotations take; the pods in ``examples/`` are admitted, rewritten and placed on the fixture cluster as their
comments say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from gpu_tailor.extender.__main__ import Settings
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.ask import Isolation, Topology
from gpu_tailor.tools.explain import explain
from gpu_tailor.webhook.config import AdmissionPolicy
from tests.examples import Example, examples
from tests.tools.builders import fixture_cluster

REPO = Path(__file__).resolve().parents[1]
REFERENCE = (REPO / "docs" / "reference.md").read_text()
EXAMPLES = examples()


def keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        inner = f.annotation
        args = getattr(inner, "__args__", ())
        nested = next((a for a in (inner, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if nested is not None and (inner is nested or args):
            sub = f"{prefix}{name}[]." if args else f"{prefix}{name}."
            out += [f"{prefix}{name}", *keys(nested, sub)] if args else keys(nested, sub)
        else:
            out.append(f"{prefix}{name}")
    return out


def test_every_name_of_gpu_tailor_is_documented() -> None:
    names = {v for k, v in vars(labels).items()
             if k.isupper() and isinstance(v, str) and v.startswith("gpu-tailor.io/")}
    assert len(names) >= 14
    missing = sorted(n for n in names if f"`{n}`" not in REFERENCE)
    assert not missing, f"docs/reference.md does not name {missing}"
    for value in (*Isolation, *Topology):
        assert f"`{value.value}`" in REFERENCE, value


@pytest.mark.parametrize(("model", "heading"), [(AdmissionPolicy, "## The webhook's `--config`"),
                                                (Settings, "## The extender's `--config`")])
def test_every_configuration_key_is_documented(model: type[BaseModel], heading: str) -> None:
    section = REFERENCE.split(heading, 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([^`]+)` \|", section, re.M))
    assert set(keys(model)) == documented


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_each_example_is_admitted_rewritten_and_placed_as_its_comment_says(example: Example) -> None:
    assert example.path.read_text().startswith("#"), f"{example.path.name}: say what it asks for in a comment"
    becomes = example.becomes.get("fixture nodes")
    assert becomes, f"{example.path.name}: say what it becomes on the fixture nodes (tests/examples.py)"
    pod = example.pod()
    pod["metadata"]["namespace"] = "team-a"
    cluster = fixture_cluster(namespaces={"team-a": {labels.NAMESPACE_OPT_IN_LABEL: "true"}})
    said = explain(pod, example.path.name, cluster, AdmissionPolicy())
    assert said.admission.allowed and said.admission.outcome == "mutated", said.admission
    becomes.check(said.stored, example.path.name)
    assert said.chosen in becomes.nodes, f"{example.path.name}: placed on {said.chosen}, not {becomes.nodes}"
