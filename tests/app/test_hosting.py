"""Hosting mode: allowlist, no local paths, a prompt cap and a limit on analyses at once."""

from __future__ import annotations

import inspect
import threading
import time

import pytest

from cwviz.app.hosting import Policy, analysis_slot, policy_from_env
from cwviz.core.loading.models import load_model
from cwviz.core.util.errors import InputError, ModelLoadError
from tests.helpers import no_hooks, run_together
from tests.helpers.app import APP


def test_off_by_default(monkeypatch):
    for name in ("CWVIZ_HOSTED", "CWVIZ_MAX_CONCURRENT", "CWVIZ_ALLOWED_MODELS"):
        monkeypatch.delenv(name, raising=False)
    policy = policy_from_env()
    assert not policy.hosted and policy.max_concurrent is None
    policy.check_model("/any/local/path")  # no restriction


def test_hosted_allowlist_and_defaults(monkeypatch):
    monkeypatch.setenv("CWVIZ_HOSTED", "1")
    monkeypatch.setenv("CWVIZ_ALLOWED_MODELS", "embedded, gpt2")
    monkeypatch.delenv("CWVIZ_APP_MAX_TOKENS", raising=False)
    monkeypatch.delenv("CWVIZ_MAX_CONCURRENT", raising=False)
    policy = policy_from_env()
    assert policy.allowed_models == ("embedded", "gpt2")
    assert policy.max_tokens == 512 and policy.max_concurrent == 2
    # trust_remote_code is never on: the dashboard loads models with load_model's default, which is off.
    assert inspect.signature(load_model).parameters["trust_remote_code"].default is False
    policy.check_model("gpt2")
    with pytest.raises(ModelLoadError, match="not available on this server; choose one of: embedded, gpt2"):
        policy.check_model("/home/me/model")
    with pytest.raises(ModelLoadError):
        policy.check_model("meta-llama/Llama-3.1-8B")


def test_hosted_refuses_local_paths_in_the_allowlist(monkeypatch):
    monkeypatch.setenv("CWVIZ_HOSTED", "1")
    monkeypatch.setenv("CWVIZ_ALLOWED_MODELS", "embedded,/srv/models/x")
    with pytest.raises(InputError, match="may not name local paths"):
        policy_from_env()


def test_bad_numbers_are_explained(monkeypatch):
    monkeypatch.setenv("CWVIZ_MAX_CONCURRENT", "many")
    with pytest.raises(InputError, match="CWVIZ_MAX_CONCURRENT must be a whole number"):
        policy_from_env()


def test_at_most_n_analyses_at_once_and_the_rest_are_refused_after_waiting():
    policy = Policy(max_concurrent=2, queue_seconds=0.5)
    running, peak, refused = [0], [0], []
    lock = threading.Lock()

    def work():
        try:
            with analysis_slot(policy):
                with lock:
                    running[0] += 1
                    peak[0] = max(peak[0], running[0])
                time.sleep(1.0)
                with lock:
                    running[0] -= 1
        except InputError as err:
            refused.append(str(err))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 2
    assert len(refused) == 2 and "the server is busy" in refused[0]
    with analysis_slot(policy):  # slots are released afterwards
        pass


def test_eight_sessions_through_the_services_get_the_sequential_numbers(embedded):
    """Eight threads, eight prompts, the service functions the app uses, one shared model."""
    import numpy as np

    import cwviz
    from cwviz.app import services

    services.get_analysis.clear()
    prompts = [f"Session {i} asks: what is {i} times {i + 3}? The answer is {i * (i + 3)}." for i in range(8)]
    expected = [cwviz.analyze(embedded, p) for p in prompts]
    results, errors = run_together(
        lambda i: services.get_analysis(services.Request("embedded", "cpu", "auto", prompts[i])).analysis, range(8)
    )
    assert not errors, errors
    for i in range(8):
        assert results[i].text == prompts[i]
        for layer in (5, 25):
            np.testing.assert_allclose(
                results[i].contributions(layer), expected[i].contributions(layer), rtol=1e-5, atol=1e-6
            )
    model = services.get_bundle("embedded", "cpu", "auto").model
    assert no_hooks(model)


def test_hosted_app_offers_only_the_allowed_models_and_refuses_others(monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("CWVIZ_HOSTED", "1")
    monkeypatch.setenv("CWVIZ_ALLOWED_MODELS", "embedded")
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["model"] = "/etc"
    at.run()
    assert not at.exception
    assert any("not available on this server" in e.value for e in at.error)
    model = next(w for w in at.sidebar.selectbox if w.label == "Model")
    assert list(model.options) == ["embedded"]
    model.set_value("embedded")
    at.sidebar.button[0].click().run()
    assert not at.exception and not at.error
    assert at.get("vega_lite_chart")


def test_hosted_pages_do_not_read_server_files(monkeypatch, tmp_path):
    from cwviz.app import hosting, services, sink_services

    path = tmp_path / "prompts.jsonl"
    path.write_text('{"text": "a secret on the server"}\n', encoding="utf-8")
    monkeypatch.delenv("CWVIZ_HOSTED", raising=False)
    assert hosting.policy_from_env().server_files
    monkeypatch.setenv("CWVIZ_HOSTED", "1")
    assert not hosting.policy_from_env().server_files
    request = services.Request("embedded", "cpu", "auto", "A short prompt to pool with.")
    with pytest.raises(InputError, match="does not read files by path"):
        sink_services.sink_tables(request, "0", str(path), 1)
