"""The chaos checker's own logic, on made-up histories: it must flag a live old lease and must not
flag the outbox's repeat of a verdict that was written while its lease was current, it must judge
a request held on the way by when it reached the server, it must let a fault of a worker's disk
cost a lease only as that worker's own hand-back, and a clock jump cost none."""

from checker import Fault, Report, acknowledged_results_lost, live_lease_violations, lost_lease_violations
from support.faultproxy import Exchange

TOKEN_1, TOKEN_3 = "00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000003"
# Submission 36: gen 1 to home-1 at t=10, gen 3 to home-2 at t=20 (after a rejudge).
GRANTS = {36: [(1, "home-1", 10.0, TOKEN_1), (3, "home-2", 20.0, TOKEN_3)]}
TOKEN_GEN = {TOKEN_1: (36, 1), TOKEN_3: (36, 3)}


def exchange(path: str, sent_at: float, token: str = TOKEN_1) -> Exchange:
    return Exchange(worker_id="home-1", method="POST", path=path, body={"lease_token": token}, sent_at=sent_at,
                    status=200)


def violations(history, decided_at_gen_1: float | None) -> list[str]:
    judgings = {36: [(1, "AC", 1, TOKEN_1, "worker", decided_at_gen_1)]} if decided_at_gen_1 is not None else {}
    report = Report()
    live_lease_violations(report, history, GRANTS, TOKEN_GEN, judgings)
    return report.violations


def test_a_heartbeat_of_an_old_generation_honoured_after_a_newer_grant_is_two_live_leases():
    assert violations([exchange("/v1/leases/36/heartbeat", 25.0)], decided_at_gen_1=None) == [
        "two live leases: submission 36: gen 1 honoured on /v1/leases/36/heartbeat after gen 3 went to home-2"]


def test_a_result_written_after_the_newer_grant_is_two_live_leases():
    assert len(violations([exchange("/v1/leases/36/result", 25.0)], decided_at_gen_1=25.0)) == 1


def test_the_outbox_repeating_a_verdict_written_before_the_newer_grant_is_no_live_lease():
    # Written at t=15 (gen 1 current), the reply dropped; the outbox repeats it at t=25 and gets the same answer.
    assert violations([exchange("/v1/leases/36/result", 25.0)], decided_at_gen_1=15.0) == []
    # A heartbeat is never a repeat.
    assert len(violations([exchange("/v1/leases/36/heartbeat", 25.0)], decided_at_gen_1=15.0)) == 1


def test_a_request_held_on_the_way_counts_from_when_it_reached_the_server():
    # Sent at t=15 while gen 1 was current, held by the network until t=25, after gen 3 was granted,
    # and honoured there: two live leases, although it started before the newer grant.
    held = exchange("/v1/leases/36/heartbeat", 15.0)
    held.forwarded_at = 25.0
    assert len(violations([held], decided_at_gen_1=None)) == 1
    # The same request let through at t=16 was honoured while gen 1 was current.
    held.forwarded_at = 16.0
    assert violations([held], decided_at_gen_1=None) == []


# Submission 40: gen 1 to home-1 at t=10, superseded by gen 2 to home-2 at t=30 without a verdict of gen 1.
LOST = {40: [(1, "home-1", 10.0, TOKEN_1), (2, "home-2", 30.0, TOKEN_3)]}
LOST_TOKENS = {TOKEN_1: (40, 1), TOKEN_3: (40, 2)}
ROWS = {40: ("AC", 2)}
JUDGINGS = {40: [(1, "AC", 2, TOKEN_3, "worker", 35.0)]}
FULL_DISK = Fault("disk_full", "home-1", 12.0, 15.0, "outbox")


def lost(faults, history) -> tuple[list[str], int]:
    report = Report()
    _, handed_back = lost_lease_violations(report, LOST, JUDGINGS, ROWS, faults, history, LOST_TOKENS)
    return report.violations, handed_back


def test_a_lease_handed_back_for_a_full_disk_is_accounted_for():
    release = Exchange(worker_id="home-1", method="POST", path="/v1/leases/40/release",
                       body={"lease_token": TOKEN_1, "reason": "outbox: [Errno 28]"}, sent_at=14.0, status=200)
    assert lost([FULL_DISK], [release]) == ([], 1)


def test_a_hand_back_the_arbiter_could_not_take_is_accounted_for():
    # The worker's disk filled while the database failed over: its release got 503 and the lease ran
    # out by itself. The worker did what it could (seen in chaos run 7 of 2026-12-07).
    refused = Exchange(worker_id="home-1", method="POST", path="/v1/leases/40/release",
                       body={"lease_token": TOKEN_1, "reason": "outbox: [Errno 28]"}, sent_at=14.0, status=503)
    assert lost([FULL_DISK], [refused]) == ([], 0)


def test_a_lease_that_expired_during_a_full_disk_is_a_violation():
    # No hand-back: the worker let the lease run out although it knew it could not keep the result.
    violations, handed_back = lost([FULL_DISK], [])
    assert handed_back == 0 and violations == [
        "lease lost to a disk fault: submission 40 gen 1 held by home-1 from 10.000 was lost while home-1's disk "
        "failed, without its hand-back"]


def test_a_worker_side_fault_still_accounts_for_a_lost_lease():
    assert lost([Fault("kill_worker", "home-1", 12.0, 12.5)], []) == ([], 0)


def test_a_lost_or_stalled_reply_accounts_for_a_lost_lease_only_on_an_acquire():
    # A heartbeat or result reached the arbiter at once (the lease was extended, the verdict written):
    # only its reply was late or gone, which the worker must not take for a lost lease.
    for kind in ("stall_reply", "drop_reply"):
        for path in ("/heartbeat", "/result"):
            violations, _ = lost([Fault(kind, "home-1", 12.0, 14.0, f"{path} 2.0s")], [])
            assert violations == ["unaccounted reclaim: submission 40 gen 1 held by home-1 from 10.000 was "
                                  "reclaimed with no fault on home-1's side"], (kind, path)
        # An acquire's grant that came too late (or never): its unconfirmed lease ran out.
        assert lost([Fault(kind, "home-1", 12.0, 14.0, "/v1/acquire 2.0s")], []) == ([], 0)


def test_a_lease_lost_while_the_holders_clock_jumped_is_a_violation():
    # Only the database's clock may decide a lease: an hour's jump of the holder's (or the arbiter's)
    # wall clock accounts for nothing.
    jumps = [Fault("clock_jump", "home-1", 12.0, 18.0, "+3600s for 5.0s"),
             Fault("clock_jump", "a1", 20.0, 25.0, "-3600s for 4.0s")]
    assert lost(jumps, []) == (["unaccounted reclaim: submission 40 gen 1 held by home-1 from 10.000 was reclaimed "
                                "with no fault on home-1's side"], 0)


def test_a_result_answered_200_that_the_database_lost_is_a_violation():
    # A failover onto a standby that did not have the commit: the worker cleared its outbox entry,
    # the database has no verdict of that lease.
    answered = Exchange(worker_id="home-1", method="POST", path="/v1/leases/36/result",
                        body={"lease_token": TOKEN_1, "verdict": "AC"}, sent_at=14.0, status=200, replied_at=14.1)
    report = Report()
    acknowledged_results_lost(report, [answered], {})
    assert report.violations == ["acknowledged result lost: /v1/leases/36/result by home-1 was answered 200 at "
                                 "14.100; the database has no verdict of that lease"]
    kept = Report()
    acknowledged_results_lost(kept, [answered], {36: [(1, "AC", 1, TOKEN_1, "worker", 14.05)]})
    assert kept.violations == []


def log_violations_of(tmp_path, text: str, secrets=(TOKEN_1,)) -> list[str]:
    from checker import log_violations

    (tmp_path / "worker-home-1").mkdir(exist_ok=True)
    log = tmp_path / "worker-home-1" / "worker.log"
    log.write_text(text)
    report = Report()
    assert log_violations(report, [log], list(secrets)) == len(text.splitlines())
    return report.violations


def test_the_log_checker_passes_structured_lines_and_gunicorns_start_up(tmp_path):
    text = ('{"level": "info", "event": "lease granted", "submission_id": 36}\n'
            "[2026-12-07 09:13:41 +0000] [11467] [INFO] Starting gunicorn 27.0.1\n")
    assert log_violations_of(tmp_path, text) == []


def test_the_log_checker_flags_a_traceback_a_token_in_either_spelling_and_an_unstructured_line(tmp_path):
    secret = "Zq3_x-" * 7  # a credential's secret: urlsafe, 42 characters
    text = ('{"event": "judge error", "exc": "Traceback (most recent call last):"}\n'
            f'{{"event": "heartbeat", "lease_token": "{TOKEN_1}"}}\n'
            f'{{"path": "/outbox/.0017-36-{TOKEN_1.replace("-", "")}.json.tmp"}}\n'
            f'{{"header": "Bearer home-1.{secret}"}}\n'
            "[2026-12-07 09:13:41 +0000] [11467] [ERROR] Worker (pid:11468) was sent SIGKILL!\n")
    assert log_violations_of(tmp_path, text, secrets=(TOKEN_1, secret)) == [
        'traceback in a log: worker-home-1/worker.log:1: {"event": "judge error", '
        '"exc": "Traceback (most recent call last):"}',
        "secret in a log: worker-home-1/worker.log:2: a lease token or a credential",
        "secret in a log: worker-home-1/worker.log:3: a lease token or a credential",
        "secret in a log: worker-home-1/worker.log:4: a lease token or a credential",
        "unstructured log line: worker-home-1/worker.log:5: [2026-12-07 09:13:41 +0000] [11467] [ERROR] Worker "
        "(pid:11468) was sent SIGKILL!"]
