"""The weights of a move, worked out before anything moves (console.gateway.failover.weightplan):
a drain spreads a replica's weight over the others in proportion, a fail-back gives every
replica its weight back, a restore goes back to the weights before a job, and the steps
between keep every share on its way."""

from __future__ import annotations

import pytest

from console.gateway.failover import weightplan
from console.gateway.failover.weightplan import FailoverRefused, Move, Past

REPLICAS = {"trt-a1": 100, "vllm-a2": 100, "trt-b1": 50, "standby": 0}
UP = ["trt-a1", "vllm-a2", "trt-b1", "standby"]


def test_draining_a_replica_spreads_its_weight_over_the_others_in_proportion():
    move = weightplan.drain("llama", REPLICAS, "trt-a1", None, UP)
    assert move.after == {"trt-a1": 0, "vllm-a2": 167, "trt-b1": 83, "standby": 0}
    assert sum(move.after.values()) == sum(REPLICAS.values())  # nothing lost to rounding
    assert move.targets == ["vllm-a2", "trt-b1"] and move.sources == ["trt-a1"]
    assert move.drained == ["trt-a1"]
    assert "spread over vllm-a2, trt-b1 in proportion" in move.summary


def test_a_drain_skips_replicas_that_are_down_and_can_go_onto_a_standby():
    move = weightplan.drain("llama", REPLICAS, "trt-a1", None, ["vllm-a2", "standby"])
    assert move.after == {"trt-a1": 0, "vllm-a2": 200, "trt-b1": 50, "standby": 0}
    onto = weightplan.drain("llama", REPLICAS, "trt-a1", "standby", UP)
    assert onto.after == {"trt-a1": 0, "vllm-a2": 100, "trt-b1": 50, "standby": 100}
    assert onto.targets == ["standby"] and onto.drained == ["trt-a1"]


@pytest.mark.parametrize(
    ("deployment", "onto", "up", "status", "words"),
    [
        ("standby", None, UP, 409, "standby has weight 0 already"),
        ("trt-a1", "trt-a1", UP, 409, "cannot take its own traffic"),
        ("trt-a1", None, ["trt-a1"], 409, "no other deployment of llama has weight and is up"),
    ],
)
def test_a_drain_with_nothing_to_do_or_nowhere_to_go_is_refused(
    deployment, onto, up, status, words
):
    with pytest.raises(FailoverRefused) as refused:
        weightplan.drain("llama", REPLICAS, deployment, onto, up)
    assert refused.value.status == status and words in str(refused.value)


def test_a_fail_back_gives_every_replica_its_weight_back():
    to_standby = weightplan.all_to("llama", REPLICAS, "standby")
    assert to_standby.after == {"trt-a1": 0, "vllm-a2": 0, "trt-b1": 0, "standby": 100}
    history = [Past("j1", "succeeded", REPLICAS, to_standby.after)]
    back = weightplan.fail_back("llama", to_standby.after, "trt-a1", history)
    assert back is not None and back.after == REPLICAS  # not 100 on trt-a1, 0 elsewhere
    assert "fail-back to trt-a1: the weights from before job j1" in back.summary
    assert set(back.targets) == {"trt-a1", "vllm-a2", "trt-b1"}


def test_no_fail_back_once_the_weights_changed_or_the_move_did_not_take_the_target_off():
    after = {"trt-a1": 0, "vllm-a2": 0, "trt-b1": 0, "standby": 100}
    history = [Past("j1", "succeeded", REPLICAS, after)]
    changed = {**after, "trt-b1": 10}
    assert weightplan.fail_back("llama", changed, "trt-a1", history) is None
    assert weightplan.fail_back("llama", after, "standby", history) is None  # it gained
    failed_last = [Past("j2", "failed", after, after), *history]
    assert weightplan.fail_back("llama", after, "trt-a1", failed_last) is not None


def test_restore_before_a_job_and_a_restore_with_nothing_to_do():
    now = {"trt-a1": 0, "vllm-a2": 167, "trt-b1": 83, "standby": 0, "new": 20}
    move = weightplan.restore("llama", now, Past("j1", "succeeded", REPLICAS, None))
    assert move.after == {**REPLICAS, "new": 20}
    assert "new not in it: kept" in move.summary
    with pytest.raises(FailoverRefused) as refused:
        weightplan.restore("llama", REPLICAS, Past("j1", "succeeded", REPLICAS, None))
    assert refused.value.status == 409


def test_each_step_moves_every_share_that_part_of_the_way():
    move = Move("failover", {"a": 100, "b": 0}, {"a": 0, "b": 100}, "all to b")
    assert [weightplan.step(move, p) for p in (10, 50, 100)] == [
        {"a": 90, "b": 10},
        {"a": 50, "b": 50},
        {"a": 0, "b": 100},
    ]
    drain = weightplan.drain("m", {"a": 100, "b": 100, "c": 100}, "a", None, ["b", "c"])
    ten = weightplan.step(drain, 10)
    assert ten == {"a": 90, "b": 105, "c": 105}  # a's share 1/3 -> 0.3, on the scale of 300
    assert weightplan.step(drain, 100) == {"a": 0, "b": 150, "c": 150}


def test_weights_are_scaled_to_fit_haproxys_256():
    drain = weightplan.drain("m", {"a": 250, "b": 250}, "a", None, ["b"])
    assert drain.after == {"a": 0, "b": 500}
    assert weightplan.step(drain, 100, max_weight=256) == {"a": 0, "b": 256}
    assert weightplan.step(drain, 10, max_weight=256) == {"a": 209, "b": 256}  # 225/275
    assert weightplan.fit({"a": 1, "b": 1000}, 256) == {"a": 1, "b": 256}  # stays above 0
