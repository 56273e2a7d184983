"""`falkirk run`'s input files: every line is sent, and a line the job will dead-letter is
named by file and line before anything runs, never a traceback."""

from __future__ import annotations

import json

from falkirk.local.run import input_records


def test_each_malformed_line_is_named_by_file_and_line_and_sent_for_the_dead_letters(tmp_path):
    path = tmp_path / "readings.jsonl"
    lines = [
        {"device": "d1", "ts": 1000, "key": 7},
        {"device": "d2", "ts": None},  # the user's crash: int(None)
        {"device": "d3"},
        '{"device": "d4", "ts":',
        {"device": "d5", "ts": -5},
        {"device": "d6", "ts": "2000"},
        {"device": "d7", "ts": 2000.5},
        [1, 2],
        {"device": "d8", "ts": 3000.0},
    ]
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
                    + "\n\n")
    heard: list[str] = []
    records = input_records(path, origin_ms=0, note=heard.append)
    assert [ts for _, ts, _ in records] == [1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000,
                                            3000]
    assert [key for _, _, key in records] == ["7"] + [None] * 8
    assert [v.decode() for v, _, _ in records][3] == '{"device": "d4", "ts":'
    tail = "sent at the previous line's time; the job dead-letters it"
    assert heard == [
        f"{path}:2: ts is null, not a whole number of epoch ms ≥ 0: {tail}",
        f"{path}:3: no ts: {tail}",
        f"{path}:4: not JSON (Expecting value): {tail}",
        f"{path}:5: ts is -5, not a whole number of epoch ms ≥ 0: {tail}",
        f'{path}:6: ts is "2000", not a whole number of epoch ms ≥ 0: {tail}',
        f"{path}:7: ts is 2000.5, not a whole number of epoch ms ≥ 0: {tail}",
        f"{path}:8: not a JSON object (a list): {tail}",
    ]


def test_a_first_line_without_a_time_is_sent_at_the_origin(tmp_path):
    path = tmp_path / "clicks.jsonl"
    path.write_text('{"user": "u1"}\n')
    assert input_records(path, origin_ms=1704067200000) == [(b'{"user": "u1"}', 1704067200000,
                                                             None)]
