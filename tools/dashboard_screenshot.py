"""Take the dashboard screenshot (``benchmarks/results/dashboard.png``, in docs/dashboard.md) of a real run.

Runs ``astraflow run CONFIG --dashboard`` (the demo's config by default, ``--steps`` versions),
opens the page in Debian's chromium (headless, driven by Playwright), waits until the trainer
has reached ``--at`` of its steps and the evaluator has reported held-out accuracy twice, saves
a full-page screenshot, then lets the run finish (``--stop`` ends it with SIGTERM instead).

    .venv/bin/python tools/dashboard_screenshot.py [--config examples/arithmetic_grpo.yaml]
        [--steps 120] [--out benchmarks/results/dashboard.png]
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "arithmetic_grpo.yaml"))
    ap.add_argument("--steps", type=int, default=120, help="trainer.steps of the run (default 120)")
    ap.add_argument("--at", type=float, default=0.9, help="screenshot once this fraction of the steps trained")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dashboard.png"))
    ap.add_argument("--stop", action="store_true", help="stop the run (SIGTERM) after the screenshot")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("Debian's chromium is missing: `make browser` installs it")
    every = max(1, args.steps // 8)
    run = subprocess.Popen([sys.executable, "-m", "astraflow", "run", args.config, "--dashboard", "0", "--quiet",
                            "--set", f"trainer.steps={args.steps}", "--set", f"eval.every={every}"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    url = None
    for line in run.stdout:
        print(line, end="", flush=True)
        m = re.search(r"dashboard: (http://\S+)", line)
        if m:
            url = m.group(1)
            break
    if url is None:
        raise SystemExit(f"the run ended without a dashboard (exit {run.wait()})")
    def echo() -> None:  # keep reading the run's output (a full pipe would stall it)
        for rest in run.stdout:
            print(rest, end="", flush=True)

    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    target = int(args.steps * args.at)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.on("pageerror", lambda e: print(f"page error: {e}", flush=True))
        page.on("console", lambda m: print(f"page console: {m.text}", flush=True) if m.type == "error" else None)
        page.goto(url)
        page.wait_for_function(f"window.astraflow.points('reward/policy') >= {target} && "
                               "window.astraflow.points('heldout/policy') >= 2", timeout=3_600_000, polling=1000)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=args.out, full_page=True)
        browser.close()
    print(f"screenshot: {args.out}", flush=True)
    if args.stop:
        run.send_signal(signal.SIGTERM)
    code = run.wait()
    reader.join(timeout=10)
    return code


if __name__ == "__main__":
    sys.exit(main())
