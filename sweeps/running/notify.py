"""Telling people when a sweep does something worth knowing: a new best trial, a failed trial, the
sweep stopping new trials (its target, its budget, `seqae sweep stop`) and its end. Delivery goes
through Apprise, which speaks to Slack, e-mail, Matrix, Discord, ntfy, plain JSON webhooks and
a hundred more services by URL.

Where the URLs come from: the sweep file's ``notify.urls``, each a reference the driver reads (an
entry ``env:NAME`` reads the URL from the environment variable NAME, ``file:/PATH`` from a file
only its owner may read), so that a token never sits in a file that is shared or committed, nor in
the sweep's records; and the environment variable ``SEQAE_NOTIFY_URLS`` (URLs separated by spaces)
of a driver run here (``submit`` does not pass it to a job, whose environment the Jobs API shows).

A notification is sent from a thread of its own, so a slow or dead service never stops or slows
the sweep; what cannot be delivered is logged, and at the sweep's end the driver waits a few
seconds at most for what is still being sent."""

from __future__ import annotations

import logging
import os
import queue
import threading
from pathlib import Path

import apprise

from sweeps.spec.sections import EVENTS, Event

log = logging.getLogger(__name__)

ENV = "SEQAE_NOTIFY_URLS"
_DONE = None


def resolve(urls: list[str]) -> list[str]:
    """The URLs to notify: the sweep file's (``env:NAME`` read from the environment, ``file:/PATH``
    from the file; one unset, missing or readable by others is skipped with a warning) and those in
    ``SEQAE_NOTIFY_URLS``."""
    resolved = []
    for n, url in enumerate(urls):
        if url.startswith("env:"):
            url = os.environ.get(url[4:], "")
            if not url:
                log.warning("notify.urls[%d]: $%s is not set; no notifications go there", n, urls[n][4:])
        elif url.startswith("file:"):
            url = _read_private(n, Path(url[5:]))
        if url:
            resolved.append(url)
    return resolved + os.environ.get(ENV, "").split()


def _read_private(n: int, path: Path) -> str:
    """The URL in ``path``, or "" (with a warning) where it is missing or others may read it."""
    try:
        mode = path.stat().st_mode
        if mode & 0o077:
            log.warning(
                "notify.urls[%d]: %s may be read by others (mode %o); `chmod 600` it; no notifications go there",
                n,
                path,
                mode & 0o777,
            )
            return ""
        return path.read_text().strip()
    except OSError as exc:
        log.warning("notify.urls[%d]: %s cannot be read (%s); no notifications go there", n, path, exc.strerror)
        return ""


class Notifier:
    """Sends a sweep's notifications in the background; a no-op without URLs."""

    def __init__(self, sweep: str, urls: list[str], events: tuple[Event, ...] = EVENTS) -> None:
        self.sweep, self.events = sweep, set(events)
        self.apprise = apprise.Apprise()
        for n, url in enumerate(urls):
            if not self.apprise.add(url):
                log.warning("notification URL %d is not one Apprise understands; it is skipped", n)
        self.sent = self.failed = 0
        self.queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self.thread: threading.Thread | None = None
        if len(self.apprise):
            self.thread = threading.Thread(target=self._deliver, name="seqae-notify", daemon=True)
            self.thread.start()

    def send(self, event: Event, title: str, body: str) -> None:
        """Queue a notification of ``event`` (one of :data:`EVENTS`); returns at once."""
        if self.thread is not None and event in self.events:
            self.queue.put((f"seqae {self.sweep}: {title}", body))

    def _deliver(self) -> None:
        while (item := self.queue.get()) is not _DONE:
            title, body = item
            try:
                delivered = bool(self.apprise.notify(title=title, body=body))
            except Exception:  # noqa: BLE001 - a notification never stops the sweep
                log.exception("sending a notification failed")
                delivered = False
            if delivered:
                self.sent += 1
            else:
                self.failed += 1
                log.warning("a notification (%s) could not be delivered", title)

    def close(self, timeout: float = 10.0) -> None:
        """Let what is queued go out, waiting ``timeout`` seconds at most."""
        if self.thread is not None:
            self.queue.put(_DONE)
            self.thread.join(timeout)
