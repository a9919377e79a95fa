"""The episode runner: the one-role case is the batched RLVR rollout, multi-role episodes
return one group per role with loss masks, and a broken episode fails alone."""

from __future__ import annotations

import threading
import time

import pytest

from astraflow.actors.episodes import CallBatcher, EpisodeRunner
from astraflow.engines.base import SamplingParams
from astraflow.topics import Task
from astraflow.workflows import arithmetic
from astraflow.workflows.api import Episode, EpisodeResult, Trajectory, WORKFLOWS, workflow
from astraflow.workflows.seeds import task_seeds

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 6}


@pytest.fixture(scope="module")
def tok_engine(tokenizer_and_engine):
    return tokenizer_and_engine


class CountingEngine:
    """The real engine, counting its calls (how the batcher coalesced them)."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, []

    def generate(self, prompts, params, seeds=None):
        self.calls.append(len(prompts))
        return self.engine.generate(prompts, params, seeds=seeds)

    @property
    def version(self):
        return self.engine.version


def runner(tok, engine, policy="p", **kw) -> EpisodeRunner:
    return EpisodeRunner(policy, "node-test", engine, tok, 7, engine_lock=threading.Lock(), **kw)


def rlvr_task(i: int, n: int = 4) -> Task:
    return Task(f"t{i:07d}-p{i}", f"p{i}", "p", f"{i}+{i + 3}=", str(2 * i + 3), n, SAMPLING)


def test_one_role_episodes_are_the_batched_rlvr_rollout(tok_engine):
    tok, engine = tok_engine
    tasks = [rlvr_task(i) for i in range(5)]
    counting = CountingEngine(engine)
    got = runner(tok, counting).run(tasks)
    assert counting.calls == [4 * 5], "the five episodes' rows must be coalesced into one engine call"
    # The batched RLVR rollout by hand: every sample of the poll in one call, each row seeded
    # (job seed, task id, sample index), scored by the exact-match reward.
    prompts = [tok.encode(t.prompt, add_special_tokens=False) for t in tasks]
    gens = engine.generate([ids for t, ids in zip(tasks, prompts) for _ in range(t.n_samples)],
                           SamplingParams.from_mapping(SAMPLING, stop_token_ids=(tok.eos_token_id,)),
                           seeds=[s for t in tasks for s in task_seeds(7, t.task_id, t.n_samples)])
    for i, (task, groups) in enumerate(zip(tasks, got)):
        (g,) = groups
        want = gens[4 * i:4 * i + 4]
        assert (g.task_id, g.prompt_ids, g.role, g.roles, g.stats) == (task.task_id, prompts[i], "", [], {})
        assert [(s.tokens, s.logprobs, s.versions, s.reward, s.loss_mask) for s in g.samples] == \
               [(list(w.tokens), list(w.logprobs), [w.version] * len(w.tokens),
                 arithmetic.reward(tok.decode(list(w.tokens), skip_special_tokens=True), task.answer), [])
                for w in want]


def test_batch_invariant_calls_the_engine_once_per_episode_call(tok_engine):
    tok, engine = tok_engine
    counting = CountingEngine(engine)
    runner(tok, counting, batch_invariant=True).run([rlvr_task(i) for i in range(3)])
    assert counting.calls == [4, 4, 4]


def test_solver_verifier_returns_a_group_per_role_with_masks(tok_engine):
    tok, engine = tok_engine
    roles = {"solver": "p", "verifier": "p"}
    tasks = [Task(f"t{i:07d}-p{i}", f"p{i}", "p", f"{i}+{i}=", str(2 * i), 6, SAMPLING, workflow="solver_verifier",
                  roles=roles, train=["solver", "verifier"]) for i in range(3)]
    out = runner(tok, engine).run(tasks)
    for task, groups in zip(tasks, out):
        by_role = {g.role: g for g in groups}
        assert set(by_role) == {"solver", "verifier"}
        solver, verifier = by_role["solver"], by_role["verifier"]
        assert solver.group_key == f"{task.task_id}/solver" and verifier.status == "ok"
        assert len(verifier.samples) == 6
        firsts = [s for s in solver.samples if s.info["attempt"] == 1]
        retries = [s for s in solver.samples if s.info["attempt"] == 2]
        assert len(firsts) == 6
        # one retry per rejected first attempt, and only those
        assert len(retries) == sum(s.info["verdict"] == "reject" for s in verifier.samples)
        for s in retries:
            writers = [solver.roles[i] for i in s.token_roles]
            assert len(s.loss_mask) == len(s.tokens) and 0 < sum(s.loss_mask) < len(s.tokens)
            # exactly the solver's own second answer is trained on
            assert all((m == 1) == (w == "solver" and j >= len(s.tokens) - sum(s.loss_mask))
                       for j, (m, w) in enumerate(zip(s.loss_mask, writers)))
            assert "verifier" in writers and "env" in writers
            assert all(v == 0 for v, m in zip(s.versions, s.loss_mask) if not m)
        for s in verifier.samples:  # verifier reward: verdict parsed and equal to first-attempt correctness
            right = s.info["verdict"] != "unparsed" and (s.info["verdict"] == "approve") == s.info["first_correct"]
            assert s.reward == (1.0 if right else 0.0)
        assert 0.0 <= solver.stats["team_reward"] <= 1.0


def test_a_broken_episode_fails_alone_with_a_failed_group_per_trained_role(tok_engine):
    tok, engine = tok_engine
    if "test_breaks_on_7" not in WORKFLOWS:
        @workflow("test_breaks_on_7", roles=("solver",))
        def breaks(ep: Episode) -> EpisodeResult:
            turns = ep.roles["solver"].generate([ep.encode(ep.prompt)] * ep.n_samples)
            if ep.prompt.startswith("7+"):
                raise ValueError("tool crashed")
            return EpisodeResult({"solver": [Trajectory.of(t, 0.0) for t in turns]})
    tasks = [Task(f"t{i:07d}-p{i}", f"p{i}", "p", f"{i}+1=", str(i + 1), 2, SAMPLING, workflow="test_breaks_on_7")
             for i in (6, 7, 8)]
    out = runner(tok, engine).run(tasks)
    assert [g.status for (g,) in out] == ["ok", "failed", "ok"]
    assert "tool crashed" in out[1][0].error


def test_the_batcher_waits_for_every_running_episode_before_calling():
    class Recorder:
        version = 0

        def __init__(self):
            self.calls = []

        def generate(self, prompts, params, seeds=None):
            self.calls.append([p[0] for p in prompts])
            from astraflow.engines.base import Generation
            return [Generation(tuple(p), (1,), (0.0,), "stop") for p in prompts]

    from astraflow.engines.base import SamplingParams
    eng = Recorder()
    b = CallBatcher(eng, threading.Lock())
    for _ in range(3):
        b.enter()
    results = {}

    def ep(i):
        results[i] = b.generate(i, [[i]], SamplingParams(), [i])
        b.leave()

    threads = [threading.Thread(target=ep, args=(i,)) for i in (2, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert eng.calls == [[0, 1, 2]] and sorted(results) == [0, 1, 2]


def test_a_rejected_answer_is_retried_with_the_verdict_as_masked_context(tok_engine):
    """A verifier that rejects everything (a scripted role: the workflow's rule is under test)."""
    from astraflow.workflows.api import EngineRole, Turn, get_workflow, run_episode

    tok, engine = tok_engine

    class AlwaysReject:
        name, policy = "verifier", "verifier"

        def generate(self, prompts, *, seeds, max_new_tokens=None, temperature=None):
            ids = tuple(tok.encode("<R>", add_special_tokens=False))
            return [Turn(tuple(p), ids, (-0.1,) * len(ids), 3, "stop", "<R>", "verifier", "verifier") for p in prompts]

    roles = {"solver": EngineRole("solver", "solver", engine, tok, SAMPLING), "verifier": AlwaysReject()}
    ep = Episode("t0000001-p1", "3+4=", "7", 4, roles, tok, {"_job_seed": 7})
    result = run_episode(get_workflow("solver_verifier"), ep, 7)
    solver = result.trajectories["solver"]
    first, retry = solver[0::2], solver[1::2]
    assert [t.info["attempt"] for t in solver] == [1, 2] * 4 and result.metrics["retries"] == 1.0
    for f, r in zip(first, retry):
        own = [tok_id for tok_id, m in zip(r.tokens, r.loss_mask) if m]
        eos = tok.eos_token_id
        # the context is: first answer | <R> ; problem  — and only the second answer is trained
        context = [t for t, m in zip(r.tokens, r.loss_mask) if not m]
        assert tok.decode(context) == tok.decode([t for t in f.tokens if t != eos]) + "|<R>;3+4="
        assert "verifier" in r.token_roles and "env" in r.token_roles
        assert r.reward == (1.0 if tok.decode(own, skip_special_tokens=True).strip() == "7" else 0.0)
    # a reject is right exactly when the first answer was wrong
    assert [v.reward for v in result.trajectories["verifier"]] == [1.0 - f.reward for f in first]


def test_two_concurrent_calls_of_one_episode_are_refused_and_the_first_still_returns(tok_engine):
    """Before: the second call overwrote the first in the batcher and the first waited forever."""
    tok, engine = tok_engine
    second_tried = threading.Event()
    if "test_two_threads" not in WORKFLOWS:
        @workflow("test_two_threads", roles=("solver",))
        def two_threads(ep: Episode) -> EpisodeResult:
            solver = ep.roles["solver"]
            if ep.prompt.startswith("1+"):  # the other episode: calls once the first has tried its second
                second_tried.wait(10)
                turns = solver.generate([ep.encode(ep.prompt)])
                return EpisodeResult({"solver": [Trajectory.of(t, 0.0) for t in turns]})
            out: dict = {}

            def call(name):
                try:
                    out[name] = solver.generate([ep.encode(ep.prompt)])
                except Exception as e:  # noqa: BLE001 - inspected below
                    out[name] = e
                finally:
                    if name == "second":
                        second_tried.set()
            first = threading.Thread(target=call, args=("first",), daemon=True)
            first.start()
            time.sleep(0.5)  # the first call is waiting for the other episode's
            second = threading.Thread(target=call, args=("second",), daemon=True)
            second.start()
            second.join(20)
            first.join(20)
            if first.is_alive():
                raise RuntimeError("the first call never returned")
            assert isinstance(out["first"], list) and len(out["first"]) == 1
            raise out["second"] if isinstance(out["second"], Exception) else RuntimeError("second call accepted")
    tasks = [Task(f"t{i:07d}-p{i}", f"p{i}", "p", f"{i}+1=", str(i + 1), 1, SAMPLING, workflow="test_two_threads")
             for i in (0, 1)]
    out = runner(tok, engine).run(tasks)
    (g0,), (g1,) = out
    assert g1.status == "ok"
    assert g0.status == "failed"
    assert "ConcurrentGenerateError" in g0.error and "must be sequential" in g0.error, g0.error


def test_a_call_waits_for_the_other_episodes_at_most_the_bound():
    from astraflow.engines.base import Generation

    class Instant:
        version = 0

        def generate(self, prompts, params, seeds=None):
            return [Generation(tuple(p), (1,), (0.0,), "stop") for p in prompts]

    b = CallBatcher(Instant(), threading.Lock(), episodes=2)  # episode 1 never calls
    b.timeout_s = 1.0
    got: dict = {}

    def call():
        try:
            got["out"] = b.generate(0, [[3]], SamplingParams(), [1])
        except Exception as e:  # noqa: BLE001 - inspected below
            got["error"] = e
    t = threading.Thread(target=call, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(15)
    assert not t.is_alive(), "the call waited forever"
    from astraflow.actors.episodes import EngineWaitTimeout
    assert isinstance(got.get("error"), EngineWaitTimeout) and time.monotonic() - t0 < 10
    assert "waited 1s for the batched engine call" in str(got["error"])
    assert "1 of the 2 running episode(s) never called generate" in str(got["error"])
    b.leave()  # episode 1 finishes: the batcher is usable again, nothing of episode 0 left in it
    assert [g.tokens for g in b.generate(0, [[4]], SamplingParams(), [2])] == [(1,)]


def test_a_per_call_temperature_the_trainer_cannot_reproduce_is_refused(tok_engine):
    """The trainer recomputes logprobs at the policy's rollout temperature: a sample drawn at
    another would be trained on wrong importance ratios. Before: accepted silently."""
    tok, engine = tok_engine

    class RecordingClient:  # the remote path must refuse before anything is sent
        def __init__(self):
            self.sent = []

        def generate(self, role, policy, episode_id, prompts, seeds, sampling, tokenizer):
            self.sent.append(sampling)
            raise AssertionError("nothing should be sent")

    if "test_per_call_temperature" not in WORKFLOWS:
        @workflow("test_per_call_temperature", roles=("solver", "verifier"))
        def hot(ep: Episode) -> EpisodeResult:
            role = ep.roles[ep.params["role"]]
            turns = role.generate([ep.encode(ep.prompt)], temperature=ep.params["t"], max_new_tokens=3)
            assert all(len(t.tokens) <= 3 for t in turns)
            return EpisodeResult({role.name: [Trajectory.of(t, 0.0) for t in turns]})

    def task(i, role, t, roles):
        return Task(f"t{i:07d}-p{i}", f"p{i}", "p", f"{i}+1=", str(i + 1), 1, SAMPLING,
                    workflow="test_per_call_temperature", roles=roles, train=[role], params={"role": role, "t": t})
    local = {"solver": "p", "verifier": "p"}
    remote = {"solver": "p", "verifier": "q"}
    client = RecordingClient()
    out = runner(tok, engine, client=client).run([task(0, "solver", 0.5, local), task(1, "solver", 1.0, local),
                                                   task(2, "verifier", 0.5, remote)])
    (hot_local,), (same,), (hot_remote,) = out
    assert same.status == "ok"  # repeating the rollout temperature is allowed
    for g in (hot_local, hot_remote):
        assert g.status == "failed", g
        assert "SamplingOverrideError" in g.error and "rollout.temperature 1.0" in g.error, g.error
    assert client.sent == []


def test_an_empty_sample_prompt_means_the_task_prompt_and_a_context_free_trajectory_is_refused(
        tok_engine, job_topics, make_producer, make_consumer):
    """The rule, end to end over the broker: a node writes ``Sample.prompt_ids = []`` only for a
    trajectory whose context is the task's prompt; the trainer's batch restores that prompt,
    and keeps any other context as written. Before: a chain built with no prompt was written
    with ``prompt_ids = []`` too, and trained after the task prompt it never saw."""
    from kafka import TopicPartition

    from astraflow.actors.common import to_train_batch
    from astraflow.topics import Batch
    from astraflow.workflows.api import ENV

    tok, engine = tok_engine
    if "test_contexts" not in WORKFLOWS:
        @workflow("test_contexts", roles=("solver",))
        def contexts(ep: Episode) -> EpisodeResult:
            solver = ep.roles["solver"]
            own = ep.encode("9-9=")
            on_task, on_own = solver.generate([ep.encode(ep.prompt), own])
            if ep.params.get("no_prompt"):
                return EpisodeResult({"solver": [Trajectory.chain((), [(ENV, own), on_own], "solver", 0.0)]})
            return EpisodeResult({"solver": [Trajectory.of(on_task, 0.0),
                                             Trajectory.chain(own, [on_own], "solver", 0.0)]})
    tasks = [Task(f"t{i:07d}-p{i}", f"p{i}", "p", f"{i}+2=", str(i + 2), 1, SAMPLING, workflow="test_contexts",
                  params={"no_prompt": i == 1}) for i in (0, 1)]
    (ok,), (no_prompt,) = runner(tok, engine).run(tasks)
    assert no_prompt.status == "failed" and "prompt_ids is empty" in no_prompt.error, no_prompt
    task_prompt = tok.encode(tasks[0].prompt, add_special_tokens=False)
    assert ok.status == "ok" and ok.prompt_ids == task_prompt
    assert [s.prompt_ids for s in ok.samples] == [[], tok.encode("9-9=", add_special_tokens=False)]

    producer = make_producer()
    producer.send_sync(job_topics.trajectories, ok, key=ok.task_id, partition=0)
    consumer = make_consumer(partitions=[TopicPartition(job_topics.trajectories, 0)])
    got = []
    for _ in range(20):
        got += consumer.poll(500)
        if got:
            break
    (d,) = got
    batch = to_train_batch(Batch("p", 0, [d.message], [d.source]))
    assert [list(s.prompt_ids) for s in batch.samples] == [task_prompt, tok.encode("9-9=", add_special_tokens=False)]
    from astraflow.workflows.api import Turn
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        Trajectory.chain((), [(ENV, [5, 6]), Turn((5, 6), (7,), (-0.1,), 0, "stop", "x", "solver", "p")], "solver", 0.0)
