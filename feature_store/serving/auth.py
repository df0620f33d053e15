"""Optional API keys: read keys for lookups and the registry, admin keys for everything.

No keys configured means no auth. Otherwise every API call carries
``Authorization: Bearer <key>`` (over gRPC, the ``authorization`` metadata entry):
no or an unknown key is 401, a read key on a write or a cache bypass is 403.
Liveness, readiness and /metrics stay open, as probes and scrapers expect.
"""

from __future__ import annotations

import hmac
from enum import IntEnum

from feature_store.errors import RequestError


class Role(IntEnum):
    NONE = 0
    READ = 1
    ADMIN = 2  # writes, cache bypass, and reads


class AuthError(RequestError):
    """Missing or unknown credentials (401), or a key without the needed role (403)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


MISSING_KEY = "missing or unknown API key: send 'Authorization: Bearer <key>'"
READ_ONLY_KEY = "this API key may only read; writes and cache bypass need an admin key"
AUTH_MESSAGES = {401: MISSING_KEY, 403: READ_ONLY_KEY}


class Authenticator:
    def __init__(self, read_keys: tuple[str, ...], admin_keys: tuple[str, ...]) -> None:
        self.enabled = bool(read_keys or admin_keys)
        self._keys = [(k.encode(), Role.ADMIN) for k in admin_keys] + [
            (k.encode(), Role.READ) for k in read_keys if k not in admin_keys
        ]
        self._known: dict[str, Role] = {}  # header -> role, so a known key costs one lookup

    @property
    def keys(self) -> list[tuple[bytes, Role]]:
        """Every key with its role (an admin key listed once, as admin)."""
        return list(self._keys)

    def native(self) -> tuple[list[tuple[bytes, int]], int]:
        """The keys as the native fronts check them (``native/src/front/auth.rs``): each
        with its role's value, and the role everyone has without keys."""
        return [(key, int(role)) for key, role in self._keys], int(Role.ADMIN)

    def role(self, authorization: str | None) -> Role:
        """The role an Authorization header grants; ADMIN for everyone when auth is off."""
        if not self.enabled:
            return Role.ADMIN
        if not authorization:
            return Role.NONE
        known = self._known.get(authorization)
        if known is not None:
            return known
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return Role.NONE
        candidate = token.strip().encode()
        role = Role.NONE
        for key, key_role in self._keys:
            # compare with every key in constant time, so timing reveals nothing
            if hmac.compare_digest(key, candidate) and key_role > role:
                role = key_role
        if role is not Role.NONE and len(self._known) < 1024:
            self._known[authorization] = role
        return role

    def require(self, authorization: str | None, needed: Role) -> Role:
        role = self.role(authorization)
        if role is Role.NONE:
            raise AuthError(MISSING_KEY, 401)
        if role < needed:
            raise AuthError(READ_ONLY_KEY, 403)
        return role
