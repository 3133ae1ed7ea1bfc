"""JobQueue and PartitionQueue: priority order, FIFO, unique keys, oldest pipeline first."""

import pytest

from cuzk_engine.engine.queues import JobQueue, PartitionQueue, priority_rank
from cuzk_engine.vocabulary import PRIORITY_RANK


def drain(q):
    out = []
    while (x := q.pop()) is not None:
        out.append(x)
    return out


def test_jobs_start_critical_then_high_then_normal_then_low_fifo_within_each():
    q = JobQueue()
    order = [("n1", "normal"), ("l1", "low"), ("c1", "critical"), ("h1", "high"),
             ("n2", "normal"), ("c2", "critical"), ("l2", "low"), ("h2", "high")]
    for job, prio in order:
        q.push(job, prio)
    assert drain(q) == ["c1", "c2", "h1", "h2", "n1", "n2", "l1", "l2"]
    assert len(q) == 0


def test_queue_position_counts_the_jobs_that_start_first():
    q = JobQueue()
    assert q.push("a", "normal") == 0
    assert q.push("b", "low") == 1
    assert q.push("c", "critical") == 0
    assert q.push("d", "normal") == 2
    assert [q.position(j) for j in "abcd"] == [1, 3, 0, 2]


def test_a_queued_job_id_cannot_be_pushed_twice_and_nothing_is_overwritten():
    q = JobQueue()
    q.push("same", "normal")
    with pytest.raises(ValueError, match="already queued"):
        q.push("same", "critical")
    assert drain(q) == ["same"]
    # once it left the queue the id may come back (a retried request)
    q.push("same", "low")
    assert drain(q) == ["same"]


def test_unknown_priority_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="critical, high, normal, low"):
        JobQueue().push("a", "urgent")
    assert [priority_rank(p) for p in PRIORITY_RANK] == [0, 1, 2, 3]


def test_a_removed_job_is_never_popped_and_the_rest_keep_their_order():
    q = JobQueue()
    for i in range(4):
        q.push(f"j{i}", "normal")
    assert q.remove("j2") and not q.remove("j2")
    assert q.pop() == "j0"
    assert "j2" not in q and "j1" in q and q.ids() == ["j1", "j3"]
    assert drain(q) == ["j1", "j3"] and len(q) == 0


def test_a_removed_job_at_the_head_gives_way_to_the_next_in_priority_order():
    q = JobQueue()
    q.push("c", "critical")
    q.push("n", "normal")
    q.push("l", "low")
    assert q.remove("c")
    assert q.position("n") == 0 and q.position("l") == 1
    assert drain(q) == ["n", "l"]


def test_partitions_equal_keys_never_overwrite():
    # cuzk keyed ready work by (job_seq, partition): every monolithic job used (0, 0) and
    # replaced the one before it
    q = PartitionQueue()
    for name in ("first", "second", "third"):
        q.push(name, job_id=name, rank=2, job_seq=0, partition=0)
    assert len(q) == 3
    assert drain(q) == ["first", "second", "third"]


def test_lowest_partition_of_the_oldest_pipeline_first_within_a_priority():
    q = PartitionQueue()
    # partitions become ready out of order, from two pipelines
    for seq, part in [(1, 3), (2, 0), (1, 1), (2, 1), (1, 0), (1, 2)]:
        q.push((seq, part), job_id=f"job{seq}", rank=2, job_seq=seq, partition=part)
    assert drain(q) == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1)]


def test_a_higher_priority_pipeline_overtakes_older_ones():
    q = PartitionQueue()
    q.push("old-normal", job_id="a", rank=PRIORITY_RANK["normal"], job_seq=1, partition=0)
    q.push("new-critical", job_id="b", rank=PRIORITY_RANK["critical"], job_seq=9, partition=5)
    q.push("old-low", job_id="c", rank=PRIORITY_RANK["low"], job_seq=0, partition=0)
    assert drain(q) == ["new-critical", "old-normal", "old-low"]


def test_remove_job_takes_out_only_that_jobs_partitions():
    q = PartitionQueue()
    for part in range(3):
        q.push(("a", part), job_id="a", rank=2, job_seq=1, partition=part)
        q.push(("b", part), job_id="b", rank=2, job_seq=2, partition=part)
    assert q.pop() == ("a", 0)
    assert sorted(q.remove_job("a")) == [("a", 1), ("a", 2)]
    assert q.remove_job("a") == []
    assert len(q) == 3
    assert drain(q) == [("b", 0), ("b", 1), ("b", 2)]
    assert len(q) == 0
