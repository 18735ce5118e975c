"""Hosting mode: allowlist, no local paths, a prompt cap and a limit on analyses at once."""

from __future__ import annotations

import threading
import time

import pytest

from cwviz.errors import InputError, ModelLoadError
from cwviz.hosting import Policy, analysis_slot, policy_from_env


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
    assert policy.trust_remote_code is False
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
