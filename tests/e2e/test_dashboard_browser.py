"""The live dashboard in a real browser (Debian's chromium, driven headless by Playwright) against
a running job: the page renders, a chart gains points as steps land, a poison record shows in
the dead letters, a SIGKILLed RaaS node shows as gone within its heartbeat window while the
others stay alive, and the job still ends done with its conservation audit ok (the killed
node's tasks were redelivered)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: What the machine's closed network needs (no background connections, no update checks).
CHROMIUM_ARGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _read_until(proc: subprocess.Popen, pattern: str, timeout: float, seen: list[str]) -> re.Match:
    """Read the launcher's stdout line by line until ``pattern`` matches one (its lines kept in ``seen``)."""
    deadline = time.monotonic() + timeout
    rx = re.compile(pattern)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError("the launcher ended before printing " + pattern + ":\n" + "".join(seen))
        seen.append(line)
        m = rx.search(line)
        if m:
            return m
    raise AssertionError(f"no {pattern!r} within {timeout} s:\n" + "".join(seen))


@pytest.mark.slow
@pytest.mark.core
def test_the_dashboard_follows_a_running_job_in_a_real_browser(bootstrap, make_job_config, tmp_path):
    from kafka import KafkaProducer
    from playwright.sync_api import sync_playwright

    from astraflow.actors.signing import with_run_keys
    from astraflow.dashboard import alive_window
    from astraflow.topics import ensure_topics, job_topics
    from astraflow.topology.processes import Proc, node_command

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make test` installs it (make browser)"
    cfg = make_job_config({"trainer": {"steps": 24, "checkpoint_every": 8, "snapshot_every": 8},
                           "rollout": {"heartbeat_s": 1.0}}, name="dash")
    window = alive_window(cfg.rollout.heartbeat_s)
    ensure_topics(bootstrap, job_topics(cfg).specs())
    run_dir = tmp_path / "run"
    with_run_keys(cfg, run_dir)  # the run's signing keys, made now: the launcher and the extra node both use them
    # A RaaS node of the job's pool that no launcher supervises: SIGKILLed, it stays gone.
    extra = Proc("raas-extra", "raas", node_command("raas", cfg, bootstrap, run_dir, "raas-extra", []),
                 tmp_path / "raas-extra.log")
    extra.start()
    launcher = subprocess.Popen([sys.executable, "-m", "astraflow", "run", cfg.source, "--bootstrap-servers",
                                 bootstrap, "--run-dir", str(run_dir), "--dashboard", "0", "--quiet"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    lines: list[str] = []
    try:
        url = _read_until(launcher, r"dashboard: (http://\S+)", 300, lines).group(1)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.wait_for_function(f"document.getElementById('job').textContent === {cfg.job!r}", timeout=30_000)
            # a chart gains points as the trainer's steps land
            page.wait_for_function("window.astraflow.points('reward/policy') >= 2", timeout=240_000)
            first = page.evaluate("window.astraflow.points('reward/policy')")
            page.wait_for_function(f"window.astraflow.points('reward/policy') > {first}", timeout=120_000)
            drawn = page.evaluate("window.astraflow.charts.reward.data.datasets[0].data.length")
            assert drawn > first >= 2
            # the rollout-trainer gap, reported by every step, has its own chart
            assert page.evaluate("window.astraflow.charts.mismatch.data.datasets.length") >= 2  # mean, p99
            assert page.evaluate("window.astraflow.points('logp_gap/policy')") >= 1
            # a poison record on `metrics`: the launcher dead-letters it, the page counts and names it
            poison = KafkaProducer(bootstrap_servers=bootstrap)
            poison.send(job_topics(cfg).metrics, b"{]").get(timeout=30)
            poison.close()
            page.wait_for_function("Number(document.getElementById('dlq-count').textContent) >= 1", timeout=60_000)
            assert job_topics(cfg).metrics in page.inner_text("#dlq")
            # both RaaS nodes alive, then one SIGKILLed: gone within the heartbeat window, the other alive
            row = "document.querySelector('#pool tr[data-node=\"{}\"]')"
            for node in ("raas-0", "raas-extra"):
                page.wait_for_function(f"{row.format(node)} && {row.format(node)}.dataset.state === 'alive'",
                                       timeout=240_000)
            extra.popen.send_signal(signal.SIGKILL)
            extra.popen.wait()
            killed = time.monotonic()
            page.wait_for_function(f"{row.format('raas-extra')}.dataset.state === 'gone'",
                                   timeout=(window + 10) * 1000)
            assert time.monotonic() - killed <= window + 10
            assert page.evaluate(f"{row.format('raas-0')}.dataset.state") == "alive"
            assert "gone" in page.inner_text("#pool")
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            if os.environ.get("ASTRAFLOW_DASHBOARD_SCREENSHOT"):  # tools/dashboard_screenshot.py keeps one
                shutil.copy(shot, os.environ["ASTRAFLOW_DASHBOARD_SCREENSHOT"])
            # the job ends done: the page says so before the launcher closes the dashboard
            page.wait_for_function("document.getElementById('state').textContent === 'done'", timeout=300_000)
            out, _ = launcher.communicate(timeout=300)
            lines.append(out)
            # the launcher closed the dashboard after the job's end: the page says so and stops
            # reconnecting (it said "reconnecting…" forever before)
            page.wait_for_function("document.getElementById('link').textContent.startsWith('job done')",
                                   timeout=30_000)
            page.wait_for_timeout(3_000)  # EventSource would have retried by now
            assert page.inner_text("#link") == "job done · the dashboard has stopped"
            browser.close()
        assert launcher.returncode == 0, "".join(lines)
        assert "audit ok" in "".join(lines)
    finally:
        _kill_group(launcher.pid)
        if extra.popen is not None and extra.popen.poll() is None:
            extra.popen.kill()
