"""`serve`'s options and the request checks around them, in process (TestClient) on test_server's
pinned random pair: max_completion_tokens, the --max-tokens default, --api-key, --allowed-origins,
mlx-lm's wired limit around generation, the flags themselves, the playground the command mounts
beside the API, and a target whose architecture DFlash cannot serve."""

import contextlib
import threading

import openai
import pytest
from fastapi.testclient import TestClient
from test_engine import UNSUPPORTED, write_architecture
from test_server import greedy
from ui_pair import free_port, pinned_random_pair

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.cli import main
from dflash_core.commands.serve import serving_app
from dflash_core.serving import jobs
from dflash_core.serving import routes as server_module
from dflash_core.serving.worker import default_worker

pytestmark = pytest.mark.slow

MODEL = "random-qwen3"
KEY = "sesame-7f3a"


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    from types import SimpleNamespace

    root = tmp_path_factory.mktemp("options-pair")
    target, draft, pair = pinned_random_pair(root)
    return SimpleNamespace(pair=pair, worker=default_worker(), target=target, draft=draft, root=root)


@contextlib.contextmanager
def client(pinned, **options):
    with TestClient(server_module.create_app(pinned.pair, MODEL, **options)) as c:
        yield c


def completion(c, **body):
    return c.post("/v1/completions", json={"model": MODEL, "prompt": "hello", **body})


def test_max_completion_tokens_is_checked_like_max_tokens(pinned):
    with client(pinned) as c:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
        for n in (0, -3, 10**6):
            r = c.post("/v1/chat/completions", json={**chat, "max_completion_tokens": n})
            assert r.status_code == 400, n
            error = r.json()["error"]
            assert error["param"] == "max_completion_tokens" and "out of range" in error["message"]
        # the newer name wins over max_tokens, as in OpenAI's API
        r = c.post("/v1/chat/completions", json={**chat, "max_completion_tokens": 5, "max_tokens": 50})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5


def test_max_tokens_option_is_the_default(pinned):
    """`serve --max-tokens 7`: a request without max_tokens gets 7 tokens ("hello" has no EOS soon)."""
    with client(pinned, max_tokens=7) as c:
        r = completion(c)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 7
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert completion(c, max_tokens=9).json()["usage"]["completion_tokens"] == 9


def test_api_key_guards_the_api_but_not_health_or_metrics(pinned):
    with client(pinned, api_key=KEY) as c:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": KEY},
            {"Authorization": f"Basic {KEY}"},
        ):
            for r in (
                c.get("/v1/models", headers=headers),
                c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5}, headers=headers),
            ):
                assert r.status_code == 401, headers
                assert r.headers["www-authenticate"] == "Bearer"
                assert r.json()["error"]["code"] == "invalid_api_key" and "Bearer" in r.json()["error"]["message"]
        assert c.get("/health").status_code == 200
        assert c.get("/metrics").status_code == 200
        assert 'outcome="unauthorized"' in c.get("/metrics").text
        ok = {"Authorization": f"Bearer {KEY}"}
        assert c.get("/v1/models", headers=ok).json()["data"][0]["id"] == MODEL
        text, _, _ = greedy(pinned, "hi", 8, chat=False)
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8}, headers=ok)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == text
        # the official client sends its api_key as the Bearer token
        good = openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=c, max_retries=0)
        assert good.completions.create(model=MODEL, prompt="hi", max_tokens=8).choices[0].text == text
        bad = openai.OpenAI(base_url="http://testserver/v1", api_key="nope", http_client=c, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


def test_allowed_origins_answer_cors(pinned):
    origin, other = "https://app.example", "https://evil.example"
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    with client(pinned, allowed_origins=[origin], api_key=KEY) as c:
        r = c.options("/v1/chat/completions", headers={"Origin": origin, **preflight})
        assert r.status_code == 200  # the preflight carries no key, and needs none
        assert r.headers["access-control-allow-origin"] == origin
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        r = c.get("/v1/models", headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        assert c.options("/v1/chat/completions", headers={"Origin": other, **preflight}).status_code == 400
        assert "access-control-allow-origin" not in c.get("/health", headers={"Origin": other}).headers
    with client(pinned) as c:  # none given: no page elsewhere may call the API
        assert "access-control-allow-origin" not in c.get("/health", headers={"Origin": origin}).headers
        assert c.options("/v1/chat/completions", headers={"Origin": origin, **preflight}).status_code != 200


def test_generation_runs_inside_mlx_lms_wired_limit(pinned, monkeypatch):
    from mlx_lm.generate import wired_limit

    assert jobs.wired_limit is wired_limit
    seen = []

    @contextlib.contextmanager
    def recording(model):
        seen.append(("enter", model is pinned.pair.model, threading.current_thread().name))
        yield
        seen.append(("exit",))

    monkeypatch.setattr(jobs, "wired_limit", recording)
    with client(pinned) as c:
        assert completion(c, max_tokens=4).status_code == 200
        assert completion(c, max_tokens=4, temperature=0.5, stream=True).status_code == 200
    assert seen == [("enter", True, "mlx-worker"), ("exit",)] * 2


def test_serve_flags_reach_the_server(pinned, monkeypatch, capsys):
    given, served = {}, []
    create_app = server_module.create_app
    monkeypatch.setattr(
        server_module, "create_app", lambda *args, **kwargs: given.update(kwargs) or create_app(*args, **kwargs)
    )
    monkeypatch.setattr(server_module, "serve", lambda app, *args: served.append(app))
    pair_args = ["--model", str(pinned.target), "--draft", str(pinned.draft), "--port", str(free_port())]
    assert (
        main(
            [
                "serve",
                *pair_args,
                "--no-playground",
                "--api-key",
                KEY,
                "--allowed-origins",
                "https://a.example",
                "*",
                "--max-tokens",
                "9",
                "--max-queue",
                "0",
                "--prefix-cache-mb",
                "0",
            ]
        )
        == 0
    )
    assert given == {
        "api_key": KEY,
        "allowed_origins": ["https://a.example", "*"],
        "max_tokens": 9,
        "max_queue": 0,
        "prefix_cache_mb": 0,
    }
    assert served[-1].state.playground is False
    assert served[-1].state.server.pair.prefix_cache is None
    given.clear()
    assert main(["serve", *pair_args, "--no-playground"]) == 0
    assert given == {"api_key": None, "allowed_origins": None}  # the server's defaults apply
    assert served[-1].state.playground is False
    assert served[-1].state.server.pair.prefix_cache.max_bytes == server_module.DEFAULT_PREFIX_CACHE_MB * 2**20
    for bad in (["--max-queue", "-1"], ["--max-tokens", "0"], ["--max-tokens", "many"], ["--prefix-cache-mb", "-1"]):
        capsys.readouterr()
        assert main(["serve", *pair_args, *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
    # --help states the server's own defaults
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"default {server_module.DEFAULT_MAX_TOKENS};" in help_text
    assert f"(default {server_module.MAX_QUEUE})" in help_text
    assert f"(default {server_module.DEFAULT_PREFIX_CACHE_MB}; 0: off;" in help_text


def test_serve_policy_flags(pinned, monkeypatch, capsys):
    """--policy and --min-confidence reach the server (--min-confidence alone means the fixed
    policy); contradictions are one error line before anything loads."""
    given, served = {}, []
    create_app = server_module.create_app
    monkeypatch.setattr(
        server_module, "create_app", lambda *args, **kwargs: given.update(kwargs) or create_app(*args, **kwargs)
    )
    monkeypatch.setattr(server_module, "serve", lambda app, *args: served.append(app))
    pair_args = ["--model", str(pinned.target), "--draft", str(pinned.draft), "--port", str(free_port())]
    for flags, options, policy in (
        (["--policy", "fixed", "--min-confidence", "0.3"], {"policy": "fixed", "min_confidence": 0.3}, "fixed"),
        (["--min-confidence", "0.3"], {"min_confidence": 0.3}, "fixed"),
        (["--policy", "adaptive"], {"policy": "adaptive"}, "adaptive"),
    ):
        given.clear()
        assert main(["serve", *pair_args, "--no-playground", *flags]) == 0
        assert {k: given[k] for k in ("policy", "min_confidence") if k in given} == options
        server = served[-1].state.server
        assert (server.policy, server.min_confidence) == (policy, options.get("min_confidence"))
    assert "; adaptive policy" in capsys.readouterr().err  # the log line names it
    for bad, says in (
        (["--policy", "adaptive", "--min-confidence", "0.3"], "--min-confidence"),
        (["--policy", "greedy"], "invalid choice: 'greedy'"),
    ):
        assert main(["serve", *pair_args, *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and says in err, err
        assert "loading" not in err  # refused before the pair loads


def test_the_servers_policy_and_a_requests_own(pinned):
    """The fixed policy at min confidence 1 verifies one proposal a cycle; a request's
    "dflash_policy" overrides the server's for that request alone."""
    with client(pinned, policy="fixed", min_confidence=1.0) as c:
        assert c.get("/health").json()["policy"] == "fixed"
        run = completion(c, max_tokens=24).json()["dflash"]
        assert run["policy"] == "fixed" and run["min_confidence"] == 1.0 and run["plain_steps"] == 0
        assert run["verified_rows"][1] == run["cycles"] == run["drafted_tokens"]
        run = completion(c, max_tokens=24, dflash_policy="adaptive").json()["dflash"]
        assert run["policy"] == "adaptive" and run["min_confidence"] == 0.0
    with client(pinned) as c:  # none given: the engine's default (adaptive for greedy requests)
        assert c.get("/health").json()["policy"] == "default"
        assert completion(c, max_tokens=8).json()["dflash"]["policy"] == "adaptive"
    with pytest.raises(server_module.DFlashError, match="applies to the fixed policy"):
        server_module.create_app(pinned.pair, MODEL, policy="adaptive", min_confidence=0.3)


def test_a_target_split_across_processes_serves_the_fixed_policy_only(pinned):
    """Each rank's adaptive policy would decide from its own timings: a group's server (its pair a
    distributed.Leader) runs the fixed policy and refuses the adaptive one in one line."""
    from dflash_core.models import distributed

    with TestClient(server_module.create_app(distributed.Leader(pinned.pair), MODEL)) as c:
        assert c.get("/health").json()["policy"] == "fixed"
        r = completion(c, max_tokens=4, dflash_policy="adaptive")
        assert r.status_code == 400 and r.json()["error"]["param"] == "dflash_policy"
        assert "split across processes" in r.json()["error"]["message"]
    with pytest.raises(server_module.DFlashError, match="split across processes"):
        server_module.create_app(distributed.Leader(pinned.pair), MODEL, policy="adaptive")


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    """(target dir, draft dir) of a random Mamba target, whose cache DFlash cannot roll back."""
    return write_architecture(tmp_path_factory.mktemp("mamba"), "mamba", UNSUPPORTED["mamba"])


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_an_unsupported_architecture_is_one_error_line(mamba, command, capsys):
    target, draft = mamba
    args = ["--model", str(target), "--draft", str(draft)]
    args += ["--port", str(free_port())] if command == "serve" else ["--prompt", "hi"]
    assert main([command, *args]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert errors[0].startswith("error: the target's architecture 'mamba' is not supported")


def test_the_playground_shows_an_unsupported_architecture_as_a_message(pinned, mamba):
    from ui.handlers import Playground
    from ui.models import Catalogue

    target, draft = mamba
    catalogue = Catalogue(pinned.worker, [(str(target), str(draft))], False)
    key = catalogue.default_key()
    html = Playground(catalogue, pinned.worker, 64).select_model(key, 16, 32, progress=lambda *a, **k: None)[0]
    assert "error-panel" in html and "mamba" in html and "is not supported" in html


def test_the_playground_asks_for_the_api_key(pinned):
    """With an API key the mounted playground is no way around it: it wants the key as password."""
    app = serving_app(
        pinned.pair, MODEL, playground={"model": str(pinned.target), "draft": str(pinned.draft)}, api_key=KEY
    )
    assert app.state.playground
    with TestClient(app) as c:
        assert c.get("/config").status_code == 401
        assert c.post("/login", data={"username": "anyone", "password": "wrong"}).status_code == 400
        assert c.post("/login", data={"username": "anyone", "password": KEY}).status_code == 200
        assert c.get("/config").status_code == 200


def test_a_playground_that_cannot_be_built_leaves_the_api_running(pinned, monkeypatch, capsys):
    """One warning line, no playground at /, and the API answers as without one."""
    from types import SimpleNamespace

    from dflash_core import layout
    from dflash_core.errors import DFlashError

    def build_app(*args, **kwargs):
        raise DFlashError("no model pair to serve")

    monkeypatch.setattr(layout, "playground_package", lambda: SimpleNamespace(build_app=build_app))
    app = serving_app(pinned.pair, MODEL, playground={"model": None, "draft": None})
    assert app.state.playground is False
    assert capsys.readouterr().err == "warning: the playground is not served: no model pair to serve\n"
    with TestClient(app) as c:
        assert c.get("/").status_code == 404
        assert c.get("/v1/models").json()["data"][0]["id"] == MODEL
