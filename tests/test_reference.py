"""The docs name what the code reads and writes, and nothing else: ``docs/reference.md`` every ``gpu-tailor.io/`` name
and each value the annotations take, ``docs/user-guide.md`` every name a user writes on a pod,
``docs/configuration.md`` exactly the configuration keys; no page names a ``gpu-tailor.io/`` name the code does not
know. The pods in ``examples/`` are admitted, rewritten and placed on the fixture cluster as their comments say."""

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
DOCS = REPO / "docs"
REFERENCE = (DOCS / "reference.md").read_text()
USER_GUIDE = (DOCS / "user-guide.md").read_text()
CONFIGURATION = (DOCS / "configuration.md").read_text()
PAGES = {p.relative_to(REPO).as_posix(): p.read_text() for p in (REPO / "README.md", *sorted(DOCS.glob("*.md")))}
# what a user writes on a pod: the portable resources, the pod annotations and the opt-out label
USER_NAMES = (*labels.VIRTUAL_RESOURCES, labels.ANN_ISOLATION, labels.ANN_GPU_PRODUCT, labels.ANN_TOPOLOGY,
              labels.POD_OPT_OUT_LABEL)
# gpu-tailor.io/<x> strings that are no label, annotation or resource name: the CRD's API version
NOT_NAMES = {"gpu-tailor.io/v1alpha1"}
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


def code_names() -> set[str]:
    return {v for k, v in vars(labels).items()
            if k.isupper() and isinstance(v, str) and v.startswith("gpu-tailor.io/")}


def test_every_name_of_gpu_tailor_is_documented() -> None:
    names = code_names()
    assert len(names) >= 14
    missing = sorted(n for n in names if f"`{n}`" not in REFERENCE)
    assert not missing, f"docs/reference.md does not name {missing}"
    for value in (*Isolation, *Topology):
        assert f"`{value.value}`" in REFERENCE, value
        assert f"`{value.value}`" in USER_GUIDE, value


def test_every_name_a_user_writes_is_in_the_user_guide() -> None:
    missing = sorted(n for n in USER_NAMES if n not in USER_GUIDE)
    assert not missing, f"docs/user-guide.md does not show {missing}"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_no_page_names_an_unknown_name(page: str) -> None:
    named = set(re.findall(r"gpu-tailor\.io/[a-z0-9][a-z0-9.-]*[a-z0-9]", PAGES[page]))
    unknown = sorted(named - code_names() - NOT_NAMES)
    assert not unknown, f"{page} names {unknown}, which gpu_tailor/gpumodel/labels.py does not define"


@pytest.mark.parametrize(("model", "heading"), [(AdmissionPolicy, "## The webhook's `--config`"),
                                                (Settings, "## The extender's `--config`")])
def test_every_configuration_key_is_documented(model: type[BaseModel], heading: str) -> None:
    section = CONFIGURATION.split(heading, 1)[1].split("\n## ", 1)[0]
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
