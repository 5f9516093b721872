"""The worker pipe's messages (``serving/wire/pipe.py``): typed at both ends, plain tagged tuples in between."""

from __future__ import annotations

import pickle

import pytest

from recserve.serving.wire import pipe


@pytest.mark.parametrize("message, raw", [
    (pipe.Ready(42, []), ("ready", 42, [])),
    (pipe.Stats([("done", 8, 0.01, 0.002, 0.005, 1)]), ("stats", [("done", 8, 0.01, 0.002, 0.005, 1)])),
    (pipe.Beat(0.25), ("beat", 0.25)),
    (pipe.Conn(7), ("conn", 7)),
    (pipe.Gone(7), ("gone", 7)),
    (pipe.Handoff(b"GET", "m", 3, 9), ("handoff", b"GET", "m", 3, 9)),
    (pipe.Adopt(b""), ("adopt", b"")),
    (pipe.Config({"sub_batch": 4}, 3), ("config", {"sub_batch": 4}, 3)),
    (pipe.Applied(3), ("applied", 3)),
    (pipe.Drain(), ("drain",)),
])
def test_a_message_crosses_the_pipe_as_the_tuple_it_always_was(message, raw):
    encoded = pipe.encode(message)
    assert type(encoded) is tuple and encoded == raw
    assert pickle.dumps(encoded) == pickle.dumps(raw)  # no class reference on the pipe
    decoded = pipe.decode(pickle.loads(pickle.dumps(encoded)))
    assert type(decoded) is type(message) and decoded == message


def test_optional_fields_and_untagged_items():
    assert pipe.decode(("beat",)) == pipe.Beat(0.0)  # a beat without the age of a pass in flight
    assert pipe.decode(("handoff", b"", "m", None)).to_slot is None
    assert pipe.decode(("handoff", b"", "m", None)).fd == -1  # the supervisor holds no copy of it
    assert pipe.decode(("config", {"sub_batch": 4})).seq == 0  # a change nobody waits for
    assert pipe.tagged(("gone", 3)) and not pipe.tagged((17, True, [1.0], 0.001))  # a stage worker's reply
    with pytest.raises(KeyError):
        pipe.decode(("unknown", 1))


def test_waiting_says_whether_a_message_or_the_end_is_on_the_pipe_as_poll_does():
    import multiprocessing

    ours, theirs = multiprocessing.Pipe()
    waiting = pipe.waiting(ours)
    assert not waiting() and not ours.poll()
    theirs.send(pipe.encode(pipe.Beat(0.0)))
    theirs.send(None)
    assert waiting() and ours.poll()
    assert pipe.decode(ours.recv()) == pipe.Beat(0.0)
    assert waiting() and ours.recv() is None  # a message read whole leaves the next one readable
    assert not waiting()
    theirs.close()
    assert waiting() and ours.poll()  # the end, which recv raises as EOFError
    with pytest.raises(EOFError):
        ours.recv()
