"""value_class: frozen to the type checker, a plain slotted dataclass at run time, hashed and
compared by its fields as a frozen one is."""

from __future__ import annotations

import dataclasses
import pickle
import textwrap
from pathlib import Path

from mypy import api as mypy_api

from protocol.values import value_class


@value_class
class Point:
    x: int
    y: int = 0


@dataclasses.dataclass(slots=True, frozen=True)
class FrozenPoint:
    x: int
    y: int = 0


def test_compares_hashes_and_copies_as_a_frozen_dataclass() -> None:
    p = Point(1, 2)
    assert p == Point(1, 2) and p != Point(1, 3)
    assert hash(p) == hash(Point(1, 2)) == hash(FrozenPoint(1, 2))
    assert {p, Point(1, 2)} == {p}
    assert dataclasses.replace(p, y=5) == Point(1, 5)
    assert pickle.loads(pickle.dumps(p)) == p
    assert not hasattr(p, "__dict__")  # slotted
    assert repr(p) == "Point(x=1, y=2)"


def test_the_type_checker_refuses_assigning_a_field(tmp_path: Path) -> None:
    source = tmp_path / "assign.py"
    source.write_text(
        textwrap.dedent(
            """
            from protocol.values import value_class

            @value_class
            class Point:
                x: int

            p = Point(1)
            p.x = 2
            """
        )
    )
    out, _, status = mypy_api.run(
        ["--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(source)]
    )
    assert status == 1, out
    assert 'Property "x" defined in "Point" is read-only' in out, out
