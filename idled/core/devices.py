"""Session keys and the users they belong to: each user's live keys, oldest first, and the ``max_devices`` cap.

Theory of operation
-------------------
A *session key* is a plain uid (a login without device: the one session a user had before devices) or the
tuple ``(uid, device)``. Uids are str or int, never tuples, so ``type(key) is tuple`` tells the two apart and
``uid_of`` needs no lookup. The presence table (``idled.core.presence``) keeps one record per key, and a
keepalive is one lookup by key; but events are about users, so on a login and on an end -- never on a
keepalive -- the table must know how many live keys the user holds and which is its oldest. `UserKeys` is
that bookkeeping, and it exists only where it is needed:

* ``users`` maps a uid to its live keys in login order, for a user that has at least one device key (then its
  plain key, if it has one, is in the list too);
* a user whose one key is a device key maps to that key itself, not to a list of one (64 bytes less per such
  user);
* a user with only its plain key -- every user of a client that sends no device -- has no entry at all:
  today's users cost exactly what they did. Whether such a user's plain key lives is the table's to say (the
  ``plain`` argument: its key is in the detector or held), so this map never duplicates the table's.

``spare`` counts the keys beyond the first of every listed user, so the table counts online users as its
sessions minus ``spare`` in O(1). Worked by hand: ``alice`` logs in plain, from her phone, from her laptop,
then her plain session and her phone's end::

    login alice            users {}                                                   spare 0  (no entry)
    login (alice, phone)   users {alice: [alice, (alice, phone)]}                     spare 1
    login (alice, laptop)  users {alice: [alice, (alice, phone), (alice, laptop)]}    spare 2
    end alice              users {alice: [(alice, phone), (alice, laptop)]}           spare 1  (2 left)
    end (alice, phone)     users {alice: (alice, laptop)}                             spare 0  (1 left: the key)

The cap: ``admit`` of a new key for a user that already holds ``max_devices`` keys names the user's oldest key
as the one to end (the table ends its session without an event: the user stays online) before recording the
new key as the newest. A login of a key that is already live (newest wins) makes it the newest (``renew``).
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["Uid", "SessionKey", "DEFAULT_MAX_DEVICES", "MAX_DEVICES_LIMIT", "uid_of", "UserKeys"]

Uid = Hashable
# A plain uid or (uid, device); uids are str or int, never tuples, so ``type(key) is tuple`` tells them apart.
SessionKey = Hashable

DEFAULT_MAX_DEVICES = 8
MAX_DEVICES_LIMIT = 1024


def uid_of(key: SessionKey) -> Uid:
    """The user a session key belongs to."""
    return key[0] if type(key) is tuple else key


class UserKeys:
    """uid -> its live session keys, oldest first, for the users that have a device key (see the module doc)."""

    __slots__ = ("users", "spare", "max_devices")

    def __init__(self, max_devices: int = DEFAULT_MAX_DEVICES) -> None:
        if type(max_devices) is not int or not 1 <= max_devices <= MAX_DEVICES_LIMIT:
            raise ValueError(f"max_devices must be an int from 1 to {MAX_DEVICES_LIMIT}, got {max_devices!r}")
        self.max_devices = max_devices
        # A list of keys, or the one device key itself; no entry for a user whose only key is its plain one.
        self.users: dict[Uid, tuple[Uid, str] | list[SessionKey]] = {}
        self.spare = 0  # keys beyond the first of every user in ``users``

    def admit(self, uid: Uid, key: SessionKey, plain: bool) -> tuple[int, SessionKey | None]:
        """``key`` (not live) logs in: record it as the user's newest. Returns (the keys the user held before, the
        oldest key the cap makes room from -- the caller ends its session -- or None). ``plain``: whether the
        user's plain key lives (read only when the user has no entry)."""
        users = self.users
        keys = users.get(uid)
        if keys is None:
            count = int(plain)
        else:
            count = len(keys) if isinstance(keys, list) else 1
        oldest: SessionKey | None = None
        if count >= self.max_devices:
            if keys is None:
                oldest, plain = uid, False  # its plain key alone: no entry to change
            else:
                oldest = keys[0] if isinstance(keys, list) else keys
                self.remove(uid, oldest)
                keys = users.get(uid)
        if keys is None:
            if type(key) is tuple:
                if plain:  # its plain key, older
                    users[uid] = [uid, key]
                    self.spare += 1
                else:
                    users[uid] = key  # one device key (a tuple): the key itself
            # else: a plain key alone, no entry
        elif isinstance(keys, list):
            keys.append(key)
            self.spare += 1
        else:
            users[uid] = [keys, key]
            self.spare += 1
        return count, oldest

    def renew(self, uid: Uid, key: SessionKey) -> None:
        """``key``, already live, logged in again (newest wins): it is the user's newest key now."""
        keys = self.users.get(uid)
        if isinstance(keys, list) and keys[-1] != key:
            keys.remove(key)
            keys.append(key)

    def remove(self, uid: Uid, key: SessionKey) -> int:
        """``key`` no longer lives: the number of keys the user still has."""
        users = self.users
        keys = users.get(uid)
        if keys is None:
            return 0  # a plain key alone
        if not isinstance(keys, list):
            del users[uid]  # its one device key
            return 0
        keys.remove(key)
        self.spare -= 1
        left = len(keys)
        if left == 1:
            only = keys[0]
            if type(only) is tuple:
                users[uid] = only
            else:
                del users[uid]  # back to a plain key alone: no entry
        return left

    def keys(self, uid: Uid, plain: bool) -> tuple[SessionKey, ...]:
        """The user's live keys, oldest first (``plain``: whether its plain key lives, read as in ``admit``)."""
        keys = self.users.get(uid)
        if keys is None:
            return (uid,) if plain else ()
        return tuple(keys) if isinstance(keys, list) else (keys,)

    def devices(self, uid: Uid) -> tuple[str, ...]:
        """The devices of the user's live device keys, oldest first (its plain key is not listed)."""
        keys = self.users.get(uid)
        if keys is None:
            return ()
        if isinstance(keys, list):
            return tuple(key[1] for key in keys if type(key) is tuple)
        return (keys[1],)
