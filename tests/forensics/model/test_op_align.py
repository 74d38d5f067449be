

def test_the_calls_in_an_untraced_gap_follow_the_jobs_rhythm():
    # steps of 4 collectives back to back every 150 ms; the gap hides 3 whole steps
    known = [s * 150 * MS + i * 100_000 for s in range(10) for i in range(4)]
    assert op_align.calls_between(known, 14 * 150 * MS) == 12
    # calls at an even pace of 10 ms: 9 between the last (at 90 ms) and the one at 190 ms
    assert op_align.calls_between([k * 10 * MS for k in range(10)], 190 * MS) == 9
    assert op_align.calls_between([5], 10) == 0
