"""RBAC stays least-privilege: each ServiceAccount is granted exactly the API calls its code makes.

The calls are read from the code, not listed here, so a new call (or one taken away) changes what
the manifests must grant:

- ``kubernetes_asyncio`` API methods (``client.CoreV1Api(...)``, ``AdmissionregistrationV1Api`` ...):
  every method of such a class that a module names, its HTTP method and path taken from the
  installed client itself (``<method>_with_http_info``), so ``create_namespaced_binding`` is a
  create of ``bindings`` and ``create_namespaced_pod_binding`` one of ``pods/binding``;
- a list method handed to ``kube.watch.list_and_watch`` is listed, then watched;
- raw requests (``ApiClient.call_api``) made through a helper called as ``helper("GET", path)``, the
  path an f-string or a property returning one.

A module's calls belong to every service whose entry point (``gpu_tailor/<service>/__main__.py``)
imports it, directly or not; the Deployments say which ServiceAccount runs which service
(``args[0]`` of a gpu-tailor container). The grants are the rules of the Roles and ClusterRoles in
manifests/ bound to that ServiceAccount. kube-scheduler shares the scheduler's ServiceAccount: the
bootstrap roles it is bound to (``system:kube-scheduler``, ``system:volume-scheduler``,
``extension-apiserver-authentication-reader``) are its own and left out, and its leader election on
a Lease of our namespace (client-go's LeaseLock: get, create, update) is added to what the extender
needs.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from gpu_tailor.gpumodel.report import GROUP as REPORT_GROUP
from gpu_tailor.gpumodel.report import PLURAL as REPORT_PLURAL

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpu_tailor"
MANIFESTS = ROOT / "manifests"
SERVICES = ("webhook", "extender", "agent")
HTTP = {"GET", "POST", "PUT", "PATCH", "DELETE"}
# roles the API server bootstraps, bound for kube-scheduler's own needs (not in manifests/)
KUBE_SCHEDULER_ROLES = {"system:kube-scheduler", "system:volume-scheduler", "extension-apiserver-authentication-reader"}


@dataclass(frozen=True, order=True)
class Access:
    group: str
    resource: str  # with its subresource: pods/binding
    verb: str

    def __str__(self) -> str:
        return f"{self.verb} {self.group or 'core'}/{self.resource}"


# ----- the calls, from the code -----
def modules() -> dict[str, Path]:
    """gpu_tailor's modules by dotted name."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The gpu_tailor modules ``name`` imports, at any level (imports inside functions too)."""
    out = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else ".".join([*name.split(".")[:-node.level], node.module])
            out |= {base} & known.keys()
            out |= {f"{base}.{a.name}" for a in node.names} & known.keys()
    # importing a.b.c runs a/__init__ and a/b/__init__ too
    return out | {m.rsplit(".", i)[0] for m in out for i in range(1, m.count(".") + 1)} & known.keys()


def reachable(entry: str) -> set[str]:
    known = modules()
    seen, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imports(name, known[name], known) - seen)
    return seen


def api_classes(module: ast.Module) -> list[type]:
    """The kubernetes_asyncio API classes a module instantiates (``client.CoreV1Api(api)``)."""
    names = {n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id
             for n in ast.walk(module) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute | ast.Name)}
    return [getattr(client, n) for n in sorted(names) if n.endswith("Api") and n != "ApiClient" and hasattr(client, n)]


@cache
def client_request(cls: type, method: str) -> tuple[str, str]:
    """(HTTP method, path template) of a kubernetes_asyncio API method, from the client's own source."""
    src = inspect.getsource(getattr(cls, f"{method}_with_http_info"))
    (found,) = set(re.findall(r"'(/apis?/[^']*)', '([A-Z]+)'", src))
    return found[1], found[0]


def resolve_list_fn(node: ast.expr, aliases: dict[str, ast.expr]) -> ast.expr:
    """What a name handed to list_and_watch stands for: the method itself, through functools.partial."""
    if isinstance(node, ast.Name) and node.id in aliases:
        node = aliases[node.id]
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("functools.partial", "partial") and node.args:
        node = node.args[0]
    return node


def template(node: ast.expr | None) -> str | None:
    """An f-string (or plain string) as a path template, its fields as ``{x}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{x}" for v in node.values)
    return None


def path_properties(module: ast.Module) -> dict[str, str]:
    """Methods and properties that just return a path template, by name."""
    out = {}
    for fn in ast.walk(module):
        if isinstance(fn, ast.FunctionDef) and len(fn.body) == 1 and isinstance(fn.body[0], ast.Return):
            t = template(fn.body[0].value)
            if t is not None and t.startswith("/api"):
                out[fn.name] = t
    return out


def raw_requests(module: ast.Module) -> Iterator[tuple[str, str]]:
    """(HTTP method, path template) of ``helper("GET", path, ...)`` calls."""
    props = path_properties(module)
    for node in ast.walk(module):
        if not (isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in HTTP):
            continue
        arg = node.args[1]
        path = template(arg) or (props.get(arg.attr) if isinstance(arg, ast.Attribute) else None)
        assert path is not None, f"line {node.lineno}: cannot tell which path {ast.unparse(arg)} is"
        yield node.args[0].value, path


def access(http: str, path: str, watched: bool = False) -> list[Access]:
    """What RBAC calls a request: /api/v1[/namespaces/{ns}]/RESOURCE[/{name}[/SUBRESOURCE]]. Discovery of a group
    version (``/apis/resource.k8s.io/v1/``) is no resource: the bootstrap role system:discovery grants it to all."""
    # custom objects (CustomObjectsApi): the project's one custom resource, the node agents' reports
    path = path.replace("{group}", REPORT_GROUP).replace("{plural}", REPORT_PLURAL)
    parts = [p for p in path.split("/") if p]
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if not rest:
        assert http == "GET", f"{path}: only discovery has no resource"
        return []
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection"}[http]
    out = [Access(group, resource, verb)]
    if watched:
        assert verb == "list", f"{path}: only a collection can be watched"
        out.append(Access(group, resource, "watch"))
    return out


def custom_sources(module: ast.Module) -> Iterator[tuple[str, str]]:
    """(API group, plural) of each ``SOURCES`` row of a module that lists and watches other projects' objects with
    ``CustomObjectsApi.list_cluster_custom_object`` (``kube/groupobjects.py``: rows of kind, group, version, plural,
    reader); such a module's other CustomObjectsApi calls are on the same rows."""
    if "list_cluster_custom_object" not in ast.unparse(module):
        return
    for node in ast.walk(module):
        target: ast.expr
        value: ast.expr | None
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "SOURCES" and isinstance(value, ast.Tuple):
            for row in value.elts:
                assert isinstance(row, ast.Tuple), f"line {row.lineno}: a SOURCES row is a tuple"
                group, plural = row.elts[1], row.elts[3]
                assert isinstance(group, ast.Constant) and isinstance(plural, ast.Constant)
                yield str(group.value), str(plural.value)


def module_calls(path: Path) -> set[Access]:
    module = tree(path)
    out: set[Access] = set()
    classes = api_classes(module)
    methods = {m: cls for cls in classes for m, _ in inspect.getmembers(cls, inspect.isfunction)
               if not m.startswith("_") and not m.endswith("_with_http_info") and m != "api_client"}
    aliases = {t.id: n.value for n in ast.walk(module) if isinstance(n, ast.Assign)
               for t in n.targets if isinstance(t, ast.Name)}
    sources = list(custom_sources(module))
    if sources:  # its CustomObjectsApi calls are on its SOURCES rows, not on the project's own reports
        custom = {m for m, cls in methods.items() if cls is client.CustomObjectsApi}
        for group, plural in sources:
            out.update(Access(group, plural, verb) for verb in ("list", "watch"))
            if any(isinstance(n, ast.Attribute) and n.attr == "get_namespaced_custom_object" for n in ast.walk(module)):
                out.add(Access(group, plural, "get"))
        methods = {m: cls for m, cls in methods.items() if m not in custom}
    watched = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("list_and_watch") and node.args:
            fn = resolve_list_fn(node.args[0], aliases)
            if isinstance(fn, ast.Attribute):
                watched.add(fn.attr)
    for node in ast.walk(module):
        if isinstance(node, ast.Attribute) and node.attr in methods:
            http, api_path = client_request(methods[node.attr], node.attr)
            out.update(access(http, api_path, watched=node.attr in watched))
    for http, api_path in raw_requests(module):
        out.update(access(http, api_path))
    if "call_api" in path.read_text():
        assert out, f"{path}: makes raw API requests this test cannot see"
    return out


def service_calls(service: str) -> set[Access]:
    known = modules()
    return set().union(*(module_calls(known[m]) for m in reachable(f"gpu_tailor.{service}.__main__")))


# ----- the grants, from the manifests -----
def manifests() -> list[dict[str, Any]]:
    return [d for f in sorted(MANIFESTS.glob("*/*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text()) if d and "overlays" not in f.parts]


def service_accounts() -> dict[str, str]:
    """The gpu-tailor service each ServiceAccount runs, from the Deployments and DaemonSets (``args[0]``)."""
    out = {}
    for d in manifests():
        if d["kind"] not in ("Deployment", "DaemonSet"):
            continue
        spec = d["spec"]["template"]["spec"]
        for c in spec["containers"]:
            if c.get("args", [""])[0] in SERVICES:
                assert spec["serviceAccountName"] not in out, "two services share a ServiceAccount"
                out[spec["serviceAccountName"]] = c["args"][0]
    return out


@dataclass(frozen=True)
class Grant:
    access: Access
    namespace: str | None  # None: cluster-wide (a ClusterRole through a ClusterRoleBinding)
    names: tuple[str, ...]  # resourceNames; () for any


def grants(account: str) -> tuple[set[Grant], set[str]]:
    """The rules bound to ``account`` in manifests/, and the roles it is bound to that manifests/ lacks."""
    docs = manifests()
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out: set[Grant] = set()
    outside: set[str] = set()
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"]):
            continue
        ref = b["roleRef"]
        namespace = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        role = roles.get((ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"]))
        if role is None:
            outside.add(ref["name"])
            continue
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.add(Grant(Access(group, resource, verb), namespace, tuple(rule.get("resourceNames", ()))))
    return out, outside


def scheduler_config() -> dict[str, Any]:
    (cm,) = [d for d in manifests() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpu-tailor-scheduler"]
    config: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return config


def kube_scheduler_extra() -> set[Access]:
    """kube-scheduler's needs that the bootstrap roles do not cover: leader election on its own Lease."""
    election = scheduler_config()["leaderElection"]
    assert election["leaderElect"] and election["resourceNamespace"] == "gpu-tailor"
    return {Access("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}


# ----- the comparison -----
def test_the_calls_are_found() -> None:
    """The finder sees the calls the code is known to make (a finder that sees nothing passes nothing)."""
    assert Access("", "bindings", "create") in service_calls("extender")
    assert Access("", "nodes", "watch") in service_calls("webhook")
    assert Access("gpu-tailor.io", "nodegpureports", "update") in service_calls("agent")
    assert access("POST", "/api/v1/namespaces/{namespace}/pods/{name}/binding") == [Access("", "pods/binding",
                                                                                           "create")]
    assert access("GET", "/api/v1/pods", watched=True) == [Access("", "pods", "list"), Access("", "pods", "watch")]


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_account_is_granted_exactly_what_its_code_calls(service: str) -> None:
    (account,) = [a for a, s in service_accounts().items() if s == service]
    granted, outside = grants(account)
    needed = service_calls(service)
    if service == "extender":  # kube-scheduler runs beside it, under the same ServiceAccount
        assert outside == KUBE_SCHEDULER_ROLES
        needed |= kube_scheduler_extra()
    else:
        assert outside == set()
    have = {g.access for g in granted}
    assert not needed - have, f"{account} lacks: {sorted(map(str, needed - have))}"
    extra = have - needed
    assert not extra, \
        f"{account} is granted what no code of {service} calls: {sorted(map(str, extra))}"


def test_grants_limited_to_a_name_or_namespace_cover_the_ones_the_deployments_use() -> None:
    """The webhook's Secret and MutatingWebhookConfiguration grants name one object each: the ones its
    Deployment points it at (``--certs-secret NS/NAME``, ``--webhook-config``, default gpu-tailor)."""
    (deployment,) = [d for d in manifests() if d["kind"] == "Deployment"
                     and d["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-tailor-webhook"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    namespace, secret = args[args.index("--certs-secret") + 1].split("/")
    config = args[args.index("--webhook-config") + 1] if "--webhook-config" in args else "gpu-tailor"
    granted, _ = grants("gpu-tailor-webhook")
    for g in granted:
        if g.access.resource == "secrets":
            assert g.namespace == namespace and g.names in ((secret,), ()), g
            assert g.names or g.access.verb == "create", f"{g}: only create cannot name its object"
        if g.access.resource == "mutatingwebhookconfigurations":
            assert g.names == (config,), g
    lease = [g for g in grants("gpu-tailor-scheduler")[0] if g.access.resource == "leases"]
    assert lease and {g.namespace for g in lease} == {scheduler_config()["leaderElection"]["resourceNamespace"]}


def test_the_cert_manager_overlay_takes_away_exactly_the_grants_of_the_certificate_keeper() -> None:
    """With cert-manager the webhook runs with --tls-cert, so gpu_tailor.kube.certkeeper (the only code
    that touches Secrets and the caBundle) never runs: the roles the overlay deletes must grant exactly
    its calls, and what stays must still cover the webhook's other calls."""
    overlay = yaml.safe_load((MANIFESTS / "overlays" / "cert-manager" / "kustomization.yaml").read_text())
    deleted = {(p["kind"], p["metadata"]["name"]) for p in
               (yaml.safe_load(x["patch"]) for x in overlay["patches"] if "target" not in x)
               if p.get("$patch") == "delete"}
    roles = {(d["kind"], d["metadata"]["name"]): d for d in manifests() if d["kind"] in ("Role", "ClusterRole")}
    taken = {Access(g, r, v) for key in deleted if key in roles for rule in roles[key]["rules"]
             for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    keeper = module_calls(modules()["gpu_tailor.kube.certkeeper"])
    assert taken == keeper
    bindings = {(d["kind"], d["metadata"]["name"]) for d in manifests() if d["kind"].endswith("Binding")
                and d["roleRef"]["name"] in {name for _, name in deleted & roles.keys()}}
    assert bindings <= deleted, "a binding left pointing at a deleted role"
    assert service_calls("webhook") - keeper <= {g.access for g in grants("gpu-tailor-webhook")[0]} - taken
