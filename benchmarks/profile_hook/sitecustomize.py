"""Per-process, per-thread CPU profiles for ``benchmarks/profile_e2e.py`` (never imported
otherwise: that script puts this folder first on ``PYTHONPATH`` of the job it runs).

With ``AF_PROFILE_DIR`` set, every Python process of the job records, at exit:
``<label>.<pid>.json`` (its CPU seconds, user + system, and wall seconds) and, unless
``AF_PROFILE_MODE=cpu``, one cProfile file per thread, ``<label>.<pid>.<thread>.prof``.
cProfile only follows the thread that enabled it, and the work here runs in actor,
publisher and Kafka client threads, so every thread started through ``threading`` gets
its own profiler (``threading.setprofile``). The clock is the thread's CPU time: on a
shared 2-core box the question is where the cores go, not where threads wait.
"""

from __future__ import annotations

import os

if os.environ.get("AF_PROFILE_DIR"):
    import atexit
    import cProfile
    import json
    import re
    import resource
    import sys
    import threading
    import time

    _DIR = os.environ["AF_PROFILE_DIR"]
    _PROFILE = os.environ.get("AF_PROFILE_MODE", "profile") == "profile"
    _T0 = time.monotonic()
    _PROFILES: list[tuple[str, cProfile.Profile]] = []
    _LOCK = threading.Lock()

    def _label() -> str:
        argv = sys.argv
        if "--node-id" in argv:
            return argv[argv.index("--node-id") + 1]
        if "--role" in argv:
            return argv[argv.index("--role") + 1]
        name = os.path.basename(argv[0] or "python")
        if name == "__main__.py":  # python -m pkg sub: "pkg-sub"
            name = "-".join([os.path.basename(os.path.dirname(argv[0]))] + argv[1:2])
        return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "python"

    def _start_thread_profile(frame, event, arg):  # noqa: ARG001 - the sys.setprofile signature
        sys.setprofile(None)
        prof = cProfile.Profile(time.thread_time)
        with _LOCK:
            _PROFILES.append((threading.current_thread().name, prof))
        prof.enable()

    def _dump() -> None:
        label = _label()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        base = os.path.join(_DIR, f"{label}.{os.getpid()}")
        with open(base + ".json", "w") as f:
            json.dump({"label": label, "pid": os.getpid(), "argv": sys.argv, "cpu_user_s": ru.ru_utime,
                       "cpu_sys_s": ru.ru_stime, "wall_s": time.monotonic() - _T0,
                       "max_rss_mb": ru.ru_maxrss / 1024}, f)
        if not _PROFILE:
            return
        with _LOCK:
            profiles = list(_PROFILES)
        for i, (name, prof) in enumerate(profiles):
            prof.disable()
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:60]
            try:
                prof.dump_stats(f"{base}.{i:03d}-{safe}.prof")
            except Exception:  # noqa: BLE001 - a thread still running may leave a profile unreadable
                pass

    if _PROFILE:
        threading.setprofile(_start_thread_profile)
        _main = cProfile.Profile(time.thread_time)
        _PROFILES.append(("MainThread", _main))
        _main.enable()
    os.makedirs(_DIR, exist_ok=True)
    atexit.register(_dump)
