"""Rollout plans (issue 31, the planner): an on-call engineer plans a rolling restart, a move
to another launch profile or the rebuild drill as waves, reads the plan, commits it and has
it checked against the fleet later. No engine runs here; the what-if asks a real agent
about engines whose manifests the test writes."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.cli import main as cli
from console.commands import drill
from console.core.config.load import Fleet, load_fleet, parse_fleet
from console.core.rollouts.plan_file import (
    Plan,
    PlanError,
    parse_plan,
    read_plan,
    to_data,
    to_json,
    to_toml,
    write_plan,
)
from console.core.rollouts.planner import Ask, Refused, UnknownName, check_plan, make_plan
from tests.conftest import VIEWER
from tests.engines.servers import free_port
from tests.support.fleet import (
    deployment,
    fleet_model,
    fleet_toml,
    tiny_model,
    trtllm_deployments,
    watched_fleet,
)

Dep = tuple[str, str, int, str | None]  # (id, node, weight, profile)
Spec = list[tuple[str, list[Dep]]]  # (model, its deployments)


def fleet_text(models: Spec, nodes: tuple[str, ...] = ("n1", "n2", "n3"), extra: str = "") -> str:
    """fleet.toml for models of (id, node, weight, profile) deployments; each deployment
    on its own port, each profile named the way the deployment names it."""
    out = ['[fleet]\nname = "roll"\n']
    out += [f'[[nodes]]\nname = "{n}"\nagent = "http://127.0.0.1:9"\n' for n in nodes]
    port = 8000
    profiles = []
    for name, deps in models:
        out.append(f"[[models]]\nname = {json.dumps(name)}\n")
        for dep_id, node, weight, profile in deps:
            port += 1
            out.append(
                f'[[models.deployments]]\nid = "{dep_id}"\nnode = "{node}"\nengine = "vllm"\n'
                f'endpoint = "http://127.0.0.1:{port}"\nweight = {weight}\n'
                + (f"profile = {json.dumps(profile)}\n" if profile else "")
            )
            if profile:
                profiles.append(
                    f'[profiles.{json.dumps(profile)}]\nengine = "vllm"\nnode = "{node}"\n'
                    f'model = "/m"\nserved_model_name = "{name}"\nport = {port}\n'
                )
    return "\n".join(out + profiles) + extra


def fleet_of(models: Spec) -> Fleet:
    return parse_fleet(fleet_text(models), Path("fleet.toml"))


def carrying(n: int, model: str = "llama", nodes: int = 3) -> list[Dep]:
    return [(f"{model}-{i}", f"n{i % nodes + 1}", 100, None) for i in range(n)]


def ids(plan: Plan) -> list[list[str]]:
    return [[s.deployment for s in wave.steps] for wave in plan.waves]


# -- the waves --------------------------------------------------------------------------


def test_waves_keep_max_unavailable_and_the_canary_goes_first_alone() -> None:
    fleet = fleet_of([("llama", carrying(5)), ("qwen", carrying(3, "qwen"))])
    plan = make_plan(fleet, Ask("restart", models=["llama", "qwen"], max_unavailable=2))
    assert ids(plan) == [
        ["llama-0", "qwen-0"],  # each model's canary, alone of its model
        ["llama-1", "llama-2", "qwen-1", "qwen-2"],
        ["llama-3", "llama-4"],
    ]
    assert [s.canary for s in plan.waves[0].steps] == [True, True]
    assert not any(s.canary for w in plan.waves[1:] for s in w.steps)
    assert check_plan(plan, fleet) == []

    wider = make_plan(fleet, Ask("restart", models=["llama"], max_unavailable=3, canary=2))
    assert [len(w.steps) for w in wider.waves] == [2, 3]
    assert [s.canary for s in wider.waves[0].steps] == [True, True]

    with pytest.raises(Refused, match=r"--canary 3: wants 1 to --max-unavailable \(2\)"):
        make_plan(fleet, Ask("restart", models=["llama"], max_unavailable=2, canary=3))


def test_selection_is_the_union_of_model_node_and_deployment() -> None:
    fleet = fleet_of([("llama", carrying(4)), ("qwen", carrying(3, "qwen"))])
    plan = make_plan(fleet, Ask("restart", nodes=["n1"], deployments=["qwen-1", "llama-0"]))
    # n1 holds llama-0, llama-3 and qwen-0; qwen-1 by name; llama-0 only once.
    assert sorted(s for w in ids(plan) for s in w) == ["llama-0", "llama-3", "qwen-0", "qwen-1"]


def test_the_last_deployment_carrying_traffic_is_never_taken_out() -> None:
    # Two carry traffic, s is at weight 0 and first in the file, so it is the canary and
    # the two carrying ones are both still to go after it: however wide the waves, one of
    # them stays in rotation in every wave.
    fleet = fleet_of(
        [("llama", [("s", "n3", 0, None), ("a", "n1", 100, None), ("b", "n2", 50, None)])]
    )
    for width in (1, 2, 3):
        plan = make_plan(fleet, Ask("restart", models=["llama"], max_unavailable=width))
        for wave in ids(plan):
            assert not {"a", "b"} <= set(wave), (width, ids(plan))
        assert sorted(d for w in ids(plan) for d in w) == ["a", "b", "s"]
        assert check_plan(plan, fleet) == []
    # Width 3: the canary s, then a alone (not b with it), then b.
    assert ids(make_plan(fleet, Ask("restart", models=["llama"], max_unavailable=3))) == [
        ["s"],
        ["a"],
        ["b"],
    ]
    # A third carrying one: two of the three may go together, never all three.
    fleet = fleet_of([("llama", [("s", "n3", 0, None), *carrying(3)])])
    plan = make_plan(fleet, Ask("restart", models=["llama"], max_unavailable=3))
    assert ids(plan) == [["s"], ["llama-0", "llama-1"], ["llama-2"]]


def test_a_model_left_with_no_carrying_deployment_is_refused_by_name() -> None:
    fleet = fleet_of(
        [("llama", carrying(2)), ("solo", [("solo-a", "n1", 100, None), ("solo-b", "n2", 0, None)])]
    )
    with pytest.raises(Refused) as refused:
        make_plan(fleet, Ask("restart", nodes=["n1", "n2"]))
    assert refused.value.problems == [
        "model solo: restarting solo/solo-a would leave it no deployment carrying traffic; "
        "add a deployment or --allow-standby"
    ]
    # Only its standby selected: the carrying one stays; nothing to refuse.
    plan = make_plan(fleet, Ask("restart", deployments=["solo-b"]))
    assert ids(plan) == [["solo-b"]]


def test_allow_standby_starts_the_standby_first_or_says_why_it_cannot() -> None:
    fleet = fleet_of([("solo", [("solo-a", "n1", 100, None), ("solo-s", "n2", 0, "solo-standby")])])
    plan = make_plan(fleet, Ask("restart", models=["solo"], allow_standby=True))
    steps = [s for w in plan.waves for s in w.steps]
    assert [(s.deployment, s.operation, s.canary) for s in steps] == [
        ("solo-s", "start-standby", False),  # first: the standby, from its own profile
        ("solo-a", "restart", True),  # then the canary, with solo-s carrying the traffic
        ("solo-s", "restart", False),  # and the standby itself, once solo-a is back
    ]
    assert steps[0].profile == "solo-standby"
    assert ids(plan) == [["solo-s"], ["solo-a"], ["solo-s"]]
    assert check_plan(plan, fleet) == []

    # A weight-0 deployment without a launch profile cannot be started: still refused, why.
    bare = fleet_of([("solo", [("solo-a", "n1", 100, None), ("solo-s", "n2", 0, None)])])
    with pytest.raises(Refused) as refused:
        make_plan(bare, Ask("restart", models=["solo"], allow_standby=True))
    assert refused.value.problems == [
        "model solo: restarting solo/solo-a would leave it no deployment carrying traffic, and "
        "--allow-standby has no standby to start: no deployment of solo has weight 0 and a "
        "launch profile"
    ]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(st.sampled_from([0, 0, 50, 100]), min_size=1, max_size=6), min_size=1, max_size=4
    ),
    st.integers(1, 4),
    st.integers(1, 4),
    st.randoms(use_true_random=False),
)
def test_every_plan_keeps_the_rules(weights: list[list[int]], width: int, canary: int, rng) -> None:
    """Any fleet, any selection: a plan is refused exactly where a model's only carrying
    deployment is selected, and otherwise keeps every rule check_plan holds a file to."""
    spec: Spec = [
        (f"m{m}", [(f"m{m}-{i}", f"n{i % 3 + 1}", w, None) for i, w in enumerate(ws)])
        for m, ws in enumerate(weights)
    ]
    fleet = fleet_of(spec)
    chosen = [d for _, deps in spec for d, *_ in deps if rng.random() < 0.7]
    canary = min(canary, width)
    ask = Ask("restart", deployments=chosen, max_unavailable=width, canary=canary)
    only_carrier = {name: [d for d, _, w, _ in deps if w > 0] for name, deps in spec}
    lone = {name for name, c in only_carrier.items() if len(c) == 1 and c[0] in chosen}
    if lone:
        with pytest.raises(Refused) as refused:
            make_plan(fleet, ask)
        assert {p.split(":")[0] for p in refused.value.problems} == {f"model {m}" for m in lone}
        return
    plan = make_plan(fleet, ask)
    assert sorted(d for w in ids(plan) for d in w) == sorted(chosen)
    assert check_plan(plan, fleet) == []
    for name, deps in spec:
        carriers = {d for d, _, w, _ in deps if w > 0}
        waves = [[s for s in w.steps if s.model == name] for w in plan.waves]
        waves = [w for w in waves if w]
        for number, wave in enumerate(waves):
            assert len(wave) <= (canary if number == 0 else width)
            assert all(s.canary == (number == 0) for s in wave)
            assert not carriers or not carriers <= {s.deployment for s in wave}


# -- operations -------------------------------------------------------------------------

DRILLS = fleet_toml(
    models=[
        fleet_model(
            "trt",
            deployment("trt-a", "n1", "trtllm", 8101),
            deployment("trt-b", "n2", "trtllm", 8102),
            deployment("trt-base", "n3", "vllm", 8103),
        )
    ],
    drills={
        name: {"model": "trt", "deployment": dep, "checkpoint": "/ckpt"}
        for name, dep in (('re"build\na', "trt-a"), ("rebuild-b", "trt-b"))
    },
)


def test_drill_and_profile_steps_name_what_they_run_and_misfits_are_refused() -> None:
    fleet = parse_fleet(fleet_text([("llama", carrying(2))]) + DRILLS, Path("f.toml"))
    plan = make_plan(fleet, Ask("drill", deployments=["trt-a", "trt-b"]))
    assert [(s.deployment, s.drill) for w in plan.waves for s in w.steps] == [
        ("trt-a", 're"build\na'),
        ("trt-b", "rebuild-b"),
    ]
    with pytest.raises(
        Refused, match=r"deployment trt-base on node n3 \(vllm\): no drill rebuilds"
    ):
        make_plan(fleet, Ask("drill", models=["trt"]))

    moved = fleet_of([("llama", [("a", "n1", 100, "a-v1"), ("b", "n2", 100, None)])])
    plan = make_plan(moved, Ask("profile", profile="a-v1", deployments=["a"]))
    assert [(s.operation, s.profile) for w in plan.waves for s in w.steps] == [("profile", "a-v1")]
    with pytest.raises(
        Refused, match=r"deployment b on node n2 \(vllm\): profile 'a-v1' launches vllm on node n1"
    ):
        make_plan(moved, Ask("profile", profile="a-v1", models=["llama"]))


def test_a_node_without_an_agent_is_refused() -> None:
    text = fleet_text([("llama", carrying(2))], nodes=("n1",))
    text += '[[nodes]]\nname = "n2"\nssh = "ops@gpu2"\n'
    fleet = parse_fleet(text, Path("f.toml"))
    with pytest.raises(Refused, match="deployment llama-1 on node n2: the node has no agent"):
        make_plan(fleet, Ask("restart", models=["llama"]))


# -- the command line -------------------------------------------------------------------


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(
        fleet_text(
            [
                ("llama", carrying(3)),
                ("solo", [("solo-a", "n1", 100, None), ("solo-s", "n2", 0, "solo-standby")]),
            ]
        )
    )
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli(["rollout", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (
            ["--model", "nope"],
            "--model 'nope': no such model in the fleet file (models: llama, solo)",
        ),
        (["--node", "n9"], "--node 'n9': no such node in the fleet file (nodes: n1, n2, n3)"),
        (
            ["--deployment", "llama-9"],
            "--deployment 'llama-9': no such deployment in the fleet file "
            "(deployments: llama-0, llama-1, llama-2, solo-a, solo-s)",
        ),
        (
            ["--model", "llama", "--profile", "v9"],
            "--profile 'v9': no such profile in the fleet file (profiles: solo-standby)",
        ),
    ],
)
def test_unknown_names_are_one_line_exit_2_and_nothing_written(
    capsys: pytest.CaptureFixture[str], fleet_file: Path, flags: list[str], said: str
) -> None:
    out = fleet_file.parent / "plan.json"
    op = [] if "--profile" in flags else ["--restart"]
    code, _, err = run(capsys, "plan", *op, *flags, "--fleet", str(fleet_file), "--out", str(out))
    assert code == 2
    assert err == f"engineroom: rollout plan: {fleet_file}: {said}\n"
    assert not out.exists()


def test_a_refused_plan_writes_nothing_and_leaves_an_old_plan_whole(
    capsys: pytest.CaptureFixture[str], fleet_file: Path
) -> None:
    out = fleet_file.parent / "plan.toml"
    out.write_text("# the plan from yesterday\n")
    code, _, err = run(
        capsys, "plan", "--restart", "--node", "n1", "--fleet", str(fleet_file), "--out", str(out)
    )
    assert code == 1
    assert "refused: model solo: restarting solo/solo-a would leave it no deployment" in err
    assert out.read_text() == "# the plan from yesterday\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["fleet.toml", "plan.toml"]

    # With --allow-standby it is planned, and replaces the old file whole.
    code, stdout, err = run(
        capsys,
        "plan",
        "--restart",
        "--node",
        "n1",
        "--allow-standby",
        "--fleet",
        str(fleet_file),
        "--out",
        str(out),
    )
    assert code == 0, err
    assert "start-standby 'solo-standby'" in stdout and f"wrote {out}" in stdout
    plan = read_plan(out)
    assert check_plan(plan, parse_fleet(fleet_file.read_text(), fleet_file)) == []
    assert sorted(p.name for p in out.parent.iterdir()) == ["fleet.toml", "plan.toml"]


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_plan_files_round_trip_with_hostile_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, suffix: str
) -> None:
    profile = 'v2 "fast"\nkv \\ cache'
    text = fleet_text([("llama", [("a", "n1", 100, profile), ("b", "n2", 100, None)])]).replace(
        'name = "roll"', 'name = "ops \\"blue\\" \\\\ team"'
    )
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(text)
    out = tmp_path / f"plan{suffix}"
    code, stdout, err = run(
        capsys, "plan", "--profile", profile, "--deployment", "a", "--tolerance", "1.5",
        "--fleet", str(fleet_file), "--out", str(out), "--json",
    )  # fmt: skip
    assert code == 0, err
    raw = out.read_text()
    assert "\n" + profile not in raw and 'v2 "fast"' not in raw  # escaped, not spliced in
    plan = read_plan(out)
    assert plan.fleet == 'ops "blue" \\ team'
    assert plan.profile == profile and plan.waves[0].steps[0].profile == profile
    assert plan.tolerance.ttft_p95_ratio == plan.tolerance.itl_p95_ratio == 1.5
    # The same plan in the other format reads back equal.
    other = tmp_path / ("again.toml" if suffix == ".json" else "again.json")
    write_plan(plan, other)
    assert read_plan(other) == plan
    assert to_data(parse_plan(to_toml(plan), Path("p.toml"))) == to_data(plan)
    assert json.loads(stdout) == to_data(plan) == json.loads(to_json(plan))
    code, stdout, _ = run(capsys, "check", str(out), "--fleet", str(fleet_file))
    assert code == 0 and "fits" in stdout


NAMES = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)  # any text UTF-8 holds


@settings(max_examples=200, deadline=None)
@given(NAMES, NAMES, NAMES, st.dictionaries(NAMES, NAMES, max_size=3))
def test_any_text_survives_a_plan_file_escaped(
    fleet: str, profile: str, node: str, what_if
) -> None:
    """Quotes, backslashes, newlines, DEL and the rest: each TOML and JSON string stays one
    value and reads back as it was."""
    step = {"model": "m", "deployment": "d", "node": node, "engine": "vllm"}
    plan = Plan.model_validate(
        {
            "fleet": fleet,
            "fleet_digest": "sha256:" + "0" * 64,
            "operation": "profile",
            "profile": profile,
            "max_unavailable": 1,
            "canary": 1,
            "selection": {"what_if": what_if, "models": [fleet]},
            "waves": [{"steps": [{**step, "operation": "profile", "profile": profile}]}],
        }
    )
    assert parse_plan(to_toml(plan), Path("p.toml")) == plan
    assert parse_plan(to_json(plan), Path("p.json")) == plan


# -- plan files read back ---------------------------------------------------------------


def edited(data: dict, change: Callable[[dict], None]) -> dict:
    data = json.loads(json.dumps(data))
    change(data)
    return data


def _set(path: str, value: object) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return change


BROKEN_FILES = {
    "not JSON": ("{waves: [", "not valid JSON: Expecting property name enclosed in double quotes"),
    "a list": ("[1, 2]", "not a rollout plan (a list, not a table)"),
    "a fleet file": (
        '{"fleet": {"name": "x"}}',
        "not a rollout plan (kind is None, not 'engineroom-rollout-plan')",
    ),
}

EDITS = {
    "version 2": (
        _set("version", 2),
        "version 2: this engineroom reads rollout plans of version 1",
        2,
    ),
    "version as text": (
        _set("version", "1"),
        "version '1': this engineroom reads rollout plans of version 1",
        2,
    ),
    "unknown step key": (
        _set("waves.0.steps.0.nodes", "n1"),
        "waves[0].steps[0].nodes: unknown key 'nodes' (allowed: model, deployment, node, "
        "engine, operation, canary, profile, drill)",
        2,
    ),
    "unknown top key": (_set("parallel", 4), "parallel: unknown key 'parallel'", 2),
    "canary as text": (
        _set("waves.0.steps.0.canary", "yes"),
        "waves[0].steps[0].canary: Input should be a valid boolean; got 'yes'",
        2,
    ),
    "tolerance below 1": (
        _set("tolerance.ttft_p95_ratio", 0.5),
        "tolerance.ttft_p95_ratio: Input should be greater than or equal to 1",
        2,
    ),
    "a deployment gone": (
        _set("waves.1.steps.0.deployment", "llama-9"),
        "waves[1].steps[0]: deployment 'llama-9' is not in the fleet file",
        1,
    ),
    "two out at once": (
        lambda d: d["waves"][1]["steps"].append(d["waves"][2]["steps"].pop()),
        "model llama: wave 2 takes 2 deployments out (llama-1, llama-2); max_unavailable is 1",
        1,
    ),
    "no canary": (
        _set("waves.0.steps.0.canary", False),
        "model llama: wave 1 is its first and so its canary",
        1,
    ),
    "the last carrier out": (
        lambda d: d["waves"][0]["steps"].append(
            dict(d["waves"][0]["steps"][0], deployment="solo-a", model="solo", canary=True)
        ),
        "model solo: wave 1 takes out every deployment carrying its traffic (solo-a)",
        1,
    ),
    "another fleet": (
        _set("fleet", "prod-eu"),
        "fleet: planned for fleet 'prod-eu'; this is 'roll'",
        1,
    ),
    "another operation": (
        _set("waves.2.steps.0.operation", "drill"),
        "names a drill exactly when it runs one",
        2,
    ),
}


@pytest.mark.parametrize("name", list(BROKEN_FILES))
def test_a_file_that_is_not_a_plan_is_refused_with_the_file_and_why(
    capsys: pytest.CaptureFixture[str], fleet_file: Path, name: str
) -> None:
    text, said = BROKEN_FILES[name]
    path = fleet_file.parent / "plan.json"
    path.write_text(text)
    code, out, err = run(capsys, "check", str(path), "--fleet", str(fleet_file))
    assert (code, out) == (2, "")
    assert err.startswith(f"engineroom: rollout check: {path}") and said in err, err


@pytest.mark.parametrize("name", list(EDITS))
@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_plan_edited_out_of_shape_is_refused_with_the_file_and_why(
    capsys: pytest.CaptureFixture[str], fleet_file: Path, name: str, suffix: str
) -> None:
    change, said, exit_code = EDITS[name]
    fleet = parse_fleet(fleet_file.read_text(), fleet_file)
    good = to_data(make_plan(fleet, Ask("restart", models=["llama"])))
    assert len(good["waves"]) == 3
    path = fleet_file.parent / f"plan{suffix}"
    data = edited(good, change)
    if suffix == ".toml":
        import tomlkit

        path.write_text(tomlkit.dumps(data))
    else:
        path.write_text(json.dumps(data))
    before = path.read_bytes()
    code, out, err = run(capsys, "check", str(path), "--fleet", str(fleet_file))
    assert (code, out) == (exit_code, ""), err
    assert str(path) in err and said in err, err
    assert path.read_bytes() == before


def test_a_plan_on_deployments_that_changed_is_refused(
    capsys: pytest.CaptureFixture[str], fleet_file: Path
) -> None:
    path = fleet_file.parent / "plan.toml"
    code, _, err = run(
        capsys,
        "plan",
        "--restart",
        "--model",
        "llama",
        "--fleet",
        str(fleet_file),
        "--out",
        str(path),
    )
    assert code == 0, err
    assert run(capsys, "check", str(path), "--fleet", str(fleet_file))[0] == 0
    # Someone halves a weight in fleet.toml after the plan was reviewed.
    fleet_file.write_text(fleet_file.read_text().replace("weight = 100", "weight = 50", 1))
    code, out, err = run(capsys, "check", str(path), "--fleet", str(fleet_file))
    assert (code, out) == (1, "")
    assert f"{path}: fleet_digest: the fleet file's models and deployments changed" in err
    # A TOML plan's error names the line too.
    path.write_text(path.read_text().replace("max_unavailable = 1", "max_unavailable = 0"))
    code, _, err = run(capsys, "check", str(path), "--fleet", str(fleet_file))
    assert code == 2
    line = next(
        i for i, t in enumerate(path.read_text().splitlines(), 1) if t.startswith("max_unavailable")
    )
    assert (
        f"{path}:{line}: max_unavailable: Input should be greater than or equal to 1; got 0" in err
    )


def test_an_oversized_plan_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import console.core.rollouts.plan_file as rp

    monkeypatch.setattr(rp, "MAX_PLAN_BYTES", 100)
    path = tmp_path / "plan.json"
    path.write_text(" " * 101)
    with pytest.raises(PlanError, match=f"{path}: over 100 bytes: not a rollout plan"):
        read_plan(path)


def test_unknown_name_error_lists_a_bounded_number_of_names() -> None:
    fleet = fleet_of([("llama", carrying(30))])
    with pytest.raises(UnknownName) as unknown:
        make_plan(fleet, Ask("restart", deployments=["x"]))
    listed = ", ".join(f"llama-{i}" for i in range(10))
    assert str(unknown.value).endswith(f"(deployments: {listed}, ... (30 in all))")


# -- --what-if --------------------------------------------------------------------------


def restart_what_if(
    capsys: pytest.CaptureFixture[str], driver: str, fleet_file: Path, *more: str
) -> tuple[int, str, str]:
    """`engineroom rollout plan --restart --what-if --driver DRIVER --fleet F` and `more`."""
    return run(capsys, "plan", "--restart", "--what-if", "--driver", driver,
               "--fleet", str(fleet_file), *more)  # fmt: skip


def manifest(driver: str) -> dict:
    """An engineroom manifest, as a drill writes it (console.agent.drills.manifest)."""
    return {
        "schema": 1,
        "build_key": "bf16-0123456789abcdef",
        "pipeline": "engine",
        "precision": "bf16",
        "tp_size": 1,
        "shapes": {"max_batch_size": 8},
        "versions": {
            "driver": driver,
            "cuda": "12.8",
            "tensorrt": "10.13",
            "tensorrt_llm": "1.2.0",
        },
        "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"},
        "model": {"name": "tiny", "checkpoint": "/nonexistent", "weights_sha256": "ab" * 32},
    }


def test_what_if_selects_exactly_what_drill_what_if_says_goes_stale(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    agent_factory: Callable[..., object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engines = {"trt-a": "580.65.06", "trt-b": "580.65.06", "trt-new": "590.10", "trt-hand": None}
    engine_dirs: dict[str, Path | None] = {}
    for dep, driver in engines.items():
        engine_dir = tmp_path / "engines" / dep
        engine_dir.mkdir(parents=True)
        if driver is not None:
            (engine_dir / "engineroom-manifest.json").write_text(json.dumps(manifest(driver)))
        engine_dirs[dep] = engine_dir
    port = free_port()
    trt = trtllm_deployments(engine_dirs)
    text = watched_fleet("whatif", port, tmp_path / "state", "T_VIEW", tiny_model(9, *trt))
    agent = agent_factory(text, "local", port)
    monkeypatch.setenv("T_VIEW", VIEWER)
    fleet_file = agent.fleet  # type: ignore[attr-defined]

    said = io.StringIO()  # what `engineroom drill what-if --json` prints
    code = drill.what_if(load_fleet(fleet_file), {"driver": "590.10"}, as_json=True, out=said)
    assert code == 0
    rows = json.loads(said.getvalue())
    stale = {r["deployment"] for r in rows if r["verdict"] in ("rebuild", "cache")}
    assert stale == {"trt-a", "trt-b"}
    assert {r["deployment"]: r["verdict"] for r in rows}["trt-hand"] == "unknown"

    out = tmp_path / "plan.json"
    code, stdout, err = restart_what_if(capsys, "590.10", fleet_file, "--out", str(out), "--json")
    assert code == 0, err
    plan = read_plan(out)
    assert {s.deployment for w in plan.waves for s in w.steps} == stale
    assert plan.selection.what_if == {"driver": "590.10"}
    assert "trt-hand not planned: the what-if says unknown" in err  # said, not planned
    assert json.loads(stdout) == to_data(plan)


def test_what_if_with_an_agent_that_does_not_answer_plans_nothing(
    capsys: pytest.CaptureFixture[str], fleet_file: Path
) -> None:
    out = fleet_file.parent / "plan.json"
    os.environ.pop("T_VIEW", None)
    code, stdout, err = restart_what_if(capsys, "590", fleet_file, "--out", str(out))
    assert (code, stdout) == (2, "")
    assert "not every agent answered the what-if: no plan" in err
    assert not out.exists()
    code, _, err = run(
        capsys,
        "plan",
        "--restart",
        "--driver",
        "590",
        "--model",
        "llama",
        "--fleet",
        str(fleet_file),
    )
    assert code == 2 and "go with --what-if" in err
    code, _, err = restart_what_if(capsys, "5\x1b[2J", fleet_file)
    assert code == 2 and "--driver: wants a version without control characters" in err
    assert "\x1b" not in err
