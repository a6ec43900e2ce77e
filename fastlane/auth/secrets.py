"""The secret string of an API token, and the hash that is stored instead of it.

A token reads ``fl_<id>_<secret>``: ``id`` is 12 lowercase letters and digits (public: it finds
the row, and logs and listings show it), ``secret`` is 64 hex digits, 256 random bits from
:mod:`secrets`. The store keeps ``BLAKE2b(secret, key=id)``, 32 bytes.

Why a fast keyed hash and not bcrypt or Argon2: those are slow on purpose, to make guessing a
*human-chosen* password from a stolen hash expensive. A 256-bit random secret cannot be guessed
however fast the hash is, so slowness would buy nothing and would cost every call it checks
(tens of milliseconds each on a small machine). Keyed by the token's id, a hash copied onto
another token's row does not verify there. Comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets as random_source
from typing import NamedTuple

PREFIX = "fl_"
_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
ID_LENGTH = 12
SECRET_BYTES = 32
_TOKEN = re.compile(rf"{PREFIX}([a-z0-9]{{{ID_LENGTH}}})_([0-9a-f]{{{SECRET_BYTES * 2}}})")
MAX_TOKEN_TEXT = 256  # a longer authorization value is refused before any parsing


class TokenSecret(NamedTuple):
    """A token as its holder has it: id and secret."""

    token_id: str
    secret: str

    def __str__(self) -> str:
        return f"{PREFIX}{self.token_id}_{self.secret}"


def new_secret() -> TokenSecret:
    """A fresh token id and secret."""
    token_id = "".join(random_source.choice(_ID_ALPHABET) for _ in range(ID_LENGTH))
    return TokenSecret(token_id, random_source.token_hex(SECRET_BYTES))


def parse(text: str) -> TokenSecret | None:
    """The id and secret of a token string, or None if it is not one (any length)."""
    if len(text) > MAX_TOKEN_TEXT:
        return None
    match = _TOKEN.fullmatch(text.strip())
    return TokenSecret(match[1], match[2]) if match else None


def hash_secret(token: TokenSecret) -> bytes:
    """What the store keeps for ``token``."""
    return hashlib.blake2b(token.secret.encode("ascii"), key=token.token_id.encode("ascii"), digest_size=32).digest()


def verify(token: TokenSecret, stored_hash: bytes) -> bool:
    """Whether ``token`` is the one ``stored_hash`` was made from (constant-time)."""
    return hmac.compare_digest(hash_secret(token), stored_hash)
