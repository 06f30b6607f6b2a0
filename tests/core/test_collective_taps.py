"""The tap on torch.distributed as a unit: counted listeners, events in order, errors told,
the functions given back (``multigpu.runtime.collective_taps``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from multigpu.runtime.collective_taps import Tap


class Heard:
    def __init__(self, tag: str, said: list[Any]) -> None:
        self.tag, self.said = tag, said

    def begin(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        self.said.append((self.tag, "begin", name, args, kwargs))
        return f"{self.tag}-{name}"

    def end(self, token: str, error: BaseException | None) -> None:
        self.said.append((self.tag, "end", token, type(error).__name__ if error else None))


def _fail() -> None:
    raise RuntimeError("gloo timed out")


def test_listeners_hear_begin_then_end_in_nested_order_and_the_error() -> None:
    space = SimpleNamespace(send=lambda x, tag=0: x, fail=_fail)
    send, tap, said = space.send, Tap([(space, "send"), (space, "fail")]), []
    hang, clock = Heard("hang", said), Heard("clock", said)
    tap.listen(hang)
    tap.listen(clock)
    assert space.send(1, tag=2) == 1
    assert said == [
        ("hang", "begin", "send", (1,), {"tag": 2}),
        ("clock", "begin", "send", (1,), {"tag": 2}),
        ("clock", "end", "clock-send", None),  # the last to begin ends first
        ("hang", "end", "hang-send", None),
    ]
    said.clear()
    with pytest.raises(RuntimeError, match="gloo"):
        space.fail()
    assert [s[-1] for s in said if s[1] == "end"] == ["RuntimeError", "RuntimeError"]
    tap.unlisten(clock)
    tap.unlisten(hang)
    assert space.send is send and tap.listeners() == ()


def test_a_listener_listening_twice_stays_until_its_second_unlisten() -> None:
    space = SimpleNamespace(barrier=lambda: None)
    barrier, tap, said = space.barrier, Tap([(space, "barrier")]), []
    outer = Heard("outer", said)
    tap.unlisten(outer)  # never listened: nothing to end
    tap.listen(outer)
    tap.listen(outer)  # a Context inside another
    tap.unlisten(outer)
    space.barrier()
    assert len(said) == 2 and tap.listeners() == (outer,)
    tap.unlisten(outer)
    assert space.barrier is barrier
    space.barrier()
    assert len(said) == 2


def test_a_function_replaced_again_by_someone_else_is_left_as_it_is() -> None:
    space = SimpleNamespace(all_reduce=lambda: "torch")
    tap, heard = Tap([(space, "all_reduce")]), Heard("h", [])
    tap.listen(heard)
    space.all_reduce = theirs = lambda: "theirs"
    tap.unlisten(heard)
    assert space.all_reduce is theirs
