"""DeleteRecords (21)."""

from __future__ import annotations

from typing import Any

HANDLERS: dict[int, tuple[Any, int, int]] = {}
