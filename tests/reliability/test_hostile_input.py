"""Hostile and malformed input: stored and shown verbatim, or refused with a 4xx, never a 5xx."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from flightdeck.service.api.routes.dashboard import STATIC_DIR
from flightdeck.service.core.config import Settings
from tests.reliability.conftest import World, make_settings, served
from tests.service.factories import USER, WORKER, recipe

HOSTILE_NAMES = [
    "quote\"s 'and' `backticks`",
    "$(touch /tmp/flightdeck-pwned) ; rm -rf / #",
    "line one\nline two\r\n\ttabbed",
    "<script>alert('x')</script><img src=x onerror=alert(1)>",
    "ünïcödé 名前 \u202eevil\u202c",
    "x" * 200,
]
_JSON = {"content-type": "application/json"}


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_hostile_names_are_stored_and_shown_verbatim(client: TestClient, name: str) -> None:
    long_template = 'Q: {question}\n$(id) `id` "; ' + "y" * 60_000 + "\nA: "
    sent = recipe(name=name)
    sent["data"]["prompt_template"] = long_template
    sent["data"]["train"][0]["path"] = 'data/it\'s a "file" $(id).jsonl'
    created = client.post("/jobs", json=sent, headers=USER)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    detail = client.get(f"/jobs/{job_id}", headers=USER).json()
    assert detail["name"] == name
    assert detail["recipe"]["data"]["prompt_template"] == long_template
    assert detail["recipe"]["data"]["train"][0]["path"] == sent["data"]["train"][0]["path"]
    listed = client.get("/jobs", headers=USER).json()["data"]
    assert [job["name"] for job in listed] == [name]


def test_names_longer_than_the_limit_are_refused_with_the_path(client: TestClient) -> None:
    answer = client.post("/jobs", json=recipe(name="x" * 201), headers=USER)
    assert answer.status_code == 422
    assert [f["path"] for f in answer.json()["findings"]] == ["name"]


def test_dashboard_pages_never_carry_stored_strings(client: TestClient) -> None:
    """Pages are static files filled in by scripts with textContent: no stored string is ever markup."""
    marker = "<b id=flightdeck-marker>"
    created = client.post("/jobs", json=recipe(name=marker), headers=USER)
    assert created.status_code == 201
    for url, page in [("/", "index.html"), (f"/ui/jobs/{created.json()['id']}", "job.html")]:
        answer = client.get(url)
        assert answer.status_code == 200
        assert answer.content == (STATIC_DIR / page).read_bytes()  # no server-side interpolation
        assert "script-src 'self'" in answer.headers["content-security-policy"]
        assert answer.headers["x-content-type-options"] == "nosniff"
    scripts = sorted(STATIC_DIR.rglob("*.js"))
    assert scripts
    sinks = re.compile(
        r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write|\beval\(|new Function\("
    )
    for script in scripts:
        if "vendor" in script.parts:
            continue  # the vendored chart library draws on canvas; it never sees job strings as markup
        found = sinks.findall(script.read_text())
        assert not found, f"{script.name} writes markup from strings: {found}"


def test_no_code_path_runs_a_shell() -> None:
    """Recipes reach torchrun as argv lists; nothing in the service or worker may start a shell."""
    root = Path(__file__).resolve().parents[2]
    shell = re.compile(r"shell\s*=\s*True|os\.system\(|os\.popen\(|create_subprocess_shell|pty\.spawn")
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for package in ("service", "worker")
        for path in sorted((root / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if shell.search(line)
    ]
    assert not offenders, offenders


# --- body size ------------------------------------------------------------------------------


@pytest.fixture
def small_limit(tmp_path: Path) -> Settings:
    return make_settings(tmp_path / "data", max_body_bytes=4096)


def test_bodies_over_the_limit_are_413_through_a_real_server(small_limit: Settings) -> None:
    big = b'{"name": "' + b"x" * 10_000 + b'"}'

    def chunks() -> Any:
        for _ in range(10):  # no Content-Length: the limit must hold on a streamed body too
            yield b" " * 1000

    with served(small_limit) as url, httpx.Client(base_url=url, headers=USER, timeout=30) as api:
        for route in ("/jobs", "/preflight"):
            assert api.post(route, content=big, headers=_JSON).status_code == 413
            streamed = api.post(route, content=chunks(), headers=_JSON)
            assert streamed.status_code == 413, streamed.text
            assert "4096" in streamed.json()["detail"]
        worker = {**WORKER, **_JSON}
        assert api.post("/attempts/1/logs", content=big, headers=worker).status_code == 413
        assert api.get("/healthz").status_code == 200  # the server is still up and serving


# --- metrics --------------------------------------------------------------------------------


def _post_points(client: TestClient, world: World, points: list[dict[str, Any]]) -> dict[str, int]:
    answer = client.post(
        f"/attempts/{world.attempt_id}/metrics", json={"points": points}, headers=world.worker_a
    )
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def _stored(client: TestClient, job_id: int) -> dict[int, dict[str, Any]]:
    points = client.get(f"/jobs/{job_id}/metrics", headers=USER).json()["points"]
    return {p["step"]: p["values"] for p in points}


def test_non_finite_values_round_trip(client: TestClient, world: World) -> None:
    values = {"loss": "NaN", "grad_norm": "Infinity", "lr": "-Infinity", "tokens": 12.5}
    assert _post_points(client, world, [{"step": 1, "values": values}])["accepted"] == 4
    assert _stored(client, world.job_id) == {1: values}
    series = client.get(f"/jobs/{world.job_id}/metrics/series/grad_norm", headers=USER).json()
    assert (series["steps"], series["values"]) == ([1], ["Infinity"])


@pytest.mark.parametrize(
    "raw",
    [
        b'{"points": [{"step": 1, "values": {"loss": NaN}}]}',  # a bare NaN is not JSON
        b'{"points": [{"step": 1, "values": {"loss": "nan-ish"}}]}',
        b'{"points": [{"step": -1, "values": {"loss": 1.0}}]}',
        b'{"points": [{"step": 1, "values": {"loss": true}}]}',
        b'{"points": [{"step": 1, "values": {"bad key!": 1.0}}]}',
        b'{"points": {"step": 1}}',
        b"\x00\xff not json",
    ],
    ids=["bare-nan", "word", "negative-step", "boolean", "bad-key", "not-a-list", "binary"],
)
def test_malformed_metric_batches_are_refused_whole(client: TestClient, world: World, raw: bytes) -> None:
    answer = client.post(
        f"/attempts/{world.attempt_id}/metrics", content=raw, headers={**world.worker_a, **_JSON}
    )
    assert answer.status_code == 422, answer.text
    assert _stored(client, world.job_id) == {}


def test_out_of_order_and_duplicate_steps_keep_the_first_value(client: TestClient, world: World) -> None:
    first = _post_points(client, world, [{"step": s, "values": {"loss": float(s)}} for s in (5, 2, 9)])
    assert first == {"accepted": 3, "duplicates": 0}
    again = [{"step": 2, "values": {"loss": 99.0}}, {"step": 3, "values": {"loss": 3.0}}]
    assert _post_points(client, world, again) == {"accepted": 1, "duplicates": 1}
    same_batch = [{"step": 7, "values": {"loss": 7.0}}, {"step": 7, "values": {"loss": 70.0}}]
    assert _post_points(client, world, same_batch)["accepted"] == 1
    stored = _stored(client, world.job_id)
    assert sorted(stored) == [2, 3, 5, 7, 9]  # read back in step order whatever the arrival order
    assert {step: v["loss"] for step, v in stored.items()} == {2: 2.0, 3: 3.0, 5: 5.0, 7: 7.0, 9: 9.0}


# --- logs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b'{"offset": 0, "text": "half \\udcff a pair\\n"}',  # a lone surrogate: not encodable as UTF-8
        b'{"offset": 0, "text": "\\ud800"}',
        b'{"offset": 0, "text": "raw \xff\xfe bytes"}',  # the body itself is not UTF-8
    ],
    ids=["lone-low-surrogate", "lone-high-surrogate", "invalid-utf8-body"],
)
def test_log_chunks_that_are_not_unicode_are_refused(client: TestClient, world: World, raw: bytes) -> None:
    answer = client.post(
        f"/attempts/{world.attempt_id}/logs", content=raw, headers={**world.worker_a, **_JSON}
    )
    assert answer.status_code in (400, 422), answer.text
    assert client.get(f"/jobs/{world.job_id}/logs", headers=USER).json()["text"] == ""


def test_log_chunks_are_stored_once_whatever_the_order(client: TestClient, world: World) -> None:
    chunks = [(0, "première ligne\n"), (len("première ligne\n".encode()), "second $(id) `x`\n")]
    for offset, text in [chunks[1], chunks[0], chunks[1], chunks[0]]:
        answer = client.post(
            f"/attempts/{world.attempt_id}/logs",
            json={"offset": offset, "text": text},
            headers=world.worker_a,
        )
        assert answer.status_code == 200, answer.text
    log = client.get(f"/jobs/{world.job_id}/logs", headers=USER).json()
    assert log["text"] == chunks[0][1] + chunks[1][1]
    assert log["next_offset"] == len(log["text"].encode())


# --- known bugs: integers beyond 64 bits reach SQLite or orjson --------------------------------

_BIG = 2**64 + 1


def _beyond_64_bits(world: World) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, url, request kwargs) that each carry an integer SQLite cannot store."""
    return [
        ("GET", f"/jobs/{_BIG}", {"headers": USER}),
        ("GET", "/jobs", {"headers": USER, "params": {"cursor": _BIG}}),
        ("GET", f"/jobs/{world.job_id}/metrics", {"headers": USER, "params": {"after": _BIG}}),
        ("GET", f"/jobs/{world.job_id}/events", {"headers": USER, "params": {"after": _BIG}}),
        ("POST", f"/attempts/{_BIG}/logs", {"headers": world.worker_a, "json": {"offset": 0, "text": "x"}}),
        (
            "POST",
            f"/workers/{world.worker_id}/heartbeat",
            {"headers": world.worker_a, "json": {"attempts": [_BIG]}},
        ),
        (
            "POST",
            f"/attempts/{world.attempt_id}/finish",
            {"headers": world.worker_a, "json": {"status": "failed", "exit_code": _BIG}},
        ),
        (
            "POST",
            f"/attempts/{world.attempt_id}/events",
            {
                "headers": world.worker_a,
                "json": {"events": [{"key": "k", "kind": "x", "message": "m", "data": {"n": _BIG}}]},
            },
        ),
    ]


def test_integers_beyond_64_bits_are_refused_not_500(settings: Settings, world: World) -> None:
    from flightdeck.service.api.app import create_app

    with TestClient(create_app(settings), raise_server_exceptions=False) as raw_client:
        answers = {
            url: raw_client.request(method, url, **kw).status_code
            for method, url, kw in _beyond_64_bits(world)
        }
    assert all(400 <= code < 500 for code in answers.values()), sorted(answers.items(), key=lambda kv: -kv[1])


def test_refused_reports_answer_in_the_documented_shape(client: TestClient, world: World) -> None:
    answer = client.post(
        f"/attempts/{world.attempt_id}/metrics", content=b"{", headers={**world.worker_a, **_JSON}
    )
    assert answer.status_code == 422
    detail = answer.json()["detail"]
    assert isinstance(detail, list) and {"loc", "msg", "type"} <= set(detail[0])


def test_refusal_statuses_are_documented(client: TestClient) -> None:
    from tests.reliability.test_auth_matrix import ROUTES, Who

    document = client.get("/openapi.json").json()
    missing = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            wanted = {"413"} if method == "post" else set()
            if ROUTES[(method.upper(), path)].who is not Who.anyone:
                wanted |= {"401", "403"}
            if "{" in path:
                wanted.add("404")
            absent = wanted - set(operation["responses"])
            if absent:
                missing.append(f"{method.upper()} {path}: {sorted(absent)}")
    assert not missing, "\n".join(missing)


# --- the launch: argv lists and allow-listed environment only ----------------------------------

# Variables the launcher itself sets; anything else in a plan must be a recipe variable that passed E006.
LAUNCHER_VARIABLES = {
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "OMP_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "SHIRG_NO_DEVICE_MAP",
    "PYTHONUNBUFFERED",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "FLIGHTDECK_WORKSPACE",
    "FLIGHTDECK_RUN_DIR",
    "FLIGHTDECK_BACKEND",
    "MASTER_PORT",
    "PET_MASTER_PORT",
    # NCCL Flight Recorder of multi-GPU plans (H006): fixed values, the dump path under the run directory.
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
}


@pytest.mark.parametrize(
    "env",
    [
        {"LD_PRELOAD": "/tmp/evil.so"},
        {"PATH": "/tmp/evil"},
        {"PYTHONPATH": "/tmp/evil"},
        {"HF_TOKEN": "stolen"},
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"RANK": "0"},
        {"NCCL_DEBUG": "$(id)"},
        {"NCCL_SOCKET_IFNAME": "eth0;rm -rf /"},
        {"OMP_NUM_THREADS": "4`id`"},
        {"HF_HUB_OFFLINE": "1\nLD_PRELOAD=/tmp/evil.so"},
        {"nccl_debug": "INFO"},
    ],
    ids=lambda env: next(iter(env)),
)
def test_unlisted_or_unsafe_variables_are_refused_at_submit(client: TestClient, env: dict[str, str]) -> None:
    answer = client.post("/jobs", json=recipe(env=env), headers=USER)
    assert answer.status_code == 422, answer.text
    assert [f["code"] for f in answer.json()["findings"]] == ["E006"]
    assert client.get("/jobs", headers=USER).json()["count"] == 0


def test_a_hostile_recipe_reaches_the_launch_only_as_data() -> None:
    from flightdeck.inventory import WorkerInventory
    from flightdeck.launch.plan import build_launch_plan
    from flightdeck.recipe import parse_recipe
    from flightdeck.recipe.schema import env_variable_kind
    from tests.service.factories import gpu_inventory

    hostile = recipe(name='$(touch /tmp/pwned); `id` "quoted"\nnext', env={"NCCL_DEBUG": "INFO"})
    hostile["data"]["train"][0]["path"] = "data/x.jsonl; rm -rf / #"
    hostile["model"]["path"] = "models/$(id)"
    hostile["data"]["prompt_template"] = "{question} $(reboot) `halt`"
    parsed = parse_recipe(hostile)
    inventory = WorkerInventory.model_validate(gpu_inventory(2, name="NVIDIA GeForce RTX 4090"))
    plan = build_launch_plan(
        parsed, inventory, job_id="7; rm -rf /", database="db", attempt_number=1, devices=[0, 1]
    )

    # A plain recipe for the same job launches with the very same argv: nothing of the recipe is in it.
    plain = parse_recipe(recipe(env={"NCCL_DEBUG": "INFO"}))
    assert (
        plan.argv
        == build_launch_plan(
            plain, inventory, job_id="7; rm -rf /", database="db", attempt_number=1, devices=[0, 1]
        ).argv
    )
    joined = "\n".join(plan.argv + [plan.run_dir] + [str(v.value) for v in plan.env])
    for fragment in ("$(", "`", ";", "rm -rf", "touch", "reboot", "\n\n"):
        assert fragment not in joined, fragment
    assert plan.argv[-1] == plan.recipe_path and plan.recipe_path.startswith(plan.run_dir)
    names = [var.name for var in plan.env]
    assert len(names) == len(set(names))
    unlisted = [n for n in names if n not in LAUNCHER_VARIABLES and env_variable_kind(n) is None]
    assert unlisted == []
    assert plan.env_value("NCCL_DEBUG") == "INFO"  # the one recipe variable, as given
