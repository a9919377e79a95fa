"""FilterSolved, curriculum, mixing and the anti-stall rule on crafted reward streams."""

from __future__ import annotations

import pytest

from astraflow.actors.prompt_source import interleave
from astraflow.algorithms.curriculum import Curriculum, CurriculumError, CurriculumParams
from astraflow.algorithms.filter_solved import FilterSolved, FilterSolvedParams

from .helpers import CTX, group, outcome, pipeline, prompt


def test_filter_solved_skips_at_the_ewma_threshold():
    f = FilterSolved(FilterSolvedParams(), CTX)
    p = prompt("p")
    for _ in range(28):  # s = 1 - 0.9 ** 28 = 0.948 < 0.95
        f.update(outcome("p", [1, 1, 1, 1]))
    assert f.success["p"] == pytest.approx(1 - 0.9 ** 28)
    assert f.should_schedule(p, 0)
    f.update(outcome("p", [1, 1, 1, 1]))  # 1 - 0.9 ** 29 = 0.953
    assert not f.should_schedule(p, 0)
    f.update(outcome("p", [1, 0, 0, 0]))  # 0.9 * 0.953 + 0.1 * 0.25: below again
    assert f.success["p"] == pytest.approx(0.9 * (1 - 0.9 ** 29) + 0.025)
    assert f.should_schedule(p, 0)
    assert f.should_schedule(prompt("other"), 0)


def test_filter_solved_counts_partial_success_by_positive_rewards():
    f = FilterSolved(FilterSolvedParams(threshold=0.5, alpha=1.0), CTX)
    f.update(outcome("p", [0.2, 0, 0, 0.1]))  # mean(r > 0) = 0.5
    assert not f.should_schedule(prompt("p"), 0)


def _curriculum(**kw) -> Curriculum:
    return Curriculum(CurriculumParams(**{"levels": (1.0, 2.0, 3.0), "threshold": 0.6, "alpha": 0.5,
                                          "min_groups": 4, **kw}), CTX)


def test_curriculum_widens_when_the_frontier_accuracy_passes_the_threshold():
    c = _curriculum()
    one, two, three, four = prompt("a", "3+4="), prompt("b", "12+3="), prompt("c", "123+4="), prompt("d", "1234+5=")
    assert [c.should_schedule(p, 0) for p in (one, two, three, four)] == [True, False, False, False]
    for _ in range(3):
        c.update(outcome("a", [1, 1, 1, 0], difficulty=1.0))
    assert c.level == 0  # EWMA 0.75 >= 0.6 but only 3 of the 4 groups needed
    c.update(outcome("a", [1, 1, 1, 0], difficulty=1.0))
    assert c.level == 1 and c.accuracy is None
    assert [c.should_schedule(p, 0) for p in (one, two, three, four)] == [True, True, False, False]
    for _ in range(8):  # below the frontier band: does not count for level 1
        c.update(outcome("a", [1, 1, 1, 1], difficulty=1.0))
    assert (c.level, c.count) == (1, 0)
    for _ in range(4):  # frontier groups at 50 %: EWMA below 0.6
        c.update(outcome("b", [1, 1, 0, 0], difficulty=2.0))
    assert c.level == 1
    for _ in range(3):
        c.update(outcome("b", [1, 1, 1, 1], difficulty=2.0))
    assert c.level == 2  # the last level admits everything, harder than every bound included
    assert all(c.should_schedule(p, 0) for p in (one, two, three, four))


def test_curriculum_on_a_dataset_column():
    c = _curriculum(key="difficulty", levels=(0.3, 0.7))
    assert c.should_schedule(prompt("a", source="f.jsonl", difficulty=0.2), 0)
    assert not c.should_schedule(prompt("b", source="f.jsonl", difficulty=0.5), 0)
    with pytest.raises(CurriculumError, match="prompt c .* 'difficulty'"):
        c.should_schedule(prompt("c", source="f.jsonl"), 0)


def test_mixing_holds_each_source_to_its_weight_and_reports_per_source():
    p = pipeline({"name": "mixing", "sources": {"a.jsonl": 7, "b.jsonl": 3}})
    assert p.sources() == {"a.jsonl": 7, "b.jsonl": 3}
    chosen = []
    for i in range(200):  # a stream that offers both sources alike
        pr = prompt(f"x{i}", source="ab"[i % 2] + ".jsonl")
        if p.decide(pr, 0).schedule:
            p.scheduled(f"t{i}", pr, 0)
            chosen.append(pr.source)
            assert abs(chosen.count("a.jsonl") - 0.7 * len(chosen)) <= 1
    assert len(chosen) > 100
    assert not p.decide(prompt("z", source="c.jsonl"), 0).schedule  # not a configured source
    p.settled(group("t0", [1, 0, 0, 0], prompt_id="x0"))  # a.jsonl, mean 0.25
    p.settled(group("t1", [1, 1, 1, 1], prompt_id="x1"))  # b.jsonl, mean 1.0
    stats = p.stats()
    assert stats["mixing.a.jsonl.reward_mean"] == 0.25 and stats["mixing.b.jsonl.reward_mean"] == 1.0
    assert stats["mixing.a.jsonl.share"] == pytest.approx(0.7, abs=0.01)


def test_interleave_spreads_sources_by_weight():
    a = [prompt(f"a{i}", source="a") for i in range(70)]
    b = [prompt(f"b{i}", source="b") for i in range(10)]
    out = interleave({"a": a, "b": b}, {"a": 0.7, "b": 0.3})
    assert sorted(x.prompt_id for x in out) == sorted(x.prompt_id for x in a + b)
    head = [x.source for x in out[:30]]
    assert head.count("b") == 9  # 30 % of the first 30, while b lasts
    assert [x.prompt_id for x in out if x.source == "a"] == [x.prompt_id for x in a]  # each source keeps its order


def test_a_curator_that_rejects_everything_cannot_stall_the_schedule():
    p = pipeline({"name": "curriculum", "levels": [1, 2]}, force_after_skips=5)
    decisions = [p.decide(prompt(f"p{i}", "12+34="), 0) for i in range(20)]  # all two-digit: level 0 rejects
    assert [i for i, d in enumerate(decisions) if d.schedule] == [5, 11, 17]
    assert all(d.forced and d.by == "curriculum" for d in decisions if d.schedule)
    assert p.forced == 3 and p.skipped == {"curriculum": 17}
    assert p.stats()["forced"] == 3.0
    # an accepted prompt resets the count of consecutive rejections
    p2 = pipeline({"name": "curriculum", "levels": [1, 2]}, force_after_skips=5)
    texts = ["12+34="] * 4 + ["1+2="] + ["12+34="] * 5
    assert not any(p2.decide(prompt(f"p{i}", t), 0).forced for i, t in enumerate(texts))


def test_curators_learn_from_a_settled_group_once_with_the_tags_of_its_task():
    p = pipeline({"name": "curriculum", "levels": [1, 2], "min_groups": 1, "threshold": 0.5}, "greso")
    pr = prompt("p0", "3+4=")
    assert p.decide(pr, 0).schedule
    p.scheduled("t0", pr, 0)
    assert p.inflight == {"t0": {"difficulty": 1.0}}
    p.settled(group("t0", [1, 1, 1, 1], prompt_id="p0"))
    assert p.inflight == {}
    greso = p.curators[1]
    assert greso.streaks == {"p0": (1, "easy")} and p.curators[0].level == 1
    p.settled(group("t9", [], prompt_id="p9"))  # a failed group teaches nothing
    assert greso.streaks == {"p0": (1, "easy")}


def test_curriculum_reads_a_difficulty_column_of_a_dataset_file(tmp_path):
    from astraflow.workflows.datasets import load_prompts
    path = tmp_path / "graded.jsonl"
    path.write_text('{"prompt": "easy?", "answer": "1", "level": 1}\n{"prompt": "hard?", "answer": "2", "level": 3}\n')
    easy, hard = load_prompts(str(path), None)
    c = _curriculum(key="level", levels=(1.0, 2.0, 3.0))
    assert (c.should_schedule(easy, 0), c.should_schedule(hard, 0)) == (True, False)
