"""Each oracle rule passes a page that tells the truth and catches a deliberate lie, so the
oracle on the real stack can fail. No browser, no engine: DOM extracts and engine states as
the oracle records them."""

from __future__ import annotations

import copy

from .rules import (
    PUSH_LATENCY,
    EngineState,
    History,
    behind,
    check_response,
    judge,
    parse_size,
)

JOB = "1f0c7a52-0000-4000-8000-000000000001"
T = 1000.0  # the read ends here


def partition(index: int, state: str) -> dict:
    return {"index": index, "state": state}


def snapshot(states: list[str], *, status="running", phase="running", workers=None,
             counters=None, used=3 << 30) -> dict:
    return {
        "pipelines": [{"job_id": JOB, "status": status, "phase": phase,
                       "partitions": [partition(i, s) for i, s in enumerate(states)]}],
        "gpu_workers": workers if workers is not None else [
            {"worker_id": 0, "state": "proving", "current_job": JOB, "current_partition": 1,
             "busy_secs": 2.0, "busy_total_secs": 9.0},
            {"worker_id": 1, "state": "idle", "current_job": None, "current_partition": None,
             "busy_secs": None, "busy_total_secs": 4.0}],
        "synthesis": {"active": sum(s == "synthesizing" for s in states), "max_concurrent": 2},
        "counters": counters or {"total_completed": 3, "total_failed": 0, "total_cancelled": 1,
                                 "queue_depth": 0},
        "memory": {"used_bytes": used, "total_bytes": 16 << 30},
    }


RUNNING = ["done", "gpu", "synth_done", "synthesizing"]


def host_view(cells=RUNNING, label="running", **changes) -> dict:
    view = {
        "kind": "host", "page": "host panel", "stale": False, "read_at": T,
        "pipelines": [{"job": JOB, "phase": label,
                       "cells": [{"index": i, "phase": s} for i, s in enumerate(cells)]}],
        "workers": [{"worker": 0, "state": "proving", "job": JOB[:16], "partition": 1,
                     "busy_s": 2.5, "busy_total_s": 9.5},
                    {"worker": 1, "state": "idle", "job": None, "partition": None,
                     "busy_s": None, "busy_total_s": 4.0}],
        "figures": {"synthesis_active": 1, "done": 3, "failed": 0, "cancelled": 1,
                    "not_started": 0, "memory_used": "3.0 GiB"},
    }
    view.update(changes)
    return view


def states(*snapshots, records=None) -> list[EngineState]:
    """Snapshots taken over the window, the last half a second before the read ends."""
    n = len(snapshots)
    return [EngineState(T - 0.5 - (n - 1 - i) * 0.4, s, records or {})
            for i, s in enumerate(snapshots)]


def rules_broken(view, engine) -> list[str]:
    return sorted({v.rule for v in judge(view, engine).violations})


def test_a_truthful_host_panel_passes_every_rule():
    verdict = judge(host_view(), states(snapshot(RUNNING)))
    assert verdict.violations == [] and verdict.checked > 10


def test_a_partition_shown_in_a_phase_it_was_not_in_is_caught():
    lie = host_view(cells=["done", "finalizing", "synth_done", "synthesizing"])
    assert rules_broken(lie, states(snapshot(RUNNING))) == ["partition_phase"]


def test_a_value_within_the_push_latency_passes_and_an_older_one_does_not():
    view = host_view(cells=["done", "gpu", "synthesizing", "synthesizing"],
                     figures={"synthesis_active": 2})
    old = snapshot(["done", "gpu", "synthesizing", "synthesizing"])
    new = snapshot(RUNNING)

    def window(*timed):
        history = History()
        for at, snap in timed:
            history.add(EngineState(at, snap))
        return history.window(T - 0.05, T)

    assert rules_broken(view, window((T - PUSH_LATENCY + 0.5, old), (T - 0.2, new))) == []
    assert rules_broken(view, window((T - PUSH_LATENCY - 3, old), (T - PUSH_LATENCY - 0.1, new),
                                     (T - 0.2, new))) == ["figures", "partition_phase"]


def test_a_slow_answer_counts_for_every_moment_it_may_have_been_taken():
    """A poll that started before the read and answered long after it may hold a state from
    before the read: the window has it, and the read waits for a poll started after it."""
    history = History()
    history.add(EngineState(T - 0.3, {"seq": 1}, {}, T - 1.5, T + 0.9))
    assert [s.snapshot for s in history.window(T - 0.1, T)] == [{"seq": 1}]
    assert history.latest() < T  # not yet a state from after the read
    history.add(EngineState(T + 1.0, {"seq": 2}, {}, T + 0.95, T + 1.05))
    assert history.latest() > T
    # ... and that next poll counts too: the page may have had its state pushed before it.
    assert [s.snapshot for s in history.window(T - 0.1, T)] == [{"seq": 1}, {"seq": 2}]


def test_the_history_keeps_the_state_in_force_when_the_window_opens():
    history = History()
    for at in (T - 10, T - 5, T - 1, T + 0.1):
        history.add(EngineState(at, {"at": at}))
    assert [s.at for s in history.window(T - 0.5, T)] == [T - 5, T - 1, T + 0.1]


def test_a_settled_job_shown_in_flight_is_caught():
    cancelled = snapshot(["done", "cancelled", "cancelled", "cancelled"], status="cancelled",
                         phase="cancelled", workers=[])
    lie = host_view(label="cancelled", workers=[])
    assert "settled_job_in_flight" in rules_broken(lie, states(cancelled))
    # Gone from the list: the record's final status settles it.
    record = {JOB: {"status": "cancelled", "partitions": 4}}
    proof = {"kind": "proof", "page": "proof page", "job": JOB, "phase": "cancelled",
             "read_at": T, "cells": [{"index": 1, "phase": "gpu"}]}
    gone = copy.deepcopy(cancelled)
    gone["pipelines"] = []
    assert rules_broken(proof, states(gone, records=record)) == ["settled_job_in_flight"]
    proof["cells"] = [{"index": 1, "phase": "cancelled"}]
    assert rules_broken(proof, states(gone, records=record)) == []
    # The engine restarted and forgot the job: its ended page may show how it ended, but a
    # page that shows it running may not show partitions the engine does not have.
    forgot = copy.deepcopy(gone)
    assert rules_broken({**proof, "status": "cancelled"}, states(forgot)) == []
    assert rules_broken({**proof, "status": "running", "phase": "queued"},
                        states(forgot)) == ["partition_phase"]
    # With the partitions' final states in the record, only the true one passes.
    record[JOB]["partition_states"] = [partition(0, "done"), partition(1, "done")]
    assert rules_broken(proof, states(gone, records=record)) == ["partition_phase"]


def test_cancelling_is_not_cancelled_yet():
    cancelling = snapshot(["done", "gpu", "cancelled", "cancelled"], status="cancelled",
                          phase="cancelling")
    view = host_view(cells=["done", "gpu", "cancelled", "cancelled"], label="cancelling",
                     figures={})
    assert rules_broken(view, states(cancelling)) == []
    view["pipelines"][0]["phase"] = "cancelled"
    assert rules_broken(view, states(cancelling)) == ["job_phase"]


def test_waiting_for_a_device_while_parameters_are_generated_is_caught():
    generating = snapshot(["pending"] * 4, phase="generating_parameters", workers=[])
    view = host_view(cells=["pending"] * 4, label="waiting", workers=[], figures={})
    assert rules_broken(view, states(generating)) == ["job_phase"]
    view["pipelines"][0]["phase"] = "generating_parameters"
    assert rules_broken(view, states(generating)) == []


def test_waiting_for_a_device_needs_a_synthesized_partition_and_none_on_a_device():
    synthesizing = snapshot(["synthesizing", "pending"], workers=[])
    view = host_view(cells=["synthesizing", "pending"], label="waiting", workers=[], figures={})
    assert rules_broken(view, states(synthesizing)) == ["job_phase"]
    ready = snapshot(["synth_done", "synthesizing"], workers=[])
    view["pipelines"][0]["cells"] = [{"index": 0, "phase": "synth_done"},
                                     {"index": 1, "phase": "synthesizing"}]
    assert rules_broken(view, states(ready)) == []


def test_a_worker_shown_proving_what_it_was_not_is_caught():
    lie = host_view()
    lie["workers"][1] = {"worker": 1, "state": "proving", "job": JOB[:16], "partition": 2,
                         "busy_s": 0.4, "busy_total_s": 4.0}
    assert rules_broken(lie, states(snapshot(RUNNING))) == ["worker_state"]


def test_a_busy_clock_frozen_between_pushes_is_caught():
    # Snapshot 0.5 s before the read: busy 2.0 s then, 2.5 s at the read; 9.0 / 9.5 in all.
    late = host_view()
    late["workers"][0].update(busy_s=2.5 - 1.5, busy_total_s=9.5 - 1.5)  # within the latency
    assert rules_broken(late, states(snapshot(RUNNING))) == []
    frozen = host_view()
    frozen["workers"][0].update(busy_s=2.5 - 2.5, busy_total_s=9.5 - 3.4)  # the 3.4 s
    assert rules_broken(frozen, states(snapshot(RUNNING))) == ["worker_clock"]
    ahead = host_view()
    ahead["workers"][0]["busy_s"] = 2.5 + 1.0
    assert rules_broken(ahead, states(snapshot(RUNNING))) == ["worker_clock"]
    # An idle worker's total does not tick.
    ticking_idle = host_view()
    ticking_idle["workers"][1]["busy_total_s"] = 6.0
    assert rules_broken(ticking_idle, states(snapshot(RUNNING))) == ["worker_clock"]


def test_counters_queue_synthesis_and_memory_are_held_to_the_engine():
    for name, lie in (("done", 4), ("not_started", 2), ("synthesis_active", 0),
                      ("cancelled", 0), ("memory_used", "3.0 GB")):
        view = host_view()
        view["figures"][name] = lie
        assert rules_broken(view, states(snapshot(RUNNING))) == ["figures"], name


def test_binary_values_in_decimal_units_are_caught():
    # The example: 23,128,576,000 B shown as "21.5 GB".
    assert parse_size("21.5 GB used") == (21.5e9, 0.05e9 + 1)
    view = host_view(figures={"memory_used": "21.5 GB"})
    assert rules_broken(view, states(snapshot(RUNNING, used=23_128_576_000))) == ["figures"]
    view["figures"]["memory_used"] = "21.5 GiB"
    assert rules_broken(view, states(snapshot(RUNNING, used=23_128_576_000))) == []


def test_the_fleet_row_is_held_to_the_engine():
    row = {"kind": "fleet", "page": "fleet row", "stale": False, "read_at": T,
           "figures": {"busy_workers": 1, "idle_workers": 1, "waiting_jobs": 0,
                       "parts_ready": 1}}
    assert rules_broken(row, states(snapshot(RUNNING))) == []
    waiting = snapshot(["synth_done", "synthesizing"])
    row["figures"].update(waiting_jobs=0, parts_ready=1)
    assert rules_broken(row, states(waiting)) == ["figures"]  # a job waits for a device


def test_data_shown_as_live_while_the_engine_does_not_answer_is_caught():
    down = [EngineState(T - 3, None), EngineState(T - 1, None), EngineState(T - 0.1, None)]
    assert rules_broken(host_view(), down) == ["stale_label"]
    assert rules_broken(host_view(stale=True), down) == []
    proof = {"kind": "proof", "page": "proof page", "job": JOB, "phase": "running",
             "status": "running", "read_at": T, "cells": []}
    assert rules_broken(proof, down) == ["stale_label"]
    proof.update(status="done", phase="done")  # an ended proof's page is its result
    assert rules_broken(proof, down) == []


def test_a_clock_running_on_data_that_is_not_live_is_caught():
    down = [EngineState(T - 3, None), EngineState(T - 1, None), EngineState(T - 0.1, None)]
    frozen = host_view(stale=True, clocks={"running": 0, "unlabelled": 0})
    assert rules_broken(frozen, down) == []
    assert rules_broken(host_view(stale=True, clocks={"running": 2, "unlabelled": 0}),
                        down) == ["frozen_clock"]
    assert rules_broken(host_view(stale=True, clocks={"running": 0, "unlabelled": 1}),
                        down) == ["frozen_clock"]
    assert rules_broken(host_view(clocks={"running": 2, "unlabelled": 0}),
                        states(snapshot(RUNNING))) == []  # live: clocks run


def test_a_5xx_or_a_traceback_is_caught():
    assert rules_broken(host_view(traceback=True), states(snapshot(RUNNING))) == ["http"]
    assert check_response("/x", 500, "") is not None
    assert check_response("/x", 200, "Traceback (most recent call last):\n ...") is not None
    assert check_response("/x", 404, "<p>Not found</p>") is None


def test_what_the_engine_passed_through_between_two_polls_is_allowed_and_nothing_else():
    before = snapshot(["pending", "synth_done", "gpu"], workers=[])
    after = snapshot(["synth_done", "gpu", "done"], workers=[])
    for cells, broken in ((["synthesizing", "gpu", "finalizing"], []),
                          (["gpu", "synth_done", "gpu"], ["partition_phase"]),
                          (["pending", "pending", "gpu"], ["partition_phase"])):
        view = host_view(cells=cells, workers=[], figures={})
        assert rules_broken(view, states(before, after)) == broken, cells
    fleet = {"kind": "fleet", "page": "fleet row", "stale": False, "read_at": T,
             "figures": {"parts_ready": 3}}
    few, many = snapshot(["synth_done"] * 1, workers=[]), snapshot(["synth_done"] * 5, workers=[])
    assert rules_broken(fleet, states(few, many)) == []
    fleet["figures"]["parts_ready"] = 6
    assert rules_broken(fleet, states(few, many)) == ["figures"]


def test_running_while_the_engine_generates_parameters_is_caught():
    generating = snapshot(["pending"] * 2, phase="generating_parameters", workers=[])
    view = host_view(cells=["pending"] * 2, label="running", workers=[], figures={})
    assert rules_broken(view, states(generating)) == ["job_phase"]
    # Loading between two polls that saw generating, then running: passed through.
    running = snapshot(["synthesizing"] * 2, workers=[])
    view = host_view(cells=["pending"] * 2, label="loading_parameters", workers=[], figures={})
    assert rules_broken(view, states(generating, running)) == []


def test_how_far_behind_the_engine_a_host_panel_is():
    def at(when, seq):
        return EngineState(when, {"seq": seq})

    view = {"seq": 5, "read_at": T}
    assert behind(view, [at(T - 2, 5), at(T - 0.5, 5)]) == 0.0
    assert behind(view, [at(T - 2, 5), at(T - 1.5, 6), at(T - 0.5, 7)]) == 1.5
    assert behind({"seq": None, "read_at": T}, [at(T - 1, 5)]) is None


def test_a_fleet_row_is_held_to_the_very_snapshot_it_names():
    idle = snapshot([], workers=[])
    one_ready, none_ready = dict(idle, seq=7), dict(idle, seq=9)
    one_ready["pipelines"] = snapshot(["synth_done"], workers=[])["pipelines"]
    row = {"kind": "fleet", "page": "fleet row", "stale": False, "read_at": T, "seq": 9,
           "figures": {"parts_ready": 1}}
    # seq 9 was polled with nothing ready: the row's 1 is a lie, though seq 7 had one ready
    assert rules_broken(row, states(one_ready, none_ready)) == ["figures"]
    # seq 8 came and went between the two polls: the controller's stream saw it, the poller
    # did not, so nothing polled can judge the row
    row["seq"] = 8
    assert rules_broken(row, states(one_ready, none_ready)) == []
    # a row older than the window is judged against the window, and fails
    row.update(seq=3, figures={"parts_ready": 4})
    assert rules_broken(row, states(one_ready, none_ready)) == ["figures"]


def test_a_snapshot_only_the_stream_carried_judges_the_view_that_names_it():
    idle = snapshot([], workers=[])
    one_ready, none_ready = dict(idle, seq=7), dict(idle, seq=9)
    one_ready["pipelines"] = snapshot(["synth_done"], workers=[])["pipelines"]
    two_ready = dict(idle, seq=8)
    two_ready["pipelines"] = snapshot(["synth_done", "synth_done"], workers=[])["pipelines"]
    history = History()
    for state in states(one_ready, none_ready):
        history.add(state)
    history.add_streamed(T - 0.7, two_ready)  # seq 8 lasted less than a poll
    row = {"kind": "fleet", "page": "fleet row", "stale": False, "read_at": T, "seq": 8,
           "figures": {"parts_ready": 2}}
    assert rules_broken(row, history.window(T - 0.2, T, seq=8)) == []
    row["figures"] = {"parts_ready": 1}  # seq 8 had two ready, not one
    assert rules_broken(row, history.window(T - 0.2, T, seq=8)) == ["figures"]
    # superseded by seq 9 before the window opened: not a state the read could have seen
    history.add_streamed(T - 0.6, none_ready)
    assert history.named(8, T - 0.1 + PUSH_LATENCY, T) is None
    # a restarted engine counts from the start again: the old engine's seq 8 is forgotten
    history.add_streamed(T - 0.1, dict(idle, seq=1))
    assert history.named(8, T - 0.2, T) is None


def test_a_job_done_just_before_an_engine_restart_may_stay_done():
    """The engine said done, then a kill -9 restarted it before its record was fetched: a page
    may show it done (the engine's last word) or queued again (its result lost), not running."""
    done = dict(snapshot(["done"] * 4, status="done", phase="done", workers=[]), seq=4)
    restarted = dict(snapshot([], workers=[]), seq=1, pipelines=[])
    history = History()
    history.add(EngineState(T - 1.0, done))
    history.add(EngineState(T - 0.5, restarted))
    window = [s for s in history.window(T - 0.2, T) if s.snapshot is restarted]
    page = {"kind": "proof", "page": "proof page", "job": JOB, "read_at": T,
            "status": "done", "phase": "done", "cells": []}
    assert rules_broken(page, window) == []
    assert rules_broken({**page, "status": "queued", "phase": "queued"}, window) == []
    assert rules_broken({**page, "status": "running", "phase": "running"}, window) == ["job_phase"]
    # without the engine's last word, done is not a state the restarted engine can vouch for
    assert rules_broken(page, states(restarted)) == ["job_phase"]
