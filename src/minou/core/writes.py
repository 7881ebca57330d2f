"""What one storage transaction must make durable (group commit)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .group import GroupDef
from .log import Msg


@dataclass(eq=False)
class WriteBatch:
    messages: list[Msg] = field(default_factory=list)
    deletes: list[tuple[str, int]] = field(default_factory=list)  # one message each
    truncates: dict[str, int] = field(default_factory=dict)  # channel -> new first seq
    # channel -> next seq to assign; present for new channels and whenever messages are
    # removed (otherwise storage derives it from the highest stored seq)
    channels: dict[str, int] = field(default_factory=dict)
    group_defs: dict[str, GroupDef | None] = field(default_factory=dict)  # None: delete
    group_states: dict[tuple[str, str], tuple[int, bytes] | None] = field(default_factory=dict)
    dedup: list[tuple[str, str, float, int, str]] = field(default_factory=list)
    clients: dict[str, bytes | None] = field(default_factory=dict)  # key registry; None: drop
    reservations: dict[str, str | None] = field(default_factory=dict)  # channel -> owner
    fences: dict[tuple[str, str], int] = field(default_factory=dict)  # (writer, channel) -> batch
    used_tokens: list[tuple[str, float]] = field(default_factory=list)  # jti, expires
    on_commit: list[Callable[[], None]] = field(default_factory=list)
    bytes: int = 0

    def __bool__(self) -> bool:
        return bool(
            self.messages or self.deletes or self.truncates or self.channels or self.group_defs
            or self.group_states or self.dedup or self.clients or self.reservations
            or self.fences or self.used_tokens
            or self.on_commit
        )
