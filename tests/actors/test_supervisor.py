"""The supervisor restarts failing actors with backoff and gives up with a clear reason."""

import threading

import pytest

from astraflow.actors.supervisor import ChildSpec, LoopActor, Outcome, run_supervised
from astraflow.workflows.datasets import DatasetError


class Flaky(LoopActor):
    """Fails its first ``fail_times`` starts (shared counter), then finishes after 3 steps."""

    def __init__(self, supervisor, name, starts: list, fail_times: int) -> None:
        super().__init__(supervisor, name)
        self.starts, self.fail_times, self.steps = starts, fail_times, 0

    def setup(self) -> None:
        self.starts.append(1)

    def step(self) -> None:
        if len(self.starts) <= self.fail_times:
            raise RuntimeError(f"boom #{len(self.starts)}")
        self.steps += 1
        if self.steps == 3:
            self.finished = True


def test_failed_actor_is_restarted_until_it_finishes():
    starts: list = []
    spec = ChildSpec("flaky", lambda sup, name: Flaky.start(sup, name, starts, 2))
    fatal = run_supervised([spec], threading.Event(), backoff_s=0.01)
    assert fatal is None
    assert len(starts) == 3  # two failures, then a clean run


class BadSetup(LoopActor):
    def __init__(self, supervisor, name, starts: list) -> None:
        super().__init__(supervisor, name)
        self.starts = starts

    def setup(self) -> None:
        self.starts.append(1)
        raise OSError("cannot open the model")

    def step(self) -> None:
        raise AssertionError("never reached")


def test_setup_failure_reaches_the_supervisor():
    starts: list = []
    spec = ChildSpec("bad", lambda sup, name: BadSetup.start(sup, name, starts))
    fatal = run_supervised([spec], threading.Event(), max_restarts=1, backoff_s=0.01)
    assert fatal is not None and "OSError: cannot open the model" in fatal
    assert len(starts) == 2


def test_supervisor_gives_up_after_max_restarts():
    starts: list = []
    spec = ChildSpec("doomed", lambda sup, name: Flaky.start(sup, name, starts, 100))
    fatal = run_supervised([spec], threading.Event(), max_restarts=2, backoff_s=0.01)
    assert fatal is not None
    assert "doomed failed 3 times" in fatal and "RuntimeError: boom #3" in fatal
    assert len(starts) == 3


class BadInput(LoopActor):
    """Fails in setup the way a dataset with a broken row does: deterministically."""

    def __init__(self, supervisor, name, starts: list, wrap: bool) -> None:
        super().__init__(supervisor, name)
        self.starts, self.wrap = starts, wrap

    def setup(self) -> None:
        self.starts.append(1)
        try:
            raise DatasetError("d.jsonl:2: not JSON: unexpected character")
        except DatasetError as e:
            if self.wrap:  # a fatal cause behind a generic error is still fatal
                raise RuntimeError("loading prompts failed") from e
            raise

    def step(self) -> None:
        raise AssertionError("never reached")


@pytest.mark.parametrize("wrap", [False, True])
def test_fatal_error_is_not_restarted(wrap):
    starts: list = []
    outcome = Outcome()
    spec = ChildSpec("dataflow", lambda sup, name: BadInput.start(sup, name, starts, wrap))
    fatal = run_supervised([spec], threading.Event(), outcome, max_restarts=5, backoff_s=0.01)
    assert fatal == "d.jsonl:2: not JSON: unexpected character"
    assert len(starts) == 1
    assert (outcome.retriable, outcome.child) == (False, "dataflow")


def test_giving_up_on_retriable_errors_stays_retriable():
    outcome = Outcome()
    spec = ChildSpec("doomed", lambda sup, name: Flaky.start(sup, name, [], 100))
    assert run_supervised([spec], threading.Event(), outcome, max_restarts=1, backoff_s=0.01)
    assert outcome.retriable and outcome.child == "doomed"


def test_stop_event_ends_a_never_finishing_actor():
    class Forever(LoopActor):
        def step(self):
            pass

    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    assert run_supervised([ChildSpec("f", lambda sup, name: Forever.start(sup, name))], stop) is None


@pytest.mark.parametrize("bad,needle", [
    ("job: x\ntrainer:\n  stepz: 3\n", "trainer.stepz: unknown key"),
    ("job: x\ntrainer:\n  engine:\n    lr: fast\n", "trainer.engine.lr: expected float"),
    ("mode: async\n", "job: required key is missing"),
    ("job: x\nmode: turbo\n", "mode: must be one of ['async', 'sync']"),
    ("job: x\ntrainer:\n  engine:\n    loss: nope\n", "trainer.engine: trainer.loss must be one of"),
    ("job: x\ntrainer:\n  cpu_nice: 25\n", "trainer.cpu_nice: must be in [0, 19], got 25"),
    ("job: 'run:2'\n", "job: 'run:2' is part of Kafka topic names"),
    ("job: x\npolicy: a/b\n", "policy: 'a/b' is part of Kafka topic names"),
])
def test_bad_config_names_key_and_file(tmp_path, bad, needle):
    from astraflow.config import ConfigError, load_config
    path = tmp_path / "job.yaml"
    path.write_text(bad)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert needle in str(e.value)
    assert str(path) in str(e.value)


def test_example_configs_load():
    from pathlib import Path

    from astraflow.config import load_config
    # topology_*.yaml are deployment files (tests/topology loads them), not job configs
    examples = sorted(p for p in (Path(__file__).parents[2] / "examples").glob("*.yaml")
                      if not p.name.startswith("topology_"))
    assert examples
    for p in examples:
        cfg = load_config(p)
        assert cfg.job and cfg.trainer.steps > 0


def test_lower_priority_lowers_every_thread_of_the_process_but_the_kept():
    import json
    import os
    import subprocess
    import sys
    # in a child: niceness only goes up without privileges, and this process must keep its own
    code = """
import json, os, threading
from astraflow.actors.common import lower_priority
nice = lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
seen, go, done = {}, threading.Event(), threading.Event()
def other():
    go.wait(); seen["other"] = nice(); done.set()
kept_go, kept_done = threading.Event(), threading.Event()
def kept():
    kept_go.wait(); seen["kept"] = nice()
    child = threading.Thread(target=lambda: seen.setdefault("kept_child", nice())); child.start(); child.join()
    kept_done.set()
t = threading.Thread(target=other); t.start()
k = threading.Thread(target=kept); k.start()
before = nice()
lower_priority(5, keep=[k.native_id])
go.set(); done.wait(); kept_go.set(); kept_done.wait()
later = threading.Thread(target=lambda: seen.setdefault("later", nice())); later.start(); later.join()
print(json.dumps({"before": before, "main": nice(), **seen}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    expected = min(19, out["before"] + 5)
    assert out == {"before": out["before"], "main": expected, "other": expected, "later": expected,
                   # a kept thread (the weight publisher's) and what it starts (its codec threads)
                   "kept": out["before"], "kept_child": out["before"]}
    assert os.getpriority(os.PRIO_PROCESS, 0) == out["before"]  # this process is untouched


def test_lower_thread_priority_lowers_the_calling_thread_and_what_it_starts_only():
    import json
    import subprocess
    import sys
    # the evaluator's way: its actor thread and the threads it starts, not the dataflow beside it
    code = """
import json, os, threading
from astraflow.actors.common import lower_thread_priority
nice = lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
seen = {}
peer_go, peer_done = threading.Event(), threading.Event()
def peer():
    peer_go.wait(); seen["peer"] = nice(); peer_done.set()
def evaluator():
    lower_thread_priority(7)
    seen["self"] = nice()
    child = threading.Thread(target=lambda: seen.setdefault("child", nice())); child.start(); child.join()
p = threading.Thread(target=peer); p.start()
before = nice()
e = threading.Thread(target=evaluator); e.start(); e.join()
peer_go.set(); peer_done.wait()
print(json.dumps({"before": before, "main": nice(), **seen}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    lowered = min(19, out["before"] + 7)
    assert out == {"before": out["before"], "main": out["before"], "peer": out["before"], "self": lowered,
                   "child": lowered}
