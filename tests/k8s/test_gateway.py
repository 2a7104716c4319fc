"""trident k8s --inference-pool, the objects around the pool: an InferenceObjective per
tenant tier of the spec (GIE v1.5.0's inference.networking.x-k8s.io/v1alpha2), and with
--gateway-class a Gateway and an HTTPRoute to the pool (Gateway API v1, standard channel,
release GATEWAY_API_VERSION below). Each is validated against the upstream CRD kept in
tests/k8s/crds/ (its openAPIV3Schema with jsonschema, unknown fields refused, the schema's
defaults applied, and every CEL rule that applies to a rendered field, as Python), and
wired to the pool it names; bad input is refused in one line with exit 2."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import jsonschema
import pytest
import yaml

from builder.k8s import names, pool
from builder.spec.tenants import TIERS
from tests.helpers import hostile_specs as hs
from tests.k8s.test_access import refused, render, tenants, write_spec
from tests.k8s.test_inference_pool import (
    CUSTOM_KINDS,
    H100X8,
    MULTINODE,
    _defaulted,
    _rules,
    _server_and_spanning,
    _strict,
    kinds,
    one,
    validate_core,
    validate_custom,
)

CRDS = Path(__file__).resolve().parent / "crds"
GIE_COMMIT = "df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849"
GATEWAY_API_VERSION = "v1.5.1"
GATEWAY_API_COMMIT = "e7677b70ae75d14a4448fba94870e7deea6cf0ad"
# kind -> (CRD file, the served version rendered, the source's commit, its release)
CRD_FILES = {
    "InferenceObjective": (
        "inference.networking.x-k8s.io_inferenceobjectives.yaml",
        "v1alpha2",
        GIE_COMMIT,
        names.GIE_VERSION,
    ),
    "Gateway": (
        "gateway.networking.k8s.io_gateways.yaml",
        "v1",
        GATEWAY_API_COMMIT,
        GATEWAY_API_VERSION,
    ),
    "HTTPRoute": (
        "gateway.networking.k8s.io_httproutes.yaml",
        "v1",
        GATEWAY_API_COMMIT,
        GATEWAY_API_VERSION,
    ),
}
NEW_KINDS = set(CRD_FILES)


def _crd(kind: str) -> dict:
    return yaml.safe_load((CRDS / CRD_FILES[kind][0]).read_text())


def _schema(kind: str) -> dict:
    crd = _crd(kind)
    version = CRD_FILES[kind][1]
    return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"][
        "openAPIV3Schema"
    ]


# ---------------------------------------------------------------------------------------
# The CEL rules, as Python: only the ones on a field trident renders (a rule whose field
# is absent from every rendered object cannot fail). Keyed by kind, the rule's path and
# its message (unique per path: test_cel_keys_name_one_rule_each); a rendered object on
# whose fields a rule applies that is not here fails validate_crd until it is added.


def _has(obj: dict, key: str) -> bool:
    return key in obj


def _unset(obj: dict, key: str) -> bool:
    return obj.get(key, "") == ""


def _same_parent(p1: dict, p2: dict) -> bool:
    both_default = _unset(p1, "namespace") and _unset(p2, "namespace")
    both_same = (
        _has(p1, "namespace") and _has(p2, "namespace") and p1["namespace"] == p2["namespace"]
    )
    return (
        p1["group"] == p2["group"]
        and p1["kind"] == p2["kind"]
        and p1["name"] == p2["name"]
        and (both_default or both_same)
    )


def _same_section(p1: dict, p2: dict) -> bool:
    unset = _unset(p1, "sectionName") and _unset(p2, "sectionName")
    both = (
        _has(p1, "sectionName")
        and _has(p2, "sectionName")
        and p1["sectionName"] == p2["sectionName"]
    )
    return unset or both


def _exists_one(items: list, test: Callable[[dict], bool]) -> bool:
    return sum(1 for item in items if test(item)) == 1


def _prefix_rewrite(filters: list, kind: str) -> bool:
    return _exists_one(
        filters,
        lambda f: (
            _has(f, kind)
            and _has(f[kind], "path")
            and f[kind]["path"]["type"] == "ReplacePrefixMatch"
            and _has(f[kind]["path"], "replacePrefixMatch")
        ),
    )


def _one_prefix_match(rule: dict) -> bool:
    matches = rule["matches"]
    return (
        len(matches) == 1
        and _has(matches[0], "path")
        and matches[0]["path"]["type"] == "PathPrefix"
    )


def _backend_rewrite(rule: dict, kind: str) -> bool:
    return _has(rule, "backendRefs") and _exists_one(
        rule["backendRefs"], lambda b: _has(b, "filters") and _prefix_rewrite(b["filters"], kind)
    )


_DURATION = re.compile(r"([0-9]{1,5})(h|ms|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def _duration_s(text: str) -> float:
    parts = _DURATION.findall(text)
    assert "".join(n + u for n, u in parts) == text, text
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


_PATH_CHARS = re.compile(r"^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$")


def _plain(path: dict) -> bool:
    return path["type"] in ("Exact", "PathPrefix")


LISTENERS = ("spec", "listeners")
PARENTS = ("spec", "parentRefs")
RULES = ("spec", "rules")
RULE = ("spec", "rules", "[]")
BACKEND = ("spec", "rules", "[]", "backendRefs", "[]")
PATH = ("spec", "rules", "[]", "matches", "[]", "path")
TIMEOUTS = ("spec", "rules", "[]", "timeouts")
CEL: dict[tuple[str, tuple, str], Callable] = {
    ("Gateway", LISTENERS, "tls must not be specified for protocols ['HTTP', 'TCP', 'UDP']"): (
        lambda ls: all(not _has(li, "tls") for li in ls if li["protocol"] in ("HTTP", "TCP", "UDP"))
    ),
    ("Gateway", LISTENERS, "tls mode must be Terminate for protocol HTTPS"): lambda ls: all(
        li["tls"].get("mode") in ("", "Terminate")
        for li in ls
        if li["protocol"] == "HTTPS" and _has(li, "tls")
    ),
    ("Gateway", LISTENERS, "tls mode must be set for protocol TLS"): lambda ls: all(
        _has(li, "tls") and li["tls"].get("mode", "") != "" for li in ls if li["protocol"] == "TLS"
    ),
    ("Gateway", LISTENERS, "hostname must not be specified for protocols ['TCP', 'UDP']"): (
        lambda ls: all(_unset(li, "hostname") for li in ls if li["protocol"] in ("TCP", "UDP"))
    ),
    ("Gateway", LISTENERS, "Listener name must be unique within the Gateway"): lambda ls: all(
        _exists_one(ls, lambda l2, l1=l1: l1["name"] == l2["name"]) for l1 in ls
    ),
    (
        "Gateway",
        LISTENERS,
        "Combination of port, protocol and hostname must be unique for each listener",
    ): lambda ls: all(
        _exists_one(
            ls,
            lambda l2, l1=l1: (
                l1["port"] == l2["port"]
                and l1["protocol"] == l2["protocol"]
                and (
                    l1["hostname"] == l2["hostname"]
                    if _has(l1, "hostname") and _has(l2, "hostname")
                    else not _has(l1, "hostname") and not _has(l2, "hostname")
                )
            ),
        )
        for l1 in ls
    ),
    (
        "HTTPRoute",
        PARENTS,
        "sectionName must be specified when parentRefs includes 2 or more references to "
        "the same parent",
    ): lambda ps: all(
        _unset(p1, "sectionName") == _unset(p2, "sectionName")
        for p1 in ps
        for p2 in ps
        if _same_parent(p1, p2)
    ),
    (
        "HTTPRoute",
        PARENTS,
        "sectionName must be unique when parentRefs includes 2 or more references to the "
        "same parent",
    ): lambda ps: all(
        _exists_one(ps, lambda p2, p1=p1: _same_parent(p1, p2) and _same_section(p1, p2))
        for p1 in ps
    ),
    (
        "HTTPRoute",
        RULES,
        "While 16 rules and 64 matches per rule are allowed, the total number of matches "
        "across all rules in a route must be less than 128",
    ): lambda rules: sum(len(r["matches"]) for r in rules[:16]) <= 128,
    ("HTTPRoute", RULE, "RequestRedirect filter must not be used together with backendRefs"): (
        lambda r: (
            not (_has(r, "backendRefs") and r["backendRefs"])
            or all(not _has(f, "requestRedirect") for f in r.get("filters", []))
        )
    ),
    (
        "HTTPRoute",
        RULE,
        "When using RequestRedirect filter with path.replacePrefixMatch, exactly one "
        "PathPrefix match must be specified",
    ): lambda r: (
        not (_has(r, "filters") and _prefix_rewrite(r["filters"], "requestRedirect"))
        or _one_prefix_match(r)
    ),
    (
        "HTTPRoute",
        RULE,
        "When using URLRewrite filter with path.replacePrefixMatch, exactly one PathPrefix "
        "match must be specified",
    ): lambda r: (
        not (_has(r, "filters") and _prefix_rewrite(r["filters"], "urlRewrite"))
        or _one_prefix_match(r)
    ),
    (
        "HTTPRoute",
        RULE,
        "Within backendRefs, when using RequestRedirect filter with path.replacePrefixMatch, "
        "exactly one PathPrefix match must be specified",
    ): lambda r: not _backend_rewrite(r, "requestRedirect") or _one_prefix_match(r),
    (
        "HTTPRoute",
        RULE,
        "Within backendRefs, When using URLRewrite filter with path.replacePrefixMatch, "
        "exactly one PathPrefix match must be specified",
    ): lambda r: not _backend_rewrite(r, "urlRewrite") or _one_prefix_match(r),
    ("HTTPRoute", BACKEND, "Must have port for Service reference"): lambda b: (
        not (b["group"] == "" and b["kind"] == "Service") or _has(b, "port")
    ),
    (
        "HTTPRoute",
        PATH,
        "value must be an absolute path and start with '/' when type one of ['Exact', "
        "'PathPrefix']",
    ): lambda p: not _plain(p) or p["value"].startswith("/"),
    **{
        (
            "HTTPRoute",
            PATH,
            f"must not contain '{bad}' when type one of ['Exact', 'PathPrefix']",
        ): lambda p, bad=bad: not _plain(p) or bad not in p["value"]
        for bad in ("//", "/./", "/../", "%2f", "%2F", "#")
    },
    **{
        (
            "HTTPRoute",
            PATH,
            f"must not end with '{end}' when type one of ['Exact', 'PathPrefix']",
        ): lambda p, end=end: not _plain(p) or not p["value"].endswith(end)
        for end in ("/..", "/.")
    },
    ("HTTPRoute", PATH, "type must be one of ['Exact', 'PathPrefix', 'RegularExpression']"): (
        lambda p: p["type"] in ("Exact", "PathPrefix", "RegularExpression")
    ),
    (
        "HTTPRoute",
        PATH,
        "must only contain valid characters (matching "
        "^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$) for types ['Exact', "
        "'PathPrefix']",
    ): lambda p: not _plain(p) or bool(_PATH_CHARS.match(p["value"])),
    ("HTTPRoute", TIMEOUTS, "backendRequest timeout cannot be longer than request timeout"): (
        lambda t: (
            not (
                _has(t, "request")
                and _has(t, "backendRequest")
                and _duration_s(t["request"]) != 0
                and _duration_s(t["backendRequest"]) > _duration_s(t["request"])
            )
        )
    ),
}


def _cel_rules(kind: str) -> list[tuple[tuple, str, str]]:
    """(path, rule, message) of every CEL rule of the kind's schema."""
    found = []

    def walk(schema: dict, path: tuple) -> None:
        for rule in schema.get("x-kubernetes-validations", []):
            found.append((path, rule["rule"], rule.get("message", rule["rule"])))
        for key, sub in schema.get("properties", {}).items():
            walk(sub, (*path, key))
        if "items" in schema:
            walk(schema["items"], (*path, "[]"))

    walk(_schema(kind), ())
    assert len(found) == len(_rules(_schema(kind)))
    return found


def _values(value, path: tuple) -> Iterator:
    """Every value at `path` ("[]": each item of a list)."""
    if not path:
        yield value
        return
    key, rest = path[0], path[1:]
    if key == "[]":
        for item in value if isinstance(value, list) else ():
            yield from _values(item, rest)
    elif isinstance(value, dict) and key in value:
        yield from _values(value[key], rest)


def validate_crd(doc: dict) -> int:
    """Raises when `doc` is not valid against its kind's kept CRD; how many CEL rules it
    was checked against."""
    kind = doc["kind"]
    crd = _crd(kind)
    assert doc["apiVersion"] == f"{crd['spec']['group']}/{CRD_FILES[kind][1]}"
    schema = _schema(kind)
    stored = _defaulted(doc, schema)
    jsonschema.Draft7Validator(_strict(schema)).validate(stored)
    name = doc["metadata"]["name"]
    assert len(name) <= 253 and names._SUBDOMAIN.fullmatch(name), name
    checked = 0
    for path, rule, message in _cel_rules(kind):
        present = list(_values(stored, path))
        if not present:
            continue
        check = CEL.get((kind, path, message))
        assert check is not None, f"{kind} {'.'.join(path)}: no Python for CEL {rule}"
        for value in present:
            if not check(value):
                raise jsonschema.ValidationError(f"{kind} {'.'.join(path)}: {message}")
        checked += 1
    return checked


# ---------------------------------------------------------------------------------------
# The kept CRDs


@pytest.mark.parametrize("kind", sorted(CRD_FILES))
def test_the_crd_files_are_the_upstream_ones_with_their_source(kind):
    file, version, commit, release = CRD_FILES[kind]
    text = (CRDS / file).read_text()
    header = text.split("apiVersion:", 1)[0]
    assert commit in header and release in header and "Apache License, Version 2.0" in header
    crd = _crd(kind)
    assert crd["spec"]["names"]["kind"] == kind
    annotations = crd["metadata"]["annotations"]
    bundle = next(v for k, v in annotations.items() if k.endswith("/bundle-version"))
    assert bundle == release
    assert version in [v["name"] for v in crd["spec"]["versions"]]


def test_the_rendered_api_versions_are_the_kept_crds():
    assert pool.OBJECTIVE_API == "inference.networking.x-k8s.io/v1alpha2"
    assert pool.GATEWAY_API == "gateway.networking.k8s.io/v1"
    assert pool.OBJECTIVE_HEADER == "x-gateway-inference-objective"  # GIE v1.5.0 reads
    for kind, api in (
        ("InferenceObjective", pool.OBJECTIVE_API),
        ("Gateway", pool.GATEWAY_API),
        ("HTTPRoute", pool.GATEWAY_API),
    ):
        crd = _crd(kind)
        assert f"{crd['spec']['group']}/{CRD_FILES[kind][1]}" == api


@pytest.mark.parametrize("kind", sorted(CRD_FILES))
def test_cel_keys_name_one_rule_each(kind):
    """A (path, message) pair identifies one rule, so the table above cannot check the
    wrong one; and every key of the table is a rule of the kept CRD."""
    keys = [(path, message) for path, _rule, message in _cel_rules(kind)]
    assert len(keys) == len(set(keys))
    ours = {(path, message) for k, path, message in CEL if k == kind}
    assert ours <= set(keys), ours - set(keys)


# ---------------------------------------------------------------------------------------
# Rendering


TENANTS = tenants(limits={"alice": {"tier": "premium"}, "bob": {"tier": "batch"}})


@pytest.fixture(scope="module")
def h100(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("gateway")
    spec = write_spec(folder, H100X8, tenants=TENANTS)
    return render(
        spec,
        folder / "out",
        "--inference-pool",
        "--gateway-class",
        "istio",
        "--namespace",
        "llm",
    )


@pytest.fixture(scope="module")
def multinode(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("gateway")
    return render(MULTINODE, folder / "out", "--inference-pool", "--gateway-class", "eg")


@pytest.mark.parametrize("example", ["h100", "multinode"])
def test_every_object_validates(example, request):
    docs = request.getfixturevalue(example)
    rendered = {d["kind"] for d in docs}
    assert {"Gateway", "HTTPRoute", "InferencePool"} <= rendered
    assert ("InferenceObjective" in rendered) == (example == "h100")  # tenants: h100 only
    cel = 0
    for doc in docs:
        if doc["kind"] in NEW_KINDS:
            cel += validate_crd(doc)
        elif doc["kind"] == "InferencePool":
            validate_custom(doc)
        elif doc["kind"] not in CUSTOM_KINDS:
            validate_core(doc)
    assert cel >= 6 + 6  # the Gateway's listeners; the HTTPRoute's parents, rules, paths


def test_one_objective_per_tier_with_its_priority(h100):
    infpool = one(h100, "InferencePool")
    name = infpool["metadata"]["name"]
    objectives = kinds(h100, "InferenceObjective")
    # alice premium, bob batch, everyone else the default's standard; most important first
    assert [(o["metadata"]["name"], o["spec"]["priority"]) for o in objectives] == [
        (f"{name}-premium", 1),
        (f"{name}-standard", 0),
        (f"{name}-batch", -1),
    ]
    for objective in objectives:
        # The picker keeps an objective whose poolRef's name and group are its pool's.
        assert objective["spec"]["poolRef"] == {
            "group": "inference.networking.k8s.io",
            "kind": "InferencePool",
            "name": name,
        }
        assert objective["metadata"]["namespace"] == infpool["metadata"]["namespace"]
    # ... and its Role lets it watch them.
    role = one(h100, "Role")
    assert any(
        "inferenceobjectives" in rule["resources"]
        and rule["apiGroups"] == ["inference.networking.x-k8s.io"]
        and {"get", "list", "watch"} <= set(rule["verbs"])
        for rule in role["rules"]
    )


def test_priorities_follow_the_tiers():
    """The router's order (TIERS: lower first) and the picker's (higher first) agree;
    standard is the picker's default 0, batch alone is sheddable (negative)."""
    assert set(pool.OBJECTIVE_PRIORITY) == set(TIERS)
    by_router = sorted(TIERS, key=TIERS.__getitem__)
    by_picker = sorted(pool.OBJECTIVE_PRIORITY, key=lambda t: -pool.OBJECTIVE_PRIORITY[t])
    assert by_router == by_picker
    assert pool.OBJECTIVE_PRIORITY["standard"] == 0
    assert [t for t, p in pool.OBJECTIVE_PRIORITY.items() if p < 0] == ["batch"]


def test_no_tenants_no_objectives(tmp_path):
    docs = render(H100X8, tmp_path / "out", "--inference-pool")
    assert not kinds(docs, "InferenceObjective")
    assert not (tmp_path / "out" / "inferenceobjectives.yaml").exists()


def test_each_pool_gets_its_own_objectives(tmp_path):
    data = yaml.safe_load(_server_and_spanning(tmp_path).read_text())
    # Tenants need a router; it serves the server's model (not the LeaderWorkerSet's).
    data["router"] = {"name": "router", "default": ["small"]}
    data["tenants"] = tenants(default={"tier": "batch"})
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    docs = render(spec, tmp_path / "out", "--inference-pool", "--pool-name", "fleet")
    objectives = {o["metadata"]["name"]: o for o in kinds(docs, "InferenceObjective")}
    assert set(objectives) == {"fleet-server-batch", "fleet-llama405b-batch"}
    for name, objective in objectives.items():
        assert objective["spec"]["poolRef"]["name"] == name.removesuffix("-batch")
        assert objective["spec"]["priority"] == -1
        validate_crd(objective)


@pytest.mark.parametrize("example", ["h100", "multinode"])
def test_the_route_leads_from_the_gateway_to_the_pool(example, request):
    docs = request.getfixturevalue(example)
    infpool = one(docs, "InferencePool")
    gateway, route = one(docs, "Gateway"), one(docs, "HTTPRoute")
    namespace = infpool["metadata"].get("namespace")
    assert gateway["metadata"].get("namespace") == route["metadata"].get("namespace") == namespace
    assert gateway["spec"]["gatewayClassName"] == {"h100": "istio", "multinode": "eg"}[example]
    (listener,) = gateway["spec"]["listeners"]
    assert listener == {"name": "http", "port": 80, "protocol": "HTTP"}
    # Routes from the Gateway's own namespace are allowed: its default.
    stored = _defaulted(gateway, _schema("Gateway"))
    assert stored["spec"]["listeners"][0]["allowedRoutes"]["namespaces"]["from"] == "Same"
    (parent,) = route["spec"]["parentRefs"]
    assert parent == {
        "group": "gateway.networking.k8s.io",
        "kind": "Gateway",
        "name": gateway["metadata"]["name"],
    }
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rule["backendRefs"] == [
        {
            "group": "inference.networking.k8s.io",
            "kind": "InferencePool",
            "name": infpool["metadata"]["name"],
        }
    ]
    assert rule["timeouts"] == {"request": "300s"}


def test_a_gke_gateway_class_gets_no_route_timeout(tmp_path):
    docs = render(
        H100X8,
        tmp_path / "out",
        "--inference-pool",
        "--gateway-class",
        "gke-l7-regional-external-managed",
    )
    (rule,) = one(docs, "HTTPRoute")["spec"]["rules"]
    assert "timeouts" not in rule
    validate_crd(one(docs, "HTTPRoute"))


def test_without_the_flag_no_gateway(tmp_path):
    docs = render(H100X8, tmp_path / "out", "--inference-pool")
    assert not {"Gateway", "HTTPRoute"} & {d["kind"] for d in docs}
    assert not (tmp_path / "out" / "gateway.yaml").exists()


def test_the_files_are_in_the_kustomization_and_rerender_identically(tmp_path):
    spec = write_spec(tmp_path, H100X8, tenants=TENANTS)
    args = ("--inference-pool", "--gateway-class", "istio")
    render(spec, tmp_path / "a", *args)
    render(spec, tmp_path / "b", *args)
    kustomization = yaml.safe_load((tmp_path / "a" / "kustomization.yaml").read_text())
    resources = kustomization["resources"]
    assert resources.index("inferencepool.yaml") < resources.index("inferenceobjectives.yaml")
    assert "gateway.yaml" in resources
    for name in ("inferenceobjectives.yaml", "gateway.yaml"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


# ---------------------------------------------------------------------------------------
# The validator refuses what the API server would


def _broken(docs: list[dict], kind: str, change: Callable[[dict], None]) -> dict:
    doc = copy.deepcopy(kinds(docs, kind)[0])
    change(doc)
    return doc


def _set(path: str, value) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return change


@pytest.mark.parametrize(
    ("kind", "change"),
    [
        ("InferenceObjective", _set("spec.priority", "high")),
        ("InferenceObjective", _set("spec.poolRef", {"group": "x"})),  # no name
        ("InferenceObjective", _set("spec.weight", 1)),  # unknown field
        ("Gateway", _set("spec.listeners.0.protocol", "HTTP 2")),  # not a protocol name
        ("Gateway", _set("spec.listeners.0.port", 0)),
        ("Gateway", _set("spec.listeners.0.tls", {"mode": "Terminate"})),  # TLS on HTTP
        ("Gateway", lambda d: d["spec"]["listeners"].append(dict(d["spec"]["listeners"][0]))),
        ("Gateway", _set("spec.gatewayClassName", "")),
        ("HTTPRoute", _set("spec.rules.0.matches.0.path.value", "v1")),
        ("HTTPRoute", _set("spec.rules.0.matches.0.path.value", "/v1//chat")),
        ("HTTPRoute", _set("spec.rules.0.timeouts", {"request": "10s", "backendRequest": "20s"})),
        ("HTTPRoute", _set("spec.rules.0.timeouts", {"request": "5 min"})),
        ("HTTPRoute", _set("spec.rules.0.backendRefs.0", {"name": "svc"})),  # Service, no port
        ("HTTPRoute", lambda d: d["spec"]["parentRefs"].append(d["spec"]["parentRefs"][0])),
        ("HTTPRoute", _set("spec.rules.0.backendRef", [])),  # unknown field
    ],
)
def test_the_validator_refuses_what_the_api_server_would(h100, kind, change):
    bad = _broken(h100, kind, change)
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(bad)


def test_a_rule_without_python_is_not_passed_silently(h100):
    """A rendered field under a CEL rule the table does not translate fails loudly."""
    gateway = _broken(
        h100, "Gateway", _set("spec.addresses", [{"type": "IPAddress", "value": "10.0.0.1"}])
    )
    with pytest.raises(AssertionError, match="no Python for CEL"):
        validate_crd(gateway)


# ---------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("value", ["Istio", "istio_gw", "", "a" * 254, "istio\nx"])
def test_a_bad_gateway_class_is_one_line_exit_2(tmp_path, value):
    line = refused(H100X8, tmp_path / "out", "--inference-pool", "--gateway-class", value)
    assert line.startswith("error: --gateway-class: "), line


def test_the_gateway_class_needs_the_pool(tmp_path):
    line = refused(H100X8, tmp_path / "out", "--gateway-class", "istio")
    assert line == "error: --gateway-class: only with --inference-pool", line


def test_one_gateway_cannot_route_to_several_pools(tmp_path):
    """Two serving workloads serve different models; the model is in the body, where an
    HTTPRoute cannot look: refused, nothing written."""
    spec = _server_and_spanning(tmp_path)
    line = refused(spec, tmp_path / "out", "--inference-pool", "--gateway-class", "istio")
    assert line.startswith("error: --gateway-class: the spec has 2 serving workloads"), line
    code, stderr = hs.call_cli(
        ["k8s", "--spec", str(spec), "--out", str(tmp_path / "out"), "--inference-pool"]
    )
    assert code == 0, stderr  # the pools alone still render
