"""WeightedMixer: proportions (chi-square), live weight changes, pausing, determinism, resume."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.utils.data

from tests.data.support import make_records, write_records
from trainport.data import ChannelDataset, DataError, ReaderSlot, WeightedMixer

# Chi-square critical values at p = 0.001: a correct mixer fails this about once in 1,000
# seeds, and the seeds here are fixed, so the test is deterministic.
CHI2_CRITICAL_P001 = {1: 10.828, 2: 13.816}


def chi_square(counts: Counter[str], weights: dict[str, float]) -> float:
    n = sum(counts.values())
    total = sum(weights.values())
    return sum(
        (counts[name] - n * w / total) ** 2 / (n * w / total) for name, w in weights.items() if w
    )


def labelled(name: str, size: int = 50) -> list[str]:
    return [f"{name}{i}" for i in range(size)]


def sources() -> dict[str, list[str]]:
    return {"a": labelled("a"), "b": labelled("b"), "c": labelled("c")}


def draw(mixer: WeightedMixer, iterator: Iterator[object], n: int) -> list[str]:
    return [str(next(iterator))[0] for _ in range(n)]


def test_proportions_follow_weights() -> None:
    weights = {"a": 5.0, "b": 3.0, "c": 2.0}
    mixer = WeightedMixer(sources(), weights, seed=11)
    counts = Counter(draw(mixer, iter(mixer), 6000))
    assert chi_square(counts, weights) < CHI2_CRITICAL_P001[2]


def test_weight_change_applies_at_the_next_sample() -> None:
    mixer = WeightedMixer(sources(), {"a": 1, "b": 1, "c": 1}, seed=5)
    iterator = iter(mixer)
    before = Counter(draw(mixer, iterator, 900))
    assert min(before.values()) > 200
    mixer.set_weights({"a": 0, "b": 3})  # c keeps 1
    after = Counter(draw(mixer, iterator, 4000))
    assert after["a"] == 0
    assert chi_square(after, {"b": 3, "c": 1}) < CHI2_CRITICAL_P001[1]
    mixer.set_weights({"a": 1, "b": 0, "c": 0})
    assert draw(mixer, iterator, 50) == ["a"] * 50


class Untouchable:
    def __iter__(self) -> Iterator[str]:
        raise AssertionError("a paused source must not be opened")


def test_weight_zero_pauses_and_never_opens_a_source() -> None:
    mixer = WeightedMixer({"a": labelled("a"), "x": Untouchable()}, {"x": 0}, seed=1)
    assert set(draw(mixer, iter(mixer), 300)) == {"a"}


def test_all_weights_zero_is_an_error() -> None:
    mixer = WeightedMixer(sources(), {"a": 0, "b": 0, "c": 0})
    with pytest.raises(DataError, match="every mixing weight is 0"):
        next(iter(mixer))
    with pytest.raises(DataError, match="no source named"):
        mixer.set_weights({"zzz": 1})
    with pytest.raises(DataError, match=">= 0"):
        mixer.set_weights({"a": -1})


def test_deterministic_for_a_seed() -> None:
    def run(seed: int) -> list[object]:
        mixer = WeightedMixer(sources(), {"a": 2}, seed=seed)
        iterator = iter(mixer)
        return [next(iterator) for _ in range(500)]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_drop_mode_ends_when_every_source_is_used_up() -> None:
    mixer = WeightedMixer(
        {"a": labelled("a", 30), "b": labelled("b", 70)}, seed=2, on_exhausted="drop"
    )
    got = list(mixer)
    assert sorted(got) == sorted(labelled("a", 30) + labelled("b", 70))


def test_restart_runs_a_source_through_its_next_epoch(tmp_path: Path) -> None:
    write_records(tmp_path / "a" / "x.tfrecord", make_records("a", 3))
    source = ChannelDataset.from_uri(tmp_path / "a", slot=ReaderSlot())
    mixer = WeightedMixer({"a": source}, seed=0)
    iterator = iter(mixer)
    assert [next(iterator) for _ in range(7)] == (make_records("a", 3) * 3)[:7]
    assert source.epoch == 2


def test_resume_gives_identical_next_samples(tmp_path: Path) -> None:
    for name, count in (("cars", 40), ("pink", 7), ("bikes", 25)):
        write_records(tmp_path / name / "part.tfrecord", make_records(name, count))

    def build() -> WeightedMixer:
        channels = {
            name: ChannelDataset.from_uri(tmp_path / name, shuffle_seed=9, slot=ReaderSlot())
            for name in ("cars", "pink", "bikes")
        }
        return WeightedMixer(channels, {"cars": 5, "pink": 1, "bikes": 2}, seed=42)

    mixer = build()
    iterator = iter(mixer)
    [next(iterator) for _ in range(60)]
    mixer.set_weights({"pink": 4})  # boosted mid-training, then checkpointed
    [next(iterator) for _ in range(25)]
    state = json.loads(json.dumps(mixer.state_dict()))
    expected = [next(iterator) for _ in range(150)]

    restarted = build()
    restarted.load_state_dict(state)
    assert restarted.weights["pink"] == 4
    resumed = iter(restarted)
    assert [next(resumed) for _ in range(150)] == expected


def test_weight_change_reaches_dataloader_workers() -> None:
    mixer = WeightedMixer({"a": labelled("a"), "b": labelled("b")}, seed=8)
    loader = torch.utils.data.DataLoader(mixer, batch_size=None, num_workers=1, prefetch_factor=2)
    iterator = iter(loader)
    first = Counter(str(next(iterator))[0] for _ in range(200))
    assert first["a"] > 50
    mixer.set_weights({"a": 0})
    for _ in range(10):  # already prefetched under the old weights
        next(iterator)
    assert {str(next(iterator))[0] for _ in range(300)} == {"b"}
    del iterator
