"""Read rights: the rules a client's key carries, then the reservations of exclusive
(!) channels. Every read checks here (``check_read``), and so does a group before it
takes a member, since a group hands every member messages of all its patterns."""

from __future__ import annotations

from ..errors import BadRequest, NotAuthorized
from ..names import (
    dead_letter_channel,
    inbox_of,
    inbox_owner,
    is_inbox,
    listen_group_key,
    reservation_key,
)
from .group import Group
from .session import Session
from .state import BrokerState


class Rights:
    def __init__(self, state: BrokerState) -> None:
        self.state = state

    def check_read(self, session: Session, *patterns: str, claim: bool = True) -> None:
        """The one check every read makes: listen, consume, add_id, range reads, OFFSETS,
        POSITION, HTTP consume, ``/v1/stream``, receipts, dead letters.

        The rules first, then the reservations: an exclusive (!) channel and its dead
        letters belong to the first client that reads either. With ``claim`` this read
        reserves the exclusive channels it names that are still free (after checking
        every pattern, so a refused read claims nothing). Admins are not restricted
        and reserve nothing. Raises NotAuthorized (or InvalidChannel).
        """
        for pattern in patterns:
            refusal = self.read_refusal(session, pattern)
            if refusal is not None:
                # Kept for "why is nothing flowing?": a consumer the rules keep out.
                refusals = self.state.read_refusals
                times = refusals[pattern][0] if pattern in refusals else 0
                refusals[pattern] = [times + 1, session.client_id]
                raise refusal
        if claim and not session.admin:
            for pattern in patterns:
                key = reservation_key(pattern)
                if key not in self.state.reservations and self._exclusive(key):
                    self.state.reservations[key] = session.client_id
                    self.state.batch.reservations[key] = session.client_id

    def reserve(self, session: Session, channel: str) -> None:
        """Reserve ``channel`` for ``session``'s client as a "!" rule would, whatever the
        rules say (an exclusive subscription: a peer channel's role); checked already.
        Admins reserve nothing."""
        key = reservation_key(channel)
        if not session.admin and key not in self.state.reservations:
            self.state.reservations[key] = session.client_id
            self.state.batch.reservations[key] = session.client_id

    def may_read(self, session: Session, pattern: str) -> bool:
        """``check_read``'s answer, without raising, recording or claiming."""
        return self.read_refusal(session, pattern) is None

    def _exclusive(self, key: str) -> bool:
        return "*" not in key and self.state.rules.is_exclusive(key)

    def read_refusal(self, session: Session, pattern: str,
                     owner_to_be: str | None = None) -> NotAuthorized | None:
        """Why ``session`` may not read ``pattern``, or None. ``owner_to_be`` counts a
        free exclusive channel as reserved by that client (about to claim it)."""
        if is_inbox(pattern):  # admins too: an inbox is its owner's alone
            return inbox_refusal(session.client_id, pattern)
        if session.admin:
            return None
        try:
            session.access.check_read(pattern)
        except NotAuthorized as exc:
            return exc
        owner = self.owner(pattern, owner_to_be)
        if owner is None or owner == session.client_id:
            return None
        key = reservation_key(pattern)
        what = repr(pattern) if key == pattern else f"{pattern!r} (the dead letters of {key!r})"
        return NotAuthorized(f"channel {what} is reserved by client {owner!r}",
                             channel=pattern, owner=owner)

    def owner(self, channel: str, owner_to_be: str | None = None) -> str | None:
        """The client that reserved ``channel`` (or the channel whose dead letters it
        is); ``owner_to_be`` if it is exclusive and still free, else None."""
        key = reservation_key(channel)
        owner = self.state.reservations.get(key)
        if owner is None and owner_to_be is not None and self._exclusive(key):
            return owner_to_be
        return owner

    def check_group_rights(self, session: Session, grp: Group, patterns: list[str],
                           *, joining: bool = True) -> None:
        """A group hands its members messages of every pattern it reads, so a member
        must be allowed all of them: the joiner the group's patterns (also a durable
        listener's, which rules or reservations may have changed under), and the members
        the joiner's new ones (a group name is no way around the rules). A member adding
        a pattern was checked when it joined (a reload re-checks live members)."""
        if grp.kind == "listen":
            name = grp.key[len(listen_group_key(session.client_id, "")):]
            what, instead = f"listener {name!r}", "listen under another name"
        else:
            name = grp.key.removeprefix("consume:")
            what, instead = f"group {name!r}", "consume under a group of your own"
        have = grp.texts
        for text in have if joining else ():
            try:
                self.check_read(session, text, claim=False)
            except NotAuthorized as exc:
                raise NotAuthorized(
                    f"{what} also reads {text!r}, which client {session.client_id!r} "
                    f"may not ({exc.message}); {instead}",
                    group=name, pattern=text) from None
        new = [text for text in dict.fromkeys(patterns) if text not in have]
        # Rights are a client's: one member of each will do, and the joiner's own client
        # may read what it asks for (its checks came first). Admin members are asked too:
        # they may read anything but another client's inbox, which the group would hand
        # them.
        checked = set() if session.admin else {session.client_id}
        for member in grp.members:
            if member.session.client_id in checked:
                continue
            checked.add(member.session.client_id)
            for text in new:
                # Reserved for the joiner once it reads: another client may not share it.
                if self.read_refusal(
                        member.session, text, owner_to_be=session.client_id) is not None:
                    raise NotAuthorized(
                        f"group {name!r} has a member, client {member.session.client_id!r}, "
                        f"that may not read {text!r}; consume it under another group",
                        group=name, pattern=text)

    def release(self, channel: str) -> str | None:
        """Admin: free a reserved channel for the next reader to claim. Refused while a
        client still reads it (or its dead letters) live: it would go on reading beside
        the next owner."""
        logs = [log for name in (channel, dead_letter_channel(channel))
                if (log := self.state.channels.get(name)) is not None]
        readers = sorted({sub.session.client_id for log in logs for gc in log.states
                          for sub in gc.group.members if not sub.session.admin})
        if readers and channel in self.state.reservations:
            raise BadRequest(
                f"channel {channel!r} is still read by client {readers[0]!r} (a live "
                "subscription): end it, or revoke the client, then release the channel",
                channel=channel, client=readers[0])
        owner = self.state.reservations.pop(channel, None)
        if owner is not None:
            self.state.batch.reservations[channel] = None
        return owner


def inbox_refusal(client_id: str, pattern: str) -> NotAuthorized | None:
    """Inboxes are read by their owner alone, by name (their dead letters too): no
    pattern reads them, whatever the rules or the admin list say."""
    if inbox_owner(pattern) == client_id:
        return None
    return NotAuthorized(f"{pattern!r} reads inboxes: client {client_id!r} may read only "
                         f"its own, by name ({inbox_of(client_id)}!<instance>)",
                         channel=pattern)
