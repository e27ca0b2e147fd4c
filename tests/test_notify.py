"""Notifications (sweeps/running/notify.py) through Apprise to a real local HTTP receiver: what a sweep
sends, what a dead receiver does to it (nothing), and how URLs are configured."""

from __future__ import annotations

import socket

import pytest

from seqae_errors import ConfigError
from sweeps.running.notify import ENV, Notifier, resolve
from sweeps.spec import sweep as spec_lib
from tests.sweep_helpers import STUDIES, run_args, seqae


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_chosen_events_reach_the_receiver(receiver):
    notifier = Notifier("demo", [receiver.url], events=("best", "end"))
    notifier.send("best", "a new best, trial 3", "val_token_accuracy 0.9100")
    notifier.send("failed", "trial 4 failed", "NonFiniteLossError")  # not chosen: not sent
    notifier.send("end", "the sweep is complete", "best: trial 3")
    notifier.close()
    assert [(m["title"], m["message"]) for m in receiver.received] == [
        ("seqae demo: a new best, trial 3", "val_token_accuracy 0.9100"),
        ("seqae demo: the sweep is complete", "best: trial 3"),
    ]
    assert (notifier.sent, notifier.failed) == (2, 0)


def test_a_dead_receiver_costs_the_sender_nothing_and_is_counted():
    notifier = Notifier("demo", [f"json://127.0.0.1:{closed_port()}/hook"])
    notifier.send("end", "the sweep is complete", "")  # queued: returns at once
    notifier.close()
    assert (notifier.sent, notifier.failed) == (0, 1)


def test_urls_come_from_the_environment_private_files_or_both(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("MY_HOOK", "json://example.invalid/a")
    monkeypatch.setenv(ENV, "json://example.invalid/b json://example.invalid/c")
    monkeypatch.delenv("UNSET_HOOK", raising=False)
    private, shared = tmp_path / "private", tmp_path / "shared"
    for path, mode in ((private, 0o600), (shared, 0o644)):
        path.write_text("json://example.invalid/d\n")
        path.chmod(mode)
    assert resolve(
        ["env:MY_HOOK", "env:UNSET_HOOK", f"file:{private}", f"file:{shared}", f"file:{tmp_path / 'absent'}"]
    ) == [
        "json://example.invalid/a",
        "json://example.invalid/d",
        "json://example.invalid/b",
        "json://example.invalid/c",
    ]
    assert "notify.urls[1]: $UNSET_HOOK is not set" in caplog.text
    assert f"notify.urls[3]: {shared} may be read by others (mode 644); `chmod 600` it" in caplog.text
    assert f"notify.urls[4]: {tmp_path / 'absent'} cannot be read" in caplog.text


@pytest.mark.parametrize(
    "notify, says",
    [
        (
            "{urls: ['json://h/secret-token']}",
            "notify: urls\\[0\\] is a URL itself; give where the driver reads it instead: env:NAME .* or file:/PATH",
        ),
        ("{urls: ['slack://secret-token/B/C']}", "env:NAME .* or file:/PATH"),
        ("{urls: ['env:not a name']}", "env:NAME needs an environment variable's name"),
        ("{urls: ['file:relative/path']}", "file:/PATH needs an absolute path on the cluster"),
        (
            "{urls: ['env:HOOK'], events: [best, sometimes]}",
            "notify.events\\[1\\]='sometimes' must be 'best', 'failed', 'stopped' or 'end'",
        ),
    ],
)
def test_a_url_or_a_bad_reference_in_the_notify_section_is_refused_by_key_without_repeating_it(notify, says):
    with pytest.raises(ConfigError, match=says) as refused:
        spec_lib.load(STUDIES / "quickstart.yaml", [f"notify={notify}"])
    assert "secret-token" not in str(refused.value)


@pytest.mark.slow
def test_a_sweep_tells_its_receiver_and_finishes_the_same_when_the_receiver_is_down(tmp_path, receiver, monkeypatch):
    workspace = tmp_path / "ws"
    told = seqae(*run_args(workspace, "told", "trials.total=2", "train.epochs=1", receiver.notify()))
    assert told.returncode == 0, told.stdout[-3000:] + told.stderr[-3000:]
    titles = receiver.titles()
    # the first result, trial 0's (one trial at a time), is a new best
    assert titles[0] == "seqae told: a new best, trial 0", titles
    assert titles[-1] == "seqae told: the sweep is complete", titles
    assert "best: trial" in receiver.received[-1]["message"]

    dead = f"json://127.0.0.1:{closed_port()}/hook"
    monkeypatch.setenv(ENV, dead)  # read as the driver starts: the sweep runs in this process, as the first did
    alone = seqae(*run_args(workspace, "alone", "trials.total=2", "train.epochs=1"))
    assert alone.returncode == 0, alone.stdout[-3000:] + alone.stderr[-3000:]
    assert "sweep alone: complete" in alone.stdout and "could not be delivered" in alone.stdout + alone.stderr
