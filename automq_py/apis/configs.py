"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44)."""

from __future__ import annotations

from typing import Any

HANDLERS: dict[int, tuple[Any, int, int]] = {}
