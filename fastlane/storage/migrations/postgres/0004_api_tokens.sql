-- fastlane schema, version 4: API tokens, so that every call can be authenticated.

-- One row per token. Only a hash of the secret is kept (BLAKE2b keyed by the token id, see
-- fastlane/auth/secrets.py): a copy of the database hands out no usable token. created_at and
-- revoked_at come from the database clock, last_used_at from the nodes that accepted the token
-- (the latest one wins), expires_at from whoever made it.
CREATE TABLE api_tokens (
    token_id     text PRIMARY KEY,
    tenant       text NOT NULL,
    role         text NOT NULL,
    name         text NOT NULL,
    secret_hash  bytea NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz,
    revoked_at   timestamptz,
    last_used_at timestamptz
);
-- list_tokens of one tenant (LIST_TOKENS), in its order: creation time, then id.
CREATE INDEX api_tokens_by_tenant ON api_tokens (tenant, created_at, token_id);
