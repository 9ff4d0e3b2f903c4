"""bench.timing's whole-call method: each peer in blocks of back-to-back calls, rounds of blocks
alternating between the peers, one sample per peer and round."""

import itertools
import time
import types

from bench import timing


def test_whole_calls_run_in_blocks_of_their_own_in_rounds_that_alternate(monkeypatch):
    """On a clock that only the calls advance: block sizes follow from the calls' own times, not from
    how long a sleep took on a loaded host (times in halves of a second: exact sums)."""
    monkeypatch.setattr(timing, "BLOCK_SECONDS", 10.0)
    clock = [0.0]
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    log = []

    def peer(name: str, seconds: float):
        def call():
            log.append(name)
            clock[0] += seconds
            return name
        return call

    checked = []
    samples = timing.block_seconds({"slow": peer("slow", 2.0), "fast": peer("fast", 0.5),
                                    "other": peer("other", 1.0)}, rounds=6, check=checked.append)
    assert checked == [{"slow": "slow", "fast": "fast", "other": "other"}]
    assert all(len(values) == 6 for values in samples.values())
    assert samples == {"slow": [2.0] * 6, "fast": [0.5] * 6, "other": [1.0] * 6}
    runs = [(name, len(list(run))) for name, run in itertools.groupby(log)]
    assert runs[:3] == [("slow", 1), ("fast", 1), ("other", 1)]  # the warm-up calls
    assert all(length == 2 for _, length in runs[3:6])  # round 0: an untimed and a timed call each
    size = {name: min(length for n, length in runs[6:] if n == name) for name in samples}  # later blocks
    assert size == {"slow": 6, "other": 11, "fast": 21}  # an untimed call and BLOCK_SECONDS of timed ones
    blocks, position, rest = [], 0, log[sum(length for _, length in runs[:6]):]
    while position < len(rest):  # two blocks of one peer may meet where one round ends and the next starts
        name = rest[position]
        assert rest[position:position + size[name]] == [name] * size[name]
        blocks.append(name)
        position += size[name]
    rounds = [blocks[i:i + 3] for i in range(0, len(blocks), 3)]
    assert len(rounds) == 5 and all(sorted(round_) == ["fast", "other", "slow"] for round_ in rounds)
    assert len({tuple(round_) for round_ in rounds}) > 1  # the order alternates


def test_a_budget_leaves_fewer_rounds_but_never_fewer_than_the_minimum():
    samples = timing.block_seconds({"a": lambda: time.sleep(0.01), "b": lambda: time.sleep(0.01)},
                                   rounds=50, budget_seconds=0.0)
    assert [len(values) for values in samples.values()] == [timing.MIN_ROUNDS] * 2
